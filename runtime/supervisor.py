"""Small one_for_one supervisors in the manner of OTP (trio has none), nested in parts.

Children start in order and stop in reverse. A child that crashes is restarted alone,
after an exponential backoff; more than a supervisor's intensity of restarts within
``within_seconds`` and it gives up: it records why and sets ``gave_up``. It never swallows
``trio.Cancelled``.

**Faults stay where they start.** The core's supervisor (the root: the core's own actors,
``supervisor.max_restarts``) giving up shuts the service down cleanly. Every other child of
the root is a *part* (``PartSpec``: each plugin's actors, and parts a plugin nests, such as
one per chain) with a supervisor of its own and a smaller intensity
(``part_max_restarts``). A part's supervisor giving up takes that part down (its children
stop in reverse), lists it in ``failed_parts`` (``/readyz``) and ``flowsvc_part_failed``,
and starts it again after ``part_retry_seconds``, doubling up to ``part_retry_max_seconds``
while it keeps failing; the rest of the service serves meanwhile. A part never escalates
to its parent, so nested intensities do not multiply.

**Outages are not crashes.** An actor that ends with an exception saying a dependency is
down (``runtime.errors.is_outage``: the database, Redis, a chain RPC or a provider is
unavailable) is restarted with the same backoff, but the restart is not counted against
the intensity: a database failover of any length must not stop anything. Actors are
expected to wait out outages themselves (``runtime.follow``, retry loops); this is the
safety net for the ones that let one escape. Any other exception is a bug, and the
intensity is there to stop a crash loop.
"""

from __future__ import annotations

import logging
from collections import deque
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, Literal

import trio

from runtime.actors import ActorSpec, Address, Mailbox, PartSpec, Registry, open_mailbox
from runtime.config import SupervisorSettings
from runtime.errors import Unavailable, is_outage
from runtime.metrics import Metrics

log = logging.getLogger("flowsvc.supervisor")

CORE = "core"


def current_supervisor() -> Supervisor:
    """The supervisor running the calling actor: the one to start the children an actor
    owns under (a plugin's actor gets its part's, so their crashes stay in that part).

    :raises LookupError: called outside an actor.
    """
    return _current.get()


@dataclass
class _Child:
    spec: ActorSpec
    address: Address
    mailbox: Mailbox
    scope: trio.CancelScope = field(default_factory=trio.CancelScope)
    finished: trio.Event = field(default_factory=trio.Event)


@dataclass
class _Part:
    spec: PartSpec
    scope: trio.CancelScope = field(default_factory=trio.CancelScope)
    # The supervisor of the part while it runs; None while it is down.
    current: Supervisor | None = None
    # Why it is down, while it is.
    failed: str | None = None


