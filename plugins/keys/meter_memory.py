"""The embedded meter backend: rate windows and period spend in this process.

Its state belongs to the ``keys.meter`` actor but is read and changed in place by the
requests themselves: every step of ``meter`` before the owner's bucket is checked runs
without yielding to Trio, so it is as serialised as a mailbox would make it, without a
mailbox round trip (two task switches, about 50 us, a tenth of a request's budget). The
owner's bucket is the service-wide one (``runtime.limits``); if it refuses, the key's hit
and spend are taken back. Charge tokens are remembered (the newest ``_MAX_TOKENS``) so a
retried charge is applied once.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import trio

from plugins.keys.metering import (
    ADMIT,
    REFUND,
    REOPEN,
    VOID,
    MeterItem,
    MeterResult,
    SpendLedger,
    Status,
)
from plugins.keys.records import KeyRecord
from runtime.limits import WINDOW_SECONDS, user_bucket
from runtime.shared import SharedState

_MAX_TOKENS = 100_000
_UNSEEN = -1


@dataclass
class _KeyMeter:
    period_key: int
    used: int
    hits: deque[float] = field(default_factory=deque)


class MemoryMeter:
    """Meters of every key used on this process (``shared`` counts the owners' buckets)."""

    def __init__(self, shared: SharedState) -> None:
        self._shared = shared
        self._keys: dict[int, _KeyMeter] = {}
        # (key id, token) -> the period the charge was applied in, or None once voided.
        self._tokens: dict[tuple[int, str], int | None] = {}
        self.spend = SpendLedger()

    async def run(self, *, task_status: trio.TaskStatus[Any] = trio.TASK_STATUS_IGNORED) -> None:
        """Nothing runs in the background here."""
        task_status.started()

    def _state(self, item: MeterItem) -> _KeyMeter:
        state = self._keys.get(item.key_id)
        if state is None:
            state = self._keys[item.key_id] = _KeyMeter(item.period_key, item.seed)
        elif state.period_key < item.period_key:  # a new period (or spend_period changed)
            state.period_key, state.used = item.period_key, item.seed
        return state

    async def meter(self, item: MeterItem, now: float) -> MeterResult:
        """Decide on ``item``; applies the hit and the spend when admitted."""
        state = self._state(item)
        if item.token:
            return self._charge_once(state, item)
        hits = state.hits
        counting = item.mode == ADMIT and item.key_rpm > 0
        if counting:
            while hits and hits[0] <= now - WINDOW_SECONDS:
                hits.popleft()
        if counting and len(hits) >= item.key_rpm:
            return self._result(state, "key_rate", counting)
        if item.mode == REFUND:
            applied = -min(item.cost, state.used) if state.period_key == item.period_key else 0
            state.used += applied
            self.spend.add(item.key_id, state.period_key, applied)
            return self._result(state, "ok", counting, applied)
        if item.limit is not None and state.used >= item.limit:
            return self._result(state, "spend", counting)
        if counting:
            hits.append(now)
        state.used += item.cost
        period = state.period_key
        if item.mode == ADMIT and item.user_rpm > 0:
            decision = await self._shared.hit_window(user_bucket(item.user_id), item.user_rpm,
                                                     WINDOW_SECONDS)
            if not decision.allowed:
                if counting:
                    _forget(hits, now)
                if state.period_key == period:
                    state.used -= item.cost
                return MeterResult("user_rate", len(hits), hits[0] if hits else None,
                                   decision.reset_at - WINDOW_SECONDS, state.used,
                                   state.period_key, 0)
        self.spend.add(item.key_id, period, item.cost)
        return self._result(state, "ok", counting, item.cost)

    def _charge_once(self, state: _KeyMeter, item: MeterItem) -> MeterResult:
        """A CHARGE, VOID or REOPEN of a token (see ``MeterItem``); never yields to Trio."""
        key = (item.key_id, item.token)
        seen = self._tokens.get(key, _UNSEEN)
        if item.mode == REOPEN:
            if seen is None:
                del self._tokens[key]
            return self._result(state, "ok", False)
        if item.mode == VOID:
            applied = 0
            if seen is not None and seen == state.period_key:
                applied = -min(item.cost, state.used)
                state.used += applied
            self._remember(key, None)
            return self._result(state, "ok", False, applied)
        if seen is None:
            return self._result(state, "void", False)
        if seen != _UNSEEN:
            return self._result(state, "ok", False, item.cost)
        if item.limit is not None and state.used >= item.limit:
            return self._result(state, "spend", False)
        state.used += item.cost
        self._remember(key, state.period_key)
        return self._result(state, "ok", False, item.cost)

    def _remember(self, key: tuple[int, str], period_key: int | None) -> None:
        self._tokens.pop(key, None)
        self._tokens[key] = period_key
        if len(self._tokens) > _MAX_TOKENS:
            del self._tokens[next(iter(self._tokens))]

    def _result(self, state: _KeyMeter, status: Status, counting: bool,
                applied: int = 0) -> MeterResult:
        oldest = state.hits[0] if counting and state.hits else None
        return MeterResult(status, len(state.hits) if counting else 0, oldest, None, state.used,
                           state.period_key, applied)

    async def period_used(self, records: list[KeyRecord], now: datetime) -> dict[int, int]:
        """The live period spend of each key."""
        used = {}
        for record in records:
            current = record.current_period_key(now)
            state = self._keys.get(record.id)
            if state is not None and state.period_key >= current:
                used[record.id] = state.used
            else:
                used[record.id] = record.stored_spend(current)
        return used


def _forget(hits: deque[float], moment: float) -> None:
    """Take back the hit counted at ``moment`` (normally the newest one)."""
    if hits and hits[-1] == moment:
        hits.pop()
    else:
        hits.remove(moment)
