"""Actors: long-lived tasks that own their state and are reached by address.

An actor is an ``ActorSpec`` whose ``run`` coroutine receives its ``Mailbox``. Callers
hold an ``Address`` (found in the ``Registry`` by name) and either ``call`` (request /
reply, with a timeout) or ``cast`` (fire and forget). The mailbox is a bounded trio
memory channel that outlives restarts of its actor, so addresses stay valid while the
supervisor restarts a crashed actor.

Messages are frozen dataclasses, one class per kind of message, and an actor dispatches
on their type (``match message: case Charge(): ...``), never on tags or strings. A message
that expects an answer subclasses ``Request[R]``, which types what ``Address.call`` returns.
The actor signature is the same everywhere::

    async def run(mailbox: Mailbox, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        ... set up ...
        task_status.started()
        await serve_mailbox(mailbox, handle)
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Generic, Literal, Protocol, TypeVar

import trio

from runtime.errors import Unavailable

RestartType = Literal["permanent", "transient", "temporary"]
R = TypeVar("R")


class Request(Generic[R]):
    """Base of a message that is answered: ``R`` is the type of the reply.

    Subclass it with a frozen dataclass (``class Charge(Request[Charged])``); then
    ``await address.call(Charge(...))`` is typed as ``Charged``.
    """

    __slots__ = ()


class ActorRun(Protocol):
    """The coroutine function of an actor."""

    def __call__(self, mailbox: Mailbox, *, task_status: trio.TaskStatus[Any] = ...
                 ) -> Awaitable[None]: ...


@dataclass(frozen=True)
class ActorSpec:
    """How to run and supervise one actor (an OTP child spec).

    :param name: the registry address; unique across the service.
    :param run: the actor coroutine function.
    :param restart: ``permanent`` restarts always, ``transient`` only after a crash,
        ``temporary`` never.
    :param shutdown_timeout: seconds the actor gets to finish once cancelled.
    :param mailbox_size: capacity of the bounded mailbox.
    """

    name: str
    run: ActorRun
    restart: RestartType = "permanent"
    shutdown_timeout: float = 5.0
    mailbox_size: int = 64


@dataclass(frozen=True)
class PartSpec:
    """A part of the service under a supervisor of its own (an OTP supervisor child spec):
    each plugin's actors are one, and a plugin may nest more (one per chain).

    The part's supervisor restarts a crashed child alone, with backoff, within
    ``supervisor.part_max_restarts``; past that, the part goes down as a whole, is listed as
    failed in ``/readyz`` and ``flowsvc_part_failed``, and starts again after a long backoff,
    while the rest of the service serves.

    :param name: unique among the parts of one supervisor; shown in ``/readyz``, metrics
        and logs.
    :param children: actor specs and nested parts, started in order and stopped in reverse.
    """

    name: str
    children: tuple[ActorSpec | PartSpec, ...]


class _Reply:
    """A one-shot reply slot shared by a caller and the actor handling its request."""

    def __init__(self) -> None:
        self._done = trio.Event()
        self._value: Any = None
        self._error: BaseException | None = None

    def set(self, value: Any) -> None:
        if not self._done.is_set():
            self._value = value
            self._done.set()

    def fail(self, error: BaseException) -> None:
        if not self._done.is_set():
            self._error = error
            self._done.set()

    async def wait(self) -> Any:
        await self._done.wait()
        if self._error is not None:
            raise self._error
        return self._value


class Envelope:
    """One message in a mailbox, with the caller's reply slot when it was a ``call``."""

    def __init__(self, message: Any, reply_slot: _Reply | None) -> None:
        self.message = message
        self._reply_slot = reply_slot

    def reply(self, value: Any = None) -> None:
        """Answer a ``call``; a no-op for a ``cast``."""
        if self._reply_slot is not None:
            self._reply_slot.set(value)

    def fail(self, error: BaseException) -> None:
        """Answer a ``call`` by raising ``error`` in the caller."""
        if self._reply_slot is not None:
            self._reply_slot.fail(error)