class Supervisor:
    """Runs actors and parts in a nursery it is given; the owner of that nursery owns their
    lives.

    :param nursery: where children run; the caller keeps it open until ``stop_all``.
    :param name: ``core`` for the root; a part's name for the supervisor of a part.
    """

    def __init__(self, nursery: trio.Nursery, settings: SupervisorSettings,
                 registry: Registry, metrics: Metrics, *, name: str = CORE) -> None:
        self.name = name
        self._nursery = nursery
        self._settings = settings
        self._registry = registry
        self._metrics = metrics
        self._max_restarts = settings.max_restarts if name == CORE else settings.part_max_restarts
        # Children in start order: actors by name, parts by ("part", name).
        self._children: dict[str | tuple[str, str], _Child | _Part] = {}
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

    async def start_part(self, spec: PartSpec) -> None:
        """Start the part ``spec`` under a supervisor of its own; return once every child of
        it started.

        :raises ValueError: a part with that name already runs here.
        :raises: whatever a child raised before it was ready, on this first start only
            (a boot failure fails the start of the service; later ones take the part down).
        """
        key = ("part", spec.name)
        if key in self._children:
            raise ValueError(f"a part named {spec.name!r} is already running")
        part = self._children[key] = _Part(spec)
        try:
            await self._nursery.start(self._run_part, part)
        except BaseException:
            self._children.pop(key, None)
            raise

    async def start_child(self, spec: ActorSpec | PartSpec) -> None:
        """Start an actor or a part (see ``start`` and ``start_part``)."""
        if isinstance(spec, PartSpec):
            await self.start_part(spec)
        else:
            await self.start(spec)

    async def stop(self, name: str) -> None:
        """Cancel one actor and wait up to its ``shutdown_timeout`` for it to finish.

        Its address is closed at once: callers get ``Unavailable`` instead of a timeout.
        """
        child = self._children.get(name)
        if isinstance(child, _Child):
            await self._stop_actor(child)

    async def stop_all(self) -> None:
        """Stop every child, the last started first; a part stops its own children so."""
        for child in reversed(list(self._children.values())):
            if isinstance(child, _Child):
                await self._stop_actor(child)
            else:
                await self._stop_part(child)

    def running(self) -> list[str]:
        """The names of the running actors, those of running parts included, in start order."""
        names: list[str] = []
        for child in self._children.values():
            if isinstance(child, _Child):
                names.append(child.spec.name)
            elif child.current is not None:
                names.extend(child.current.running())
        return names

    def failed_parts(self) -> dict[str, str]:
        """Why each part that is down is (nested parts included), by part name."""
        failed: dict[str, str] = {}
        for child in self._children.values():
            if isinstance(child, _Part):
                if child.failed is not None:
                    failed[child.spec.name] = child.failed
                if child.current is not None:
                    failed.update(child.current.failed_parts())
        return failed

    async def _stop_actor(self, child: _Child) -> None:
        child.scope.cancel()
        self._forget(child)
        with trio.move_on_after(child.spec.shutdown_timeout):
            await child.finished.wait()

    async def _stop_part(self, part: _Part) -> None:
        """Stop the part's children in reverse (each within its timeout), then the part."""
        self._children.pop(("part", part.spec.name), None)
        if part.current is not None:
            await part.current.stop_all()
        part.scope.cancel()

    async def _run_part(self, part: _Part, *, task_status: trio.TaskStatus[None]) -> None:
        """Run the part until it is stopped: start it, and after each time it goes down wait
        the retry backoff and start it again."""
        name = part.spec.name
        retry = self._settings.part_retry_seconds
        status: trio.TaskStatus[None] | None = task_status
        with part.scope:
            while True:
                began = trio.current_time()
                reason = await self._part_once(part, status)
                status = None
                if trio.current_time() - began > self._settings.part_retry_max_seconds:
                    retry = self._settings.part_retry_seconds  # it was healthy a long time
                part.failed = reason
                self._metrics.part_failed.labels(part=name).set(1)
                self._metrics.part_failures.labels(part=name).inc()
                log.error("part %s is down: %s; it starts again in %g s", name, reason, retry)
                await trio.sleep(retry)
                retry = min(retry * 2, self._settings.part_retry_max_seconds)
                log.warning("part %s starts again", name)

    async def _part_once(self, part: _Part, status: trio.TaskStatus[None] | None) -> str:
        """Start the part's children under a fresh supervisor and run them until it gives up;
        return why. ``status`` is given on the first start only: a boot failure then
        propagates to whoever started the part."""
        failure: Exception | None = None
        async with trio.open_nursery() as nursery:
            supervisor = Supervisor(nursery, self._settings, self._registry, self._metrics,
                                    name=part.spec.name)
            part.current = supervisor
            try:
                for spec in part.spec.children:
                    await supervisor.start_child(spec)
            except Exception as error:
                failure = error
            else:
                if status is not None:
                    status.started()
                if part.failed is not None:
                    log.warning("part %s is up again", part.spec.name)
                part.failed = None
                self._metrics.part_failed.labels(part=part.spec.name).set(0)
                await supervisor.gave_up.wait()
            part.current = None
            await supervisor.stop_all()
            nursery.cancel_scope.cancel()
        if failure is not None:
            if status is not None:
                raise failure
            log.error("part %s failed to start", part.spec.name, exc_info=failure)
            return f"it failed to start ({type(failure).__name__})"
        assert supervisor.reason is not None
        return supervisor.reason

    async def _supervise(self, child: _Child, *, task_status: trio.TaskStatus[None]) -> None:
        spec = child.spec
        _current.set(self)
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
            if len(self._restarts) > self._max_restarts:
                self.reason = (
                    f"actor {name} crashed: more than {self._max_restarts} restarts "
                    f"within {self._settings.within_seconds:g} s"
                )
                whose = "supervisor" if self.name == CORE else f"supervisor of part {self.name}"
                log.error("%s gives up: %s", whose, self.reason)
                self.gave_up.set()
                return False
        log.warning("restarting actor %s", name)
        self._metrics.actor_restarts.labels(actor=name).inc()
        return True


_Ending = Literal["returned", "crashed", "outage"]
# Set in each actor's own task (``_supervise``), so the actor and its tasks see it.
_current: ContextVar[Supervisor] = ContextVar("flowsvc_supervisor")


class _StartStatus:
    """Wraps a nursery.start() task status to know whether the actor became ready."""

    def __init__(self, inner: trio.TaskStatus[Any]) -> None:
        self._inner = inner
        self.called = False

    def started(self, value: Any = None) -> None:
        self.called = True
        self._inner.started(value)
