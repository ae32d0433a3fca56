"""The dispatcher actor: claims due deliveries, sends them, settles the outcomes.

The actor's tasks share its state. The *claimer* leases due deliveries from the outbox
(``outbox.claim_due``), never more than the free concurrency slots, overall and per target
host, so that everything it claims is sent at once and no lease runs out while waiting; then it
sleeps until the next delivery falls due, a wake-up arrives (an event committed in this
process, a retry scheduled) or ``poll_seconds`` pass, whichever comes first, so nothing
depends on a wake-up. Under a backlog it claims in batches: it waits until half a host's worth
of slots (``per_host_concurrency / 2``) is free, or every slot, before claiming again, so a
transaction serves several deliveries instead of one. An *attempt* task per claimed delivery
makes one HTTP attempt (``sender.send_attempt``) and frees its slot when the request is over.
The *settler* records finished attempts in batches, one transaction each (``outbox.settle``);
until then the delivery stays leased, so claiming and settling overlap without a delivery
being claimed twice.

**Draining** (``runtime.drain``: the process was asked to stop). The claimer claims nothing
more, so the deliveries still due go to other processes; an attempt in flight, and its outcome
until it is settled, hold the drain: an attempt cut short would be given back and sent again
by another process, so a receiver would get it twice.

**Outages.** Every database call waits out an outage (``runtime.errors.is_outage``) with
backoff from ``OUTAGE_BACKOFF_MIN`` to ``OUTAGE_BACKOFF_MAX`` seconds, so the actor neither
crashes nor counts against the supervisor's intensity, and resumes within
``OUTAGE_BACKOFF_MAX`` seconds of the database coming back. Claimed deliveries stay leased to
this process meanwhile (the claimer never takes its own leases back by expiry), and attempts
that finished during the outage are settled when it ends: nothing is lost or sent again.

Owns: the HTTP client and its connection pool, the slot counts, and the leases it holds, which
it gives back when it stops (a crash loses nothing either: a restart gives them back first, and
leases expire). Its settings, URL policy and metrics come from the plugin's state
(``state.WEBHOOKS``). Message: ``Wake`` (cast by ``wake_dispatcher`` after a commit) makes it
look for due deliveries at once; it takes no other message.
"""

from __future__ import annotations

import logging
import secrets
from collections import Counter
from dataclasses import dataclass
from datetime import timedelta
from functools import partial
from typing import Any

import httpx
import trio

from plugins.webhooks.backoff import retry_delay
from plugins.webhooks.outbox import (
    PURGE_BATCH,
    Claim,
    Job,
    Outcome,
    claim_due,
    purge_finished,
    release_claims,
    settle,
)
from plugins.webhooks.sender import open_client, send_attempt
from plugins.webhooks.state import WEBHOOKS, WebhooksState
from runtime.actors import ActorSpec, Mailbox
from runtime.errors import is_outage
from runtime.service import Service
from runtime.wire import utcnow

