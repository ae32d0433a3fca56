"""A small one_for_one supervisor in the manner of OTP (trio has none).

Children start in order and stop in reverse. A child that crashes is restarted alone,
after an exponential backoff; when more than ``max_restarts`` restarts happen within
``within_seconds`` the supervisor gives up: it records why, sets ``gave_up`` and the
service shuts down cleanly. It never restarts anything on its own initiative beyond
that, and it never swallows ``trio.Cancelled``.

**Outages are not crashes.** An actor that ends with an exception saying a dependency is
down (``runtime.errors.is_outage``: the database, Redis, a chain RPC or a provider is
unavailable) is restarted with the same backoff, but the restart is not counted against
the intensity: a database failover of any length must not stop the service. Actors are
expected to wait out outages themselves (``runtime.follow``, retry loops); this is the
safety net for the ones that let one escape. Any other exception is a bug, and the
intensity is there to stop a crash loop.
"""

from __future__ import annotations

import logging
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Literal

import trio

from runtime.actors import ActorSpec, Address, Mailbox, Registry, open_mailbox
from runtime.config import SupervisorSettings
from runtime.errors import Unavailable, is_outage
from runtime.metrics import Metrics

log = logging.getLogger("flowsvc.supervisor")


@dataclass
class _Child:
    spec: ActorSpec
    address: Address
    mailbox: Mailbox
    scope: trio.CancelScope = field(default_factory=trio.CancelScope)
    finished: trio.Event = field(default_factory=trio.Event)


class Supervisor:
    """Runs actors in a nursery it is given; the owner of that nursery owns their lives.

    :param nursery: where children run; the caller keeps it open until ``stop_all``.
    """

    def __init__(self, nursery: trio.Nursery, settings: SupervisorSettings,
                 registry: Registry, metrics: Metrics) -> None:
        self._nursery = nursery
        self._settings = settings
        self._registry = registry
        self._metrics = metrics
        self._children: dict[str, _Child] = {}
        self._restarts: deque[float] = deque()
        self.gave_up = trio.Event()
        self.reason: str | None = None

    async def start(self, spec: ActorSpec) -> Address:
        """Start ``spec`` and return its address once the actor called ``started()``.

        :raises ValueError: an actor with that name already runs.
        :raises: whatever the actor raised before it was ready (boot failures surface).
        """
        if spec.name in self._children:
            raise ValueError(f"an actor named {spec.name!r} is already running")
        address, mailbox = open_mailbox(spec.name, spec.mailbox_size)
        child = _Child(spec, address, mailbox)
        # Registered before it runs, so that an actor that ends at once is forgotten for good.
        self._registry.register(address)
        self._children[spec.name] = child
        self._metrics.mailbox_depth.labels(actor=spec.name).set_function(lambda: address.depth)
        try:
            await self._nursery.start(self._supervise, child)
        except BaseException:
            self._forget(child)  # a boot failure, or a closed nursery: leave nothing registered
            raise
        return address

    async def stop(self, name: str) -> None:
        """Cancel one child and wait up to its ``shutdown_timeout`` for it to finish.

        Its address is closed at once: callers get ``Unavailable`` instead of a timeout.
        """
        child = self._children.get(name)
        if child is None:
            return
        child.scope.cancel()
        self._forget(child)
        with trio.move_on_after(child.spec.shutdown_timeout):
            await child.finished.wait()

    async def stop_all(self) -> None:
        """Stop every child, the last started first."""
        for name in reversed(list(self._children)):
            await self.stop(name)

    def running(self) -> list[str]:
        return list(self._children)

    async def _supervise(self, child: _Child, *, task_status: trio.TaskStatus[None]) -> None:
        spec = child.spec
        backoff = self._settings.backoff_initial_seconds
        status: _StartStatus | None = _StartStatus(task_status)
        try:
            with child.scope:
                while True:
                    began = trio.current_time()
                    ending = await self._run_once(child, status)
                    status = None
                    if child.scope.cancel_called:  # being stopped: it ended as it was told
                        return
                    if spec.restart == "temporary" or (spec.restart == "transient"
                                                       and ending == "returned"):
                        return
                    if not self._note_restart(spec.name, counted=ending == "crashed"):
                        return
                    if trio.current_time() - began > self._settings.within_seconds:
                        # A long healthy run: this crash is news, not part of a crash loop.
                        backoff = self._settings.backoff_initial_seconds
                    await trio.sleep(backoff)
                    backoff = min(max(backoff * 2, 0.01), self._settings.backoff_max_seconds)
        finally:
            self._forget(child)
            child.finished.set()

    def _forget(self, child: _Child) -> None:
        """The child will not run again: close its address, fail its callers, unregister it."""
        name = child.spec.name
        child.address.close()
        child.mailbox.fail_pending(f"actor {name} is stopped")
        if self._children.get(name) is child:
            del self._children[name]
            self._registry.unregister(name)
            self._metrics.mailbox_depth.remove(name)

    async def _run_once(self, child: _Child, status: _StartStatus | None) -> _Ending:
        """Run the actor once; how it ended.

        ``status`` is given on the first run only: a crash before ``started()`` is a
        boot failure and propagates to whoever called ``start``.
        """
        try:
            if status is None:
                await child.spec.run(child.mailbox)
            else:
                await child.spec.run(child.mailbox, task_status=status)
        except Exception as exc:
            if status is not None and not status.called:
                raise
            name = child.spec.name
            outage = is_outage(exc)
            if outage:
                log.warning("actor %s stopped: a dependency is unavailable (%s)", name,
                            type(exc).__name__)
            else:
                log.exception("actor %s crashed", name)
            # The cause is in the log; callers (and HTTP clients) only learn that it crashed.
            child.mailbox.fail_current(Unavailable(f"actor {name} crashed"))
            return "outage" if outage else "crashed"
        return "returned"

    def _note_restart(self, name: str, *, counted: bool) -> bool:
        """Note a restart; False (and give up) past the restart intensity. A restart after
        an outage is not ``counted``: it never exhausts the intensity."""
        if counted:
            now = trio.current_time()
            self._restarts.append(now)
            while self._restarts and now - self._restarts[0] > self._settings.within_seconds:
                self._restarts.popleft()
            if len(self._restarts) > self._settings.max_restarts:
                self.reason = (
                    f"actor {name} crashed: more than {self._settings.max_restarts} restarts "
                    f"within {self._settings.within_seconds:g} s"
                )
                log.error("supervisor gives up: %s", self.reason)
                self.gave_up.set()
                return False
        log.warning("restarting actor %s", name)
        self._metrics.actor_restarts.labels(actor=name).inc()
        return True


_Ending = Literal["returned", "crashed", "outage"]


class _StartStatus:
    """Wraps a nursery.start() task status to know whether the actor became ready."""

    def __init__(self, inner: trio.TaskStatus[Any]) -> None:
        self._inner = inner
        self.called = False

    def started(self, value: Any = None) -> None:
        self.called = True
        self._inner.started(value)
