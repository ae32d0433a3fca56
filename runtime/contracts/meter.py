"""Contract: charge FLOW to an API key (provided by the keys plugin's ``keys.meter`` actor).

A plugin that bills paid use (the marketplace's per-call tool prices and agent
subscriptions) sends ``Charge`` to the actor registered as ``METER_ACTOR``::

    charged = await service.registry.lookup(METER_ACTOR).call(
        Charge(key_id=principal.key_id, micro_flow=250_000, model="agent:summarizer"))

The charge counts in the key's period spend (so ``X-FLOW-Period-Used``, the spend cap and
402 apply to it) and in the key's usage log under ``model``. The call answers
``Charged``, or raises ``SpendCapReached`` (402) when the key's period spend has reached
its cap (nothing is charged then), ``Unauthenticated`` (401) when the key was revoked or
does not exist, and ``Unavailable`` (503) when the meter cannot answer.
"""

from __future__ import annotations

from dataclasses import dataclass

from runtime.actors import Request

METER_ACTOR = "keys.meter"


@dataclass(frozen=True)
class Charged:
    """The answer to ``Charge``: what was charged and where the key's period now stands.

    :param micro_flow: the amount charged, in micro-FLOW (10^-6 FLOW).
    :param period_used: the key's spend in its current period, after this charge.
    :param period_limit: the key's cap per period, None without one.
    :param period_reset: when the period ends (ISO 8601 UTC).
    """

    key_id: int
    micro_flow: int
    period_used: int
    period_limit: int | None
    period_reset: str


@dataclass(frozen=True)
class Charge(Request[Charged]):
    """Charge ``micro_flow`` (10^-6 FLOW, an integer >= 0) to the API key ``key_id``.

    :param key_id: the key (``Principal.key_id`` of the request that started the work).
    :param model: what the cost came from (an agent, a model, a tool), 1 to 64
        characters; the key's ``by_model`` usage breakdown groups by it.
    """

    key_id: int
    micro_flow: int
    model: str