log = logging.getLogger("flowsvc.webhooks")
DISPATCHER = "webhooks.dispatcher"
SETTLE_BATCH = 256
SETTLE_GATHER_SECONDS = 0.02
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
        self.by_host: Counter[str] = Counter()
        # Under a backlog, slots freed since the last claim wake the claimer once there are
        # ``batch`` of them (or nothing is in flight): claims come in batches.
        self.backlog = False
        self.freed = 0
        self.batch = max(1, min(state.settings.per_host_concurrency,
                                state.settings.max_concurrency) // 2)
        self.outcomes_in, self.outcomes_out = trio.open_memory_channel[Outcome](
            state.settings.max_concurrency)

    async def listen(self, mailbox: Mailbox) -> None:
        async for envelope in mailbox:
            match envelope.message:
                case Wake():
                    self.wake.set()
                case other:
                    raise TypeError(f"{DISPATCHER} does not understand {other!r}")

    async def claim_loop(self, nursery: trio.Nursery) -> None:
        settings = self.settings
        # Leases of an earlier run of this actor in this process (it crashed) are ours.
        await self._write(release_claims, self.owner)
        while True:
            self.wake = trio.Event()  # wake-ups from now on count; earlier ones are served
            room = settings.max_concurrency - self.in_flight
            claim = Claim(jobs=[], next_due=None, exhausted=False)
            if room > 0 and not self.service.drain.draining:
                host_room = {host: settings.per_host_concurrency - used
                             for host, used in self.by_host.items() if used}
                claim = await self._write(claim_due, owner=self.owner,
                                          lease_seconds=settings.lease_seconds, room=room,
                                          host_room=host_room,
                                          per_host=settings.per_host_concurrency)
                self.freed = 0
                for job in claim.jobs:
                    self.in_flight += 1
                    self.by_host[job.host] += 1
                    nursery.start_soon(self.attempt, job)
                self.metrics.in_flight.set(self.in_flight)
                if claim.jobs and not claim.exhausted:
                    continue
            wait = settings.poll_seconds
            # No room, or due deliveries left that the slots could not take: a backlog.
            self.backlog = not claim.exhausted or (claim.next_due is not None
                                                   and claim.next_due <= utcnow())
            if claim.next_due is not None and not self.backlog:
                wait = min(wait, (claim.next_due - utcnow()).total_seconds())
            with trio.move_on_after(wait):
                await self.wake.wait()

    async def attempt(self, job: Job) -> None:
        with self.service.drain.hold():  # until its outcome is in the channel
            await self._attempt(job)

    async def _attempt(self, job: Job) -> None:
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
        # it is settled, so no claim can pick it again meanwhile. The channel is as deep as
        # the slots, which bounds the leased-but-unsettled deliveries.
        self.in_flight -= 1
        self.by_host[job.host] -= 1
        if not self.by_host[job.host]:
            del self.by_host[job.host]
        self.metrics.in_flight.set(self.in_flight)
        self.freed += 1
        if self.backlog and (self.freed >= self.batch or not self.in_flight):
            self.wake.set()
        await self.outcomes_in.send(outcome)

    async def settle_loop(self) -> None:
        async for first in self.outcomes_out:
            with self.service.drain.hold():  # outcomes taken from the channel until settled
                batch = [first]
                # A moment for a batch's worth to gather: one transaction settles them all
                # (the deliveries stay leased meanwhile, nothing waits for it).
                with trio.move_on_after(SETTLE_GATHER_SECONDS):
                    while len(batch) < self.batch:
                        batch.append(await self.outcomes_out.receive())
                while len(batch) < SETTLE_BATCH:
                    try:
                        batch.append(self.outcomes_out.receive_nowait())
                    except trio.WouldBlock:
                        break
                await self._settle(batch)

    async def _settle(self, batch: list[Outcome]) -> None:
        settled = await self._write(settle, batch, owner=self.owner,
                                    max_retries=self.settings.max_retries,
                                    retry_delay=partial(retry_delay,
                                                        base=self.settings.backoff_base_seconds))
        for result in settled:
            self.metrics.attempts.labels(outcome=result).inc()
        if "retry" in settled:
            self.wake.set()  # the next due time may be sooner than the claimer thinks

    async def purge_loop(self) -> None:
        while True:
            cutoff = utcnow() - timedelta(days=self.settings.retention_days)
            purged = PURGE_BATCH
            while purged == PURGE_BATCH:  # in batches: no long transaction blocks the outbox
                purged = await self._write(purge_finished, cutoff)
            await trio.sleep(PURGE_INTERVAL_SECONDS)

    async def stop(self) -> None:
        """Settle what was sent, give back the leases still held (called shielded)."""
        batch: list[Outcome] = []
        while True:
            try:
                batch.append(self.outcomes_out.receive_nowait())
            except (trio.WouldBlock, trio.EndOfChannel):
                break
        with trio.move_on_after(5):
            if batch:
                await self._settle(batch)
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
        """Run the four tasks until cancelled; then settle and release (shielded)."""
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self.listen, mailbox)
                nursery.start_soon(self.settle_loop)
                nursery.start_soon(self.purge_loop)
                nursery.start_soon(self.claim_loop, nursery)
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
