"""The dispatcher actor: claims due deliveries ahead, sends them, settles the outcomes.

The cost of the outbox is per transaction and per thread hop, not per row, so the dispatcher
talks to the database in batches, one transaction (one hop to a database thread) each: the
*pump* settles every answer gathered since the last batch (``settling.settle``) and, in the
same transaction, claims due deliveries (``claims.claim_due``) into a local queue per target
host. It claims ahead: up to ``CLAIM_AHEAD`` times the concurrency slots, overall and per host,
so the slots are refilled from the queue as each request ends and the database sees one claim
per half-queue of deliveries rather than one per freed slot. The pump runs when a wake-up
arrives (an event committed in this process, a retry scheduled), when half a host's queue has
been sent under a backlog (a ``Wake`` claims at once even then, so a hung host's backlog does
not delay the other hosts' new deliveries), when ``SETTLE_BATCH`` answers are waiting, when the
oldest answer has waited ``SETTLE_TICK_SECONDS``, when the next delivery falls due, or every
``poll_seconds``, whichever comes first, so nothing depends on a wake-up. An *attempt* task per
started delivery makes one HTTP attempt (``sender.send_attempt``), frees its slot when the
request is over and starts the next queued delivery; the delivery stays leased until settled,
so it is never claimed twice.

A queued delivery starts only while its lease outlasts a whole attempt (``timeout_seconds``
from now); one that waited too long is handed back unsent at the next batch
(``outbox.give_back``, which also takes its never-made attempt out of the history), as are
those still queued when the actor stops.

**Draining** (``runtime.drain``: the process was asked to stop). The pump claims nothing
more, so the deliveries still due go to other processes; each attempt, from its start until
its outcome is settled, holds the drain: an attempt cut short, or sent and never settled,
would go out again from another process once its lease ran out, so a receiver would get it
twice.

**Outages.** Every database call waits out an outage (``runtime.errors.is_outage``) with
backoff from ``OUTAGE_BACKOFF_MIN`` to ``OUTAGE_BACKOFF_MAX`` seconds, so the actor neither
crashes nor counts against the supervisor's intensity, and resumes within
``OUTAGE_BACKOFF_MAX`` seconds of the database coming back. Claimed deliveries stay leased to
this process meanwhile (the claimer never takes its own leases back by expiry), and attempts
that finished during the outage are settled when it ends: nothing is lost or sent again.

Owns: the HTTP client and its connection pool, the slot counts, the queue, and the leases it
holds, which it gives back when it stops (a crash loses nothing either: a restart gives them
back first, and leases expire). Its settings, URL policy and metrics come from the plugin's
state (``state.WEBHOOKS``). Message: ``Wake`` (cast by ``wake_dispatcher`` after a commit)
makes it look for due deliveries at once; it takes no other message.
"""

from __future__ import annotations

import logging
import secrets
from collections import Counter, deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import partial
from typing import Any

import httpx
import trio
from sqlalchemy import Connection

from plugins.webhooks.backoff import retry_delay
from plugins.webhooks.claims import claim_due
from plugins.webhooks.outbox import (
    PURGE_BATCH,
    Claim,
    Job,
    Outcome,
    Settled,
    give_back,
    purge_finished,
    release_claims,
)
from plugins.webhooks.sender import open_client, send_attempt
from plugins.webhooks.settling import settle
from plugins.webhooks.state import WEBHOOKS, WebhooksState
from runtime.actors import ActorSpec, Mailbox
from runtime.errors import is_outage
from runtime.service import Service
from runtime.wire import utcnow

log = logging.getLogger("flowsvc.webhooks")
DISPATCHER = "webhooks.dispatcher"
CLAIM_AHEAD = 4
SETTLE_BATCH = 64
SETTLE_TICK_SECONDS = 0.1
PURGE_INTERVAL_SECONDS = 3600.0
OUTAGE_BACKOFF_MIN = 0.1
OUTAGE_BACKOFF_MAX = 2.0


