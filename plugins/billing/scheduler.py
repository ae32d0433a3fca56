"""The ``billing.scheduler`` actor: one per process, driving renewals, grace and lapses.

A pass claims the live subscriptions whose ``due_at`` has come on the billing clock
(``subscriptions.claim_due``: a lease of ``lease_seconds`` real seconds, taken with ``FOR
UPDATE SKIP LOCKED`` on PostgreSQL and a compare-and-set everywhere, so each renewal and
retry is done by one process), runs each one's step (``renewals.step``) and frees the
USDT amounts whose quarantine is over. Then it sleeps until the next ``due_at`` (or the end
of a lease held on due work), at most ``scheduler_poll_seconds`` (work made due by other
processes), or until the test clock moves.

Nothing is kept in memory that the database does not have: a restart in the middle of a
step finds the subscription due again once its lease ends and repeats the step with the
same invoice. An outage of the database, Redis or a provider (``runtime.errors.is_outage``)
never crashes the actor: a step that meets one keeps its claim until the lease ends, a
pass that meets one is retried with backoff. Any other exception is a bug and crashes the
actor, for the supervisor to restart.

With the test clock the actor also follows the clock's offset on the shared fan-out
channel ``billing.clock`` (``runtime.follow``), so every process runs on one calendar.
"""

from __future__ import annotations

import logging
import secrets
from datetime import timedelta
from typing import Any

import trio

from plugins.billing import invoices, renewals, subscriptions
from plugins.billing.clock import CLOCK_CHANNEL, CLOCK_KEY, TestClock
from plugins.billing.state import BillingState
from runtime.actors import ActorSpec, Mailbox, serve_mailbox
from runtime.backoff import Backoff, outage_cause
from runtime.errors import is_outage
from runtime.follow import ChangeFeed, follow_changes
from runtime.service import Service
from runtime.wire import utcnow

log = logging.getLogger("flowsvc.billing.scheduler")
SCHEDULER_ACTOR = "billing.scheduler"
BATCH = 50
MIN_NAP_SECONDS = 0.05


class Scheduler:
    """The state of one process's scheduler: who it is (its claim owner) and its wake-up."""

    def __init__(self, service: Service, state: BillingState) -> None:
        self.service = service
        self.state = state
        self.owner = secrets.token_hex(8)
        self._wake = trio.Event()
        state.clock.on_move(self.wake)

    def wake(self) -> None:
        self._wake.set()

    async def run_pass(self) -> float:
        """Do everything due now; the seconds until the next due work (at most the poll)."""
        db, settings, clock = self.service.db, self.state.settings, self.state.clock
        quarantine = timedelta(hours=settings.usdt_quarantine_hours)
        await db.write(invoices.release_reservations, clock.now() - quarantine)
        lease = timedelta(seconds=settings.lease_seconds)
        while True:
            claimed = await db.write(subscriptions.claim_due, clock.now(), utcnow(),
                                     self.owner, lease, BATCH)
            for subscription in claimed:
                try:
                    await renewals.step(self.service, self.state, subscription)
                except Exception as exc:
                    if not is_outage(exc):
                        raise
                    log.warning("subscription %d: %s; retried after its lease",
                                subscription.id, getattr(exc, "message", type(exc).__name__))
            if len(claimed) < BATCH:
                break
        wait = await db.read(subscriptions.seconds_to_next, clock.now(), utcnow())
        if wait is None:
            return settings.scheduler_poll_seconds
        return min(max(wait, MIN_NAP_SECONDS), settings.scheduler_poll_seconds)

    async def loop(self) -> None:
        backoff = Backoff()
        while True:
            try:
                nap = await self.run_pass()
                backoff.reset()
            except Exception as exc:
                if not is_outage(exc):
                    raise
                nap = backoff.next_delay()
                log.warning("billing pass failed (%s); retrying in %.1f s", outage_cause(exc),
                            nap)
            with trio.move_on_after(nap):
                await self._wake.wait()
            self._wake = trio.Event()

    async def run(self, mailbox: Mailbox, *,
                  task_status: trio.TaskStatus[Any] = trio.TASK_STATUS_IGNORED) -> None:
        clock = self.state.clock
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self.loop)
            if isinstance(clock, TestClock):
                await follow_changes(_clock_feed(self.service, clock), self.service.shared,
                                     mailbox, task_status=task_status)
            else:
                task_status.started()
                await serve_mailbox(mailbox, _refuse)


async def _refuse(message: object) -> None:
    raise TypeError(f"{SCHEDULER_ACTOR} takes no messages, not {message!r}")


def _clock_feed(service: Service, clock: TestClock) -> ChangeFeed:
    async def resync() -> None:
        stored = await service.shared.get(CLOCK_KEY)
        if stored is not None:
            clock.set_offset(timedelta(seconds=float(stored)))

    return ChangeFeed(SCHEDULER_ACTOR, CLOCK_CHANNEL, resync,
                      lambda message: clock.set_offset(timedelta(seconds=float(message))),
                      resync, poll_seconds=1.0)


async def move_clock(service: Service, clock: TestClock, seconds: float) -> None:
    """Advance the test clock of this process now, and of every process through the shared
    state (kept for processes that start later, announced to the running ones)."""
    clock.advance(seconds)
    offset = str(clock.offset.total_seconds())
    await service.shared.set(CLOCK_KEY, offset)
    await service.shared.publish(CLOCK_CHANNEL, offset)


def scheduler_actor(service: Service, state: BillingState) -> ActorSpec:
    """The ``billing.scheduler`` actor; it takes no messages."""
    return ActorSpec(name=SCHEDULER_ACTOR, run=Scheduler(service, state).run)