class Mailbox:
    """The receiving side of an actor's address; iterate it to get envelopes.

    It remembers the envelope being handled so that, if the actor crashes, the
    supervisor can fail that caller at once instead of leaving it to time out.
    """

    def __init__(self, receive: trio.MemoryReceiveChannel[Envelope]) -> None:
        self._receive = receive
        self.current: Envelope | None = None

    # An iterator object, not an async generator: an actor that crashes inside its
    # ``async for`` would leave a suspended generator behind (a ResourceWarning).
    def __aiter__(self) -> Mailbox:
        return self

    async def __anext__(self) -> Envelope:
        self.current = None
        try:
            envelope = await self._receive.receive()
        except (trio.EndOfChannel, trio.ClosedResourceError):
            raise StopAsyncIteration from None
        self.current = envelope
        return envelope

    async def receive(self) -> Envelope:
        """Wait for the next envelope (for actors that also wait on other things)."""
        envelope = await self._receive.receive()
        self.current = envelope
        return envelope

    def fail_current(self, error: BaseException) -> None:
        if self.current is not None:
            self.current.fail(error)
            self.current = None

    def fail_pending(self, reason: str) -> None:
        """Fail the envelope being handled and every queued one with ``Unavailable(reason)``.

        For an actor that will not run again: its callers learn it at once instead of
        waiting out their timeouts.
        """
        self.fail_current(Unavailable(reason))
        while True:
            try:
                self._receive.receive_nowait().fail(Unavailable(reason))
            except (trio.WouldBlock, trio.EndOfChannel, trio.ClosedResourceError):
                return


class Address:
    """How callers reach an actor. Safe to share; never exposes the actor's state."""

    def __init__(self, name: str, send: trio.MemorySendChannel[Envelope]) -> None:
        self.name = name
        self._send = send

    async def call(self, message: Request[R], *, timeout: float = 10.0) -> R:
        """Send ``message`` and wait for the reply.

        :raises Unavailable: the actor did not answer within ``timeout`` seconds or
            its mailbox is closed.
        :raises: whatever the actor failed the envelope with.
        """
        slot = _Reply()
        with trio.move_on_after(timeout) as scope:
            try:
                await self._send.send(Envelope(message, slot))
            except trio.ClosedResourceError:
                raise Unavailable(f"actor {self.name} is stopped") from None
            reply: R = await slot.wait()
            return reply
        assert scope.cancelled_caught
        raise Unavailable(f"actor {self.name} did not answer within {timeout:g} s")

    async def cast(self, message: object) -> None:
        """Send ``message`` without waiting for a reply; waits while the mailbox is full."""
        try:
            await self._send.send(Envelope(message, None))
        except trio.ClosedResourceError:
            raise Unavailable(f"actor {self.name} is stopped") from None

    def try_cast(self, message: object) -> bool:
        """Send without waiting; False when the mailbox is full or closed (caller decides)."""
        try:
            self._send.send_nowait(Envelope(message, None))
        except (trio.WouldBlock, trio.ClosedResourceError):
            return False
        return True

    def close(self) -> None:
        """Refuse further messages: senders, waiting ones included, get ``Unavailable``."""
        self._send.close()

    @property
    def depth(self) -> int:
        """Messages waiting in the mailbox."""
        return self._send.statistics().current_buffer_used


def open_mailbox(name: str, size: int) -> tuple[Address, Mailbox]:
    """A fresh bounded mailbox and the address that feeds it."""
    send, receive = trio.open_memory_channel[Envelope](size)
    return Address(name, send), Mailbox(receive)


class Registry:
    """Addresses of running actors by name."""

    def __init__(self) -> None:
        self._addresses: dict[str, Address] = {}

    def register(self, address: Address) -> None:
        if address.name in self._addresses:
            raise ValueError(f"an actor named {address.name!r} is already registered")
        self._addresses[address.name] = address

    def unregister(self, name: str) -> None:
        self._addresses.pop(name, None)

    def lookup(self, name: str) -> Address:
        """The address of ``name``.

        :raises Unavailable: no such actor runs (its plugin is disabled or it stopped).
        """
        try:
            return self._addresses[name]
        except KeyError:
            raise Unavailable(f"actor {name} is not running") from None

    def get(self, name: str) -> Address | None:
        return self._addresses.get(name)

    def addresses(self) -> list[Address]:
        return list(self._addresses.values())


Handler = Callable[[Any], Awaitable[Any]]


async def serve_mailbox(mailbox: Mailbox, handle: Handler) -> None:
    """Answer every envelope with ``await handle(message)``, one at a time.

    A ``ServiceError`` (or any ``Exception``) raised by ``handle`` is sent to the caller
    and the loop goes on: a bad request must not crash the actor.
    """
    async for envelope in mailbox:
        try:
            result = await handle(envelope.message)
        except Exception as exc:  # the caller owns the failure, not the actor
            envelope.fail(exc)
        else:
            envelope.reply(result)