@dataclass(frozen=True)
class Wake:
    """Message (cast): deliveries may be due; look for them now."""


def wake_dispatcher(service: Service) -> None:
    """Tell this process's dispatcher that deliveries may be due (after a commit). Dropping
    the wake-up when the mailbox is full or the actor is not running is fine: it polls."""
    address = service.registry.get(DISPATCHER)
    if address is not None:
        address.try_cast(Wake())


@dataclass(frozen=True)
class _ClaimRequest:
    """What the pump asks ``claim_due`` for (see there)."""

    owner: str
    lease_seconds: float
    room: int
    host_room: Mapping[str, int]
    per_host: int


def _exchange(connection: Connection, outcomes: Sequence[Outcome], unsent: Sequence[Job],
              wanted: _ClaimRequest | None, *, owner: str, max_retries: int,
              retry_delay: Callable[[int], float]) -> tuple[list[Settled], Claim | None]:
    """One batch, one transaction: settle ``outcomes``, hand back ``unsent``, then claim
    (after the settle, so the retries it schedules are seen)."""
    settled = settle(connection, outcomes, owner=owner, max_retries=max_retries,
                     retry_delay=retry_delay) if outcomes else []
    give_back(connection, unsent, owner)
    if wanted is None:
        return settled, None
    return settled, claim_due(connection, owner=wanted.owner,
                              lease_seconds=wanted.lease_seconds, room=wanted.room,
                              host_room=wanted.host_room, per_host=wanted.per_host)


