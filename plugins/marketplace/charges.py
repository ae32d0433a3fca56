"""Charging FLOW to a caller's API key through the keys plugin's meter.

Paid use of an agent (per-call tool prices, subscriptions) is billed to the API key the
caller used, through the meter contract (``runtime.contracts.meter``): the charge counts
in the key's period spend (so ``X-FLOW-Period-Used``, spend caps and 402 apply to it) and
in the key's usage log under the model name ``agent:<slug>``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from plugins.marketplace.errors import ApiKeyRequired
from runtime.contracts.meter import METER_ACTOR, Charge, ChargeRecord
from runtime.principal import Principal

if TYPE_CHECKING:
    from runtime.service import Service

METER_TIMEOUT_SECONDS = 5.0


def billing_key(principal: Principal, what: str) -> int:
    """The API key paid use is billed to.

    :raises ApiKeyRequired: the caller did not authenticate with an API key.
    """
    if principal.via != "api_key" or principal.key_id is None:
        raise ApiKeyRequired(f"{what} is billed to an API key: call with x-api-key")
    return principal.key_id


async def charge_key(service: Service, key_id: int, micro_flow: int, slug: str, *,
                     token: str, record: ChargeRecord) -> None:
    """Charge ``micro_flow`` to ``key_id`` for agent ``slug`` once per ``token``, with
    ``record`` (the marketplace's side: the run's charge, the owner's earning) in the
    transaction that records the charge. ``record`` alone runs for 0 FLOW.

    :raises SpendCapReached: the key's period spend has reached its cap (402).
    :raises Unauthenticated: the key was revoked or no longer exists (401).
    :raises Unavailable: the meter or the database did not answer (503): retry with the
        same token.
    """
    if micro_flow == 0:
        await service.db.write(record)
        return
    await service.registry.lookup(METER_ACTOR).call(
        Charge(key_id=key_id, micro_flow=micro_flow, model=f"agent:{slug}"[:64], token=token,
               record=record),
        timeout=METER_TIMEOUT_SECONDS)
