"""What a meter backend is asked and answers: the types shared by the in-process and Redis
backends and the ``keys.meter`` actor (``plugins.keys.meter``)."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal, Protocol

import trio

from plugins.keys.records import KeyRecord

ADMIT, CHARGE, REFUND = 1, 2, 3
Status = Literal["ok", "key_rate", "user_rate", "spend"]
STATUSES: tuple[Status, ...] = ("ok", "key_rate", "user_rate", "spend")


@dataclass(frozen=True)
class MeterItem:
    """One question to a meter backend. ``mode`` is ADMIT, CHARGE or REFUND."""

    mode: int
    key_id: int
    user_id: int
    key_rpm: int
    user_rpm: int
    limit: int | None
    cost: int
    period_key: int
    seed: int


@dataclass(frozen=True)
class MeterResult:
    """A backend's answer; times are Unix seconds, ``applied`` the spend change made."""

    status: Status
    key_count: int
    key_oldest: float | None
    user_oldest: float | None
    used: int
    period_key: int
    applied: int


class MeterBackend(Protocol):
    """Where rate windows and period spend live: this process, or Redis."""

    spend: SpendLedger

    async def meter(self, item: MeterItem, now: float) -> MeterResult: ...
    async def period_used(self, records: list[KeyRecord], now: datetime) -> dict[int, int]: ...
    async def run(self, *, task_status: trio.TaskStatus[Any] = ...) -> None: ...


class SpendLedger:
    """Spend applied by this process and not yet written to the database."""

    def __init__(self) -> None:
        self._deltas: defaultdict[tuple[int, int], int] = defaultdict(int)

    def add(self, key_id: int, period_key: int, delta: int) -> None:
        if delta:
            self._deltas[(key_id, period_key)] += delta

    def pending(self, key_id: int, period_key: int) -> int:
        """Spend of the key's period applied here and not yet written to the database."""
        return self._deltas.get((key_id, period_key), 0)

    def take(self) -> dict[tuple[int, int], int]:
        deltas = {key: value for key, value in self._deltas.items() if value}
        self._deltas.clear()
        return deltas

    def restore(self, deltas: dict[tuple[int, int], int]) -> None:
        for (key_id, period_key), delta in deltas.items():
            self.add(key_id, period_key, delta)
