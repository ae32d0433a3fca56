"""Contract: charge FLOW to an API key (provided by the keys plugin's ``keys.meter`` actor).

A plugin that bills paid use (the marketplace's per-call tool prices and agent
subscriptions) sends ``Charge`` to the actor registered as ``METER_ACTOR``::

    charged = await service.registry.lookup(METER_ACTOR).call(
        Charge(key_id=principal.key_id, micro_flow=250_000, model="agent:summarizer",
               token=f"run:{run_id}:{call_id}", record=credit_the_owner))

The charge counts in the key's period spend (so ``X-FLOW-Period-Used``, the spend cap and
402 apply to it) and in the key's usage log under ``model``. The call answers
``Charged``, or raises ``SpendCapReached`` (402) when the key's period spend has reached
its cap (nothing is charged then), ``Unauthenticated`` (401) when the key was revoked or
does not exist, ``Unavailable`` (503) when the meter or the database cannot answer or the
charge was taken back while it was being made (retry with the same token), and whatever
``record`` raises (the charge is then taken back: nothing is charged).

**Exactly once.** ``token`` names what is being paid for (a run's call, a subscription's
period) and must be the same on every retry: the meter and the ``key_charges`` table apply
a token once, so a retried charge answers the first one's ``Charged`` without charging
again. A charge left unrecorded (its process died, or nobody retried it within
``charge_grace_seconds``) is taken back by the keys plugin's reconciler; retried after
that, it is made anew, once (see ``docs/failure-behaviour.md``, "Charge ledger").
``record`` runs in the database transaction that records the charge, its usage row and
the key's stored spend, so the caller's own ledger (a run's charges, an owner's earnings)
commits with it or not at all.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from runtime.actors import Request

if TYPE_CHECKING:
    from sqlalchemy import Connection

METER_ACTOR = "keys.meter"
TOKEN_MAX_LENGTH = 128

ChargeRecord = Callable[["Connection"], None]
"""Called as ``record(connection)`` in the transaction that records a charge, once per
token (never on a retry that finds the charge recorded)."""


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
    :param token: what is paid for, 1 to 128 characters, the same on every retry
        (``run:<run id>:<call id>``, ``sub:<subscription id>:<period end>``); a token is
        charged once per key.
    :param record: see ``ChargeRecord``; None when the caller keeps no ledger of its own.
    """

    key_id: int
    micro_flow: int
    model: str
    token: str
    record: ChargeRecord | None = None
