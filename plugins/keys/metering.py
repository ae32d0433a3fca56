"""What a meter backend is asked and answers: the types shared by the in-process and Redis
backends and the ``keys.meter`` actor (``plugins.keys.meter``)."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal, Protocol

import trio

from plugins.keys.records import KeyRecord

ADMIT, CHARGE, REFUND, VOID, REOPEN = 1, 2, 3, 4, 5
Status = Literal["ok", "key_rate", "user_rate", "spend", "void"]
STATUSES: tuple[Status, ...] = ("ok", "key_rate", "user_rate", "spend", "void")
TOKEN_TTL_SECONDS = 7 * 86_400
"""How long a backend remembers a charge token (retries and reconciliation come far sooner)."""


@dataclass(frozen=True)
class MeterItem:
    """One question to a meter backend. ``mode`` is ADMIT, CHARGE, REFUND, VOID or REOPEN.

    A CHARGE with a ``token`` is applied once per token: asked again, the backend answers
    ``ok`` and ``applied`` without charging again, or ``void`` once the token was voided.
    A VOID takes back the charge of ``token`` (``cost``) if it was applied, and makes any
    later CHARGE of that token a no-op answered ``void``, until a REOPEN of the token (its
    charge is being made anew) forgets that it was voided. The spend of a token's charge is
    written to the database by the charge's own transaction (``plugins.keys.charging``),
    so it never goes into the ``SpendLedger``.
    """

    mode: int
    key_id: int
    user_id: int
    key_rpm: int
    user_rpm: int
    limit: int | None
    cost: int
    period_key: int
    seed: int
    token: str = ""


def item_for(record: KeyRecord, mode: int, cost: int, user_rpm: int, unix: float,
             token: str = "") -> MeterItem:
    """The meter question for ``record`` at ``unix`` (seconds)."""
    current = record.current_period_key(unix)
    return MeterItem(mode=mode, key_id=record.id, user_id=record.user_id,
                     key_rpm=record.rate_limit_rpm if mode == ADMIT else 0,
                     user_rpm=user_rpm if mode == ADMIT else 0, limit=record.spend_limit,
                     cost=cost, period_key=current, seed=record.stored_spend(current),
                     token=token)


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
