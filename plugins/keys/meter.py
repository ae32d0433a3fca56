"""The per-key rate and spend meter: what it decides, and the ``keys.meter`` actor.

**Rate.** A sliding log of one minute per key, the same algorithm as the service-wide
buckets: a request is admitted when fewer than ``rate_limit_rpm`` requests of the key were
admitted in the last 60 s, so the N+1st request inside any 60-second span is refused,
exactly, whatever the concurrency. ``Retry-After`` is when the oldest counted request
leaves the window, in whole seconds rounded up. ``rate_limit_rpm = 0`` disables the cap.
A key request is also counted in its owner's service-wide bucket (``runtime.limits``),
in the same atomic step: it is admitted only when both have room, and a refused request
counts in neither.

**Spend.** A request is admitted while ``spend_period_used < spend_limit_flow``; its cost
(``flowsvc_request_cost``, exact micro-FLOW) is then added, so the request that crosses
the cap is served and the next one gets 402. The cost of a request answered with a status
of 400 or more is refunded. Spend is metered per period (``plugins.keys.periods``) and
written to the database at least every ``spend_flush_seconds`` and when the service
stops, so it survives restarts; a crash loses at most that interval of spend.

**Charging from other plugins.** The ``keys.meter`` actor answers the ``Charge`` message of
the contract ``runtime.contracts.meter`` (what it answers and raises is documented there)
through the charge ledger (``plugins.keys.charging``): once per token, its usage row, the
stored spend and the caller's record in one transaction.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import trio

from plugins.keys import charging
from plugins.keys.metering import MeterResult, Status
from plugins.keys.periods import reset_text_at
from plugins.keys.records import KeyRecord, add_spend
from plugins.keys.state import KeysState
from runtime.actors import ActorSpec, Envelope, Mailbox
from runtime.backoff import outage_cause
from runtime.contracts.meter import METER_ACTOR, Charge
from runtime.errors import RateLimited, SpendCapReached, is_outage
from runtime.limits import WINDOW_SECONDS
from runtime.wire import format_flow

log = logging.getLogger("flowsvc.keys")
@dataclass(frozen=True)
class Admission:
    """The meter's decision on one key request, and what its headers say."""

    status: Status
    record: KeyRecord
    cost: int
    used: int
    period_key: int
    remaining: int
    window_reset: float
    retry_after: int
    unix: float

    def headers(self) -> list[tuple[str, str]]:
        """``X-FLOW-*`` always; ``X-RateLimit-*`` when the key has a cap."""
        record = self.record
        headers = [("X-FLOW-Cost", format_flow(self.cost)),
                   ("X-FLOW-Period-Used", format_flow(self.used)),
                   ("X-FLOW-Period-Reset", reset_text_at(record.spend_period, self.unix))]
        if record.spend_limit is not None:
            headers.append(("X-FLOW-Period-Limit", format_flow(record.spend_limit)))
        if record.rate_limit_rpm > 0:
            headers += [("X-RateLimit-Limit", str(record.rate_limit_rpm)),
                        ("X-RateLimit-Remaining", str(self.remaining)),
                        ("X-RateLimit-Reset", _iso_ms(self.window_reset))]
        return headers

    def refusal(self, user_rpm: int) -> RateLimited | SpendCapReached | None:
        """The error that refuses the request, or None when it is admitted."""
        if self.status == "key_rate":
            return RateLimited(f"this API key's cap of {self.record.rate_limit_rpm} requests "
                               f"per minute is reached", retry_after=self.retry_after)
        if self.status == "user_rate":
            return RateLimited(f"too many requests: the limit is {user_rpm} authenticated "
                               f"requests per user per minute, API keys included",
                               retry_after=self.retry_after)
        if self.status == "spend":
            limit = format_flow(self.record.spend_limit or 0)
            return SpendCapReached(f"this API key has spent {format_flow(self.used)} FLOW of its "
                                   f"{limit} FLOW cap for this {self.record.spend_period} period")
        return None


def _iso_ms(unix: float) -> str:
    """``runtime.wire.iso_from_unix``, without strftime: it runs for every key request."""
    return datetime.fromtimestamp(unix, UTC).isoformat(timespec="milliseconds")[:-6] + "Z"


def admission_of(record: KeyRecord, result: MeterResult, unix: float) -> Admission:
    """Turn a backend's answer for an ADMIT at ``unix`` into the request's admission."""
    window_reset = unix if result.key_oldest is None else result.key_oldest + WINDOW_SECONDS
    retry_after = 0
    if result.status == "key_rate":
        retry_after = max(1, math.ceil(window_reset - unix))
    elif result.status == "user_rate" and result.user_oldest is not None:
        retry_after = max(1, math.ceil(result.user_oldest + WINDOW_SECONDS - unix))
    return Admission(status=result.status, record=record, cost=result.applied, used=result.used,
                     period_key=result.period_key,
                     remaining=max(0, record.rate_limit_rpm - result.key_count),
                     window_reset=window_reset, retry_after=retry_after, unix=unix)


async def flush_spend(state: KeysState) -> None:
    """Write the spend applied by this process to the database (kept on failure)."""
    deltas = state.meter.spend.take()
    if not deltas:
        return
    try:
        await state.db.write(add_spend, deltas)
    except Exception:
        state.meter.spend.restore(deltas)
        raise


def meter_actor(state: KeysState) -> ActorSpec:
    """The ``keys.meter`` actor: runs the backend (the Redis batcher), flushes spend to the
    database every ``spend_flush_seconds`` and once more when stopped, and answers
    ``Charge`` messages."""
    flush_seconds = state.settings.spend_flush_seconds

    async def flush_loop() -> None:
        while True:
            await trio.sleep(flush_seconds)
            try:
                await flush_spend(state)
            except Exception as exc:  # the spend is kept and written at the next try
                log.warning("spend flush failed (%s); retrying in %.1f s",
                            outage_cause(exc) if is_outage(exc) else "a bug", flush_seconds,
                            exc_info=not is_outage(exc))

    async def answer(envelope: Envelope) -> None:
        try:
            if not isinstance(envelope.message, Charge):
                raise TypeError(f"{METER_ACTOR} does not understand {envelope.message!r}")
            envelope.reply(await charging.charge(state, envelope.message))
        except Exception as exc:  # the caller owns the failure, not the actor
            envelope.fail(exc)

    async def run(mailbox: Mailbox, *,
                  task_status: trio.TaskStatus[Any] = trio.TASK_STATUS_IGNORED) -> None:
        try:
            async with trio.open_nursery() as nursery:
                await nursery.start(state.meter.run)
                nursery.start_soon(flush_loop)
                task_status.started()
                # Each charge may wait for the database (an uncached key) or Redis, so it
                # runs on its own and never holds up the next message.
                async for envelope in mailbox:
                    nursery.start_soon(answer, envelope)
                nursery.cancel_scope.cancel()  # the mailbox was closed: the actor is stopping
        finally:
            with trio.CancelScope(shield=True) as scope:
                scope.deadline = trio.current_time() + 5.0
                try:
                    await flush_spend(state)
                except Exception:
                    log.error("spend not written at shutdown", exc_info=True)

    return ActorSpec(name=METER_ACTOR, run=run, mailbox_size=1024, shutdown_timeout=6.0)
