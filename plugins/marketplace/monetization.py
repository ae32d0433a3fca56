"""Monetization models of an agent and their validation.

Three models, each a JSON object with a ``model`` field (docs/marketplace.md):

- ``free``: anyone may run the agent; nothing is charged.
- ``per_call``: anyone may run it; every tool call is charged the tool's ``perCallFlow``
  (``defaultPerCallFlow``, optional, default 0, for tools without a price).
- ``subscription``: only subscribers may run it; a subscription costs ``priceFlow``
  (required, above 0) for ``periodDays`` days (required, 1 to 365) and covers every call.

Any other model, a missing required field, a bad value or an unknown field is
``invalid_monetization``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from plugins.marketplace.errors import InvalidMonetization
from runtime.errors import InvalidRequest
from runtime.wire import format_flow, parse_flow

Model = Literal["free", "per_call", "subscription"]
MODELS: tuple[Model, ...] = ("free", "per_call", "subscription")
_FIELDS: dict[Model, tuple[set[str], set[str]]] = {  # model: (required, optional)
    "free": (set(), set()),
    "per_call": (set(), {"defaultPerCallFlow"}),
    "subscription": ({"priceFlow", "periodDays"}, set()),
}
MAX_PERIOD_DAYS = 365


@dataclass(frozen=True)
class Monetization:
    """A validated monetization config; amounts in micro-FLOW."""

    model: Model
    default_per_call_micro: int = 0
    price_micro: int = 0
    period_days: int = 0

    @property
    def charges_per_call(self) -> bool:
        return self.model == "per_call"

    @property
    def needs_subscription(self) -> bool:
        return self.model == "subscription"

    def wire(self) -> dict[str, Any]:
        """The config as clients see it (and as it is stored)."""
        if self.model == "per_call":
            return {"model": "per_call",
                    "defaultPerCallFlow": format_flow(self.default_per_call_micro)}
        if self.model == "subscription":
            return {"model": "subscription", "priceFlow": format_flow(self.price_micro),
                    "periodDays": self.period_days}
        return {"model": "free"}


FREE = Monetization("free")


def _invalid(field: str, message: str) -> InvalidMonetization:
    return InvalidMonetization(f"monetization.{field} {message}",
                               details=[{"field": f"monetization.{field}", "message": message}])


def _amount(config: dict[str, Any], field: str) -> int:
    try:
        return parse_flow(config[field], f"monetization.{field}")
    except InvalidRequest as exc:
        raise InvalidMonetization(exc.message, details=exc.details) from None


def parse_monetization(config: object) -> Monetization:
    """Validate a monetization config from a request (or from storage).

    :raises InvalidMonetization: not an object, unknown model, a required field missing,
        an unknown field, or a bad value.
    """
    if not isinstance(config, dict):
        raise InvalidMonetization("monetization must be an object with a model",
                                  details=[{"field": "monetization", "message": "not an object"}])
    model = config.get("model")
    if model not in MODELS:
        raise _invalid("model", f"must be one of {', '.join(MODELS)}")
    required, optional = _FIELDS[model]
    for field in sorted(required - config.keys()):
        raise _invalid(field, f"is required for the {model} model")
    for field in sorted(config.keys() - required - optional - {"model"}):
        raise _invalid(field, f"is not a field of the {model} model")
    if model == "per_call":
        default = _amount(config, "defaultPerCallFlow") if "defaultPerCallFlow" in config else 0
        return Monetization("per_call", default_per_call_micro=default)
    if model == "subscription":
        price = _amount(config, "priceFlow")
        if price <= 0:
            raise _invalid("priceFlow", "must be above 0 (use the free model instead)")
        days = config["periodDays"]
        if isinstance(days, bool) or not isinstance(days, int) \
                or not 1 <= days <= MAX_PERIOD_DAYS:
            raise _invalid("periodDays", f"must be a whole number of days, 1 to {MAX_PERIOD_DAYS}")
        return Monetization("subscription", price_micro=price, period_days=days)
    return FREE