class _Dispatcher:
    """The state of one run of the actor (a restart builds a new one)."""

    def __init__(self, service: Service, state: WebhooksState, owner: str,
                 client: httpx.AsyncClient) -> None:
        self.service = service
        self.client = client
        self.settings = state.settings
        self.owner = owner
        self.metrics = state.metrics
        self.policy = state.policy
        self.wake = trio.Event()
        self.in_flight = 0
        self.by_host: Counter[str] = Counter()  # in flight, per host
        # Claimed, not started yet: per host, each with the trio time it must start by.
        self.queued: dict[str, deque[tuple[Job, float]]] = {}
        self.held_by_host: Counter[str] = Counter()  # in flight or queued, per host
        self.max_held = state.settings.max_concurrency * CLAIM_AHEAD
        self.host_max_held = state.settings.per_host_concurrency * CLAIM_AHEAD
        self.outcomes: list[Outcome] = []
        self.outcomes_settled = trio.Event()  # set once ``outcomes`` (as gathered now) settle
        self.first_outcome_at = 0.0
        self.unsent: list[Job] = []  # to hand back at the next batch
        # Under a backlog, deliveries sent since the last claim wake the pump once there are
        # ``batch`` of them (or nothing is held): claims come in batches.
        self.backlog = False
        self.next_due: datetime | None = None  # of the unclaimed, when the last claim looked
        self.sent = 0
        self.batch = max(1, min(self.host_max_held, self.max_held) // 2)
        # A ``Wake`` came (new work committed) since the last claim: claimed at once even under
        # a backlog, which may be one hung host's, so that host does not hold the others back
        # (nor a delivery committed between a claim's statements, taken for a backlog).
        self.new_work = False
        self.nursery: trio.Nursery | None = None

    @property
    def held(self) -> int:
        return sum(self.held_by_host.values())

    async def listen(self, mailbox: Mailbox) -> None:
        async for envelope in mailbox:
            match envelope.message:
                case Wake():
                    self.new_work = True
                    self.wake.set()
                case other:
                    raise TypeError(f"{DISPATCHER} does not understand {other!r}")

    async def pump(self) -> None:
        settings = self.settings
        # Leases of an earlier run of this actor in this process (it crashed) are ours.
        await self._write(release_claims, self.owner)
        while True:
            self.wake = trio.Event()  # wake-ups from now on count; earlier ones are served
            room = self.max_held - self.held
            if room <= 0:
                self.backlog = True  # no room: sent deliveries wake the pump to claim again
            wanted = None
            # Under a backlog, claims wait for a batch's worth of room or new work (settles
            # go on); a draining process claims nothing more: other processes send what is due.
            if room > 0 and not self.service.drain.draining and (
                    not self.backlog or self.sent >= self.batch or not self.held
                    or self.new_work):
                self.new_work = False
                wanted = _ClaimRequest(
                    owner=self.owner, lease_seconds=settings.lease_seconds, room=room,
                    host_room={host: self.host_max_held - held
                               for host, held in self.held_by_host.items() if held},
                    per_host=self.host_max_held)
            # A queued delivery must start while its lease still outlasts a whole attempt;
            # the lease is counted from before the claim, so it is never overestimated.
            start_by = trio.current_time() + settings.lease_seconds - settings.timeout_seconds
            claim = await self._batch(wanted)
            if claim is not None:
                self.sent = 0
                for job in claim.jobs:
                    self.queued.setdefault(job.host, deque()).append((job, start_by))
                    self.held_by_host[job.host] += 1
                self._start_queued()
                if claim.jobs and not claim.exhausted and self.held < self.max_held:
                    continue
                # Due deliveries left that the queue could not take: a backlog.
                self.backlog = not claim.exhausted or (claim.next_due is not None
                                                       and claim.next_due <= utcnow())
                self.next_due = claim.next_due
            wait = settings.poll_seconds
            if self.next_due is not None and not self.backlog:
                wait = min(wait, (self.next_due - utcnow()).total_seconds())
            if self.outcomes or self.unsent:
                wait = min(wait, self.first_outcome_at + SETTLE_TICK_SECONDS
                           - trio.current_time())
            with trio.move_on_after(max(0.0, wait)):
                await self.wake.wait()

    async def _batch(self, wanted: _ClaimRequest | None) -> Claim | None:
        """Settle the answers gathered so far, hand back the unsent, claim ``wanted``."""
        outcomes, self.outcomes = self.outcomes, []
        unsent, self.unsent = self.unsent, []
        if not outcomes and not unsent and wanted is None:
            return None
        outcomes_settled, self.outcomes_settled = self.outcomes_settled, trio.Event()
        settled: list[Settled]
        claim: Claim | None
        settled, claim = await self._write(
            _exchange, outcomes, unsent, wanted, owner=self.owner,
            max_retries=self.settings.max_retries,
            retry_delay=partial(retry_delay, base=self.settings.backoff_base_seconds))
        outcomes_settled.set()
        for result in settled:
            self.metrics.attempts.labels(outcome=result).inc()
        if "retry" in settled and claim is None:
            self.wake.set()  # the next due time may be sooner than the pump thinks
        return claim

    def _start_queued(self) -> None:
        """Start queued deliveries while there are free slots, overall and per host; hand
        back those that can no longer finish within their lease."""
        assert self.nursery is not None
        now = trio.current_time()
        for host, waiting in list(self.queued.items()):
            while waiting and self.in_flight < self.settings.max_concurrency \
                    and self.by_host[host] < self.settings.per_host_concurrency:
                job, start_by = waiting.popleft()
                if now > start_by:
                    self.held_by_host[host] -= 1
                    self._note_done()
                    self._hand_back(job)
                    continue
                self.in_flight += 1
                self.by_host[host] += 1
                self.nursery.start_soon(self.attempt, job)
            if not waiting:
                del self.queued[host]
            if not self.held_by_host[host]:
                del self.held_by_host[host]
        self.metrics.in_flight.set(self.in_flight)

    def _hand_back(self, job: Job) -> None:
        if not self.outcomes and not self.unsent:
            self.first_outcome_at = trio.current_time()
        self.unsent.append(job)

    def _note_done(self) -> None:
        """A held delivery is off the queue (sent, or handed back): wake the pump when a
        batch's worth has gone under a backlog, or nothing is held."""
        self.sent += 1
        if self.backlog and (self.sent >= self.batch or not self.held):
            self.wake.set()

    async def attempt(self, job: Job) -> None:
        with self.service.drain.hold():  # from the request until its outcome is settled
            settled = await self._attempt(job)
            await settled.wait()

    async def _attempt(self, job: Job) -> trio.Event:
        """Make ``job``'s attempt and queue its outcome; return what is set once the outcome
        is settled."""
        try:
            outcome = await send_attempt(self.client, job, self.policy,
                                         self.settings.timeout_seconds)
        except Exception:
            # A delivery that breaks the sender would crash the actor again after each
            # restart until the supervisor gives up and stops the service: fail it instead.
            log.exception("webhook delivery %s could not be sent", job.delivery_id)
            outcome = Outcome(job=job, started_at=utcnow(), duration_ms=0, status_code=None,
                              error="internal error while sending", permanent=True)
        self.metrics.seconds.observe(outcome.duration_ms / 1000)
        # The slot is free as soon as the request is over: the delivery stays leased until
        # it is settled, so no claim can pick it again meanwhile.
        self.in_flight -= 1
        self.by_host[job.host] -= 1
        if not self.by_host[job.host]:
            del self.by_host[job.host]
        self.held_by_host[job.host] -= 1
        if not self.held_by_host[job.host]:
            del self.held_by_host[job.host]
        if not self.outcomes and not self.unsent:
            self.first_outcome_at = trio.current_time()
        self.outcomes.append(outcome)
        if len(self.outcomes) >= SETTLE_BATCH:
            self.wake.set()
        self._note_done()
        self._start_queued()
        return self.outcomes_settled

    async def purge_loop(self) -> None:
        while True:
            cutoff = utcnow() - timedelta(days=self.settings.retention_days)
            purged = PURGE_BATCH
            while purged == PURGE_BATCH:  # in batches: no long transaction blocks the outbox
                purged = await self._write(purge_finished, cutoff)
            await trio.sleep(PURGE_INTERVAL_SECONDS)

    async def stop(self) -> None:
        """Settle what was sent, hand back what was not, give back the leases still held
        (called shielded)."""
        self.unsent += [job for waiting in self.queued.values() for job, _ in waiting]
        self.queued.clear()
        with trio.move_on_after(5):
            await self._batch(None)
            await self._write(release_claims, self.owner)

    async def _write(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        """``db.write``, retried with backoff while the database is unavailable."""
        backoff = OUTAGE_BACKOFF_MIN
        while True:
            try:
                return await self.service.db.write(lambda c: fn(c, *args, **kwargs))
            except Exception as exc:
                if not is_outage(exc):
                    raise
                log.warning("webhook dispatcher: database unavailable, retrying in %g s",
                            backoff)
            await trio.sleep(backoff)
            backoff = min(backoff * 2, OUTAGE_BACKOFF_MAX)

    async def serve(self, mailbox: Mailbox, task_status: trio.TaskStatus[Any]) -> None:
        """Run the three tasks until cancelled; then settle and release (shielded)."""
        try:
            async with trio.open_nursery() as nursery:
                self.nursery = nursery
                nursery.start_soon(self.listen, mailbox)
                nursery.start_soon(self.purge_loop)
                nursery.start_soon(self.pump)
                task_status.started()
        finally:
            with trio.CancelScope(shield=True):
                await self.stop()


def dispatcher_actor(service: Service) -> ActorSpec:
    """The ``webhooks.dispatcher`` actor of ``service``."""
    owner = secrets.token_hex(8)  # this process's claims; survives restarts of the actor
    state = service.state(WEBHOOKS)
    settings = state.settings

    async def run(mailbox: Mailbox, *,
                  task_status: trio.TaskStatus[Any] = trio.TASK_STATUS_IGNORED) -> None:
        async with open_client(max_connections=settings.max_concurrency,
                               timeout=settings.timeout_seconds) as client:
            await _Dispatcher(service, state, owner, client).serve(mailbox, task_status)

    return ActorSpec(name=DISPATCHER, run=run, mailbox_size=16, shutdown_timeout=10.0)
