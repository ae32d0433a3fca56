"""How values look on the wire: times, FLOW amounts, ids (see ``docs/api.md``).

Times are ISO 8601 UTC with milliseconds and ``Z``; FLOW amounts are stored as
integers of micro-FLOW (10^-6) and written as decimal strings with exactly 6 decimals.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from decimal import Decimal, Inexact, InvalidOperation, localcontext

from runtime.errors import InvalidRequest

MICRO = 1_000_000
# Decimal()'s own grammar for finite numbers, in ASCII only: it also takes "1_000" and the
# digits of every script ("١٢٣"), which no client means as an amount.
_DECIMAL_STRING = re.compile(
    r"\s*[-+]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][-+]?[0-9]+)?\s*", re.ASCII)


def utcnow() -> datetime:
    return datetime.now(UTC)


def as_utc(moment: datetime) -> datetime:
    """Attach UTC to a naive datetime read back from SQLite (every time we store is UTC)."""
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)


def iso(moment: datetime) -> str:
    """``2026-11-22T10:18:00.000Z``."""
    moment = as_utc(moment)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"


def iso_from_unix(seconds: float) -> str:
    return iso(datetime.fromtimestamp(seconds, UTC))


def format_flow(micro: int) -> str:
    """``1500000`` micro-FLOW as ``"1.500000"``."""
    sign = "-" if micro < 0 else ""
    whole, fraction = divmod(abs(micro), MICRO)
    return f"{sign}{whole}.{fraction:06d}"


def format_units(value: int, decimals: int = 18) -> str:
    """Return ``value`` base units of a token with ``decimals`` decimals as an exact decimal
    string with trailing zeros trimmed (on-chain amounts, payment amounts):
    ``format_units(15 * 10**17) == "1.5"``, ``"0"``, ``"1234"``, ``"-0.000000000000000001"``.

    :raises ValueError: ``decimals`` is negative.
    """
    if decimals < 0:
        raise ValueError("decimals must not be negative")
    sign = "-" if value < 0 else ""
    whole, fraction = divmod(abs(value), 10**decimals)
    digits = f"{fraction:0{decimals}d}".rstrip("0") if decimals else ""
    return f"{sign}{whole}.{digits}" if digits else f"{sign}{whole}"


def parse_flow(value: object, field: str, *, allow_negative: bool = False) -> int:
    """A FLOW amount from a decimal string (preferred) or a JSON number, in micro-FLOW.

    A string holds ASCII digits with an optional point and minus sign, nothing else; a JSON
    number is best read as a ``Decimal`` (``FlowsvcRequest.exact_json``), which keeps its
    decimals exactly.

    :raises InvalidRequest: not a number, more than 6 decimals, negative, or 10^24 FLOW or more.
    """
    if isinstance(value, bool) or not isinstance(value, str | int | float | Decimal):
        raise _bad_amount(field, "must be a decimal string such as \"1.5\"")
    try:
        amount = value if isinstance(value, Decimal) else Decimal(str(value).strip())
    except InvalidOperation:
        raise _bad_amount(field, "must be a decimal string such as \"1.5\"") from None
    if not amount.is_finite():
        raise _bad_amount(field, "must be a finite amount")
    if isinstance(value, str) and not _DECIMAL_STRING.fullmatch(value):
        raise _bad_amount(field, "must be a decimal string of ASCII digits such as \"1.5\"")
    if amount and amount.adjusted() >= 24:  # 10^24 FLOW is 10^30 micro-FLOW
        raise _bad_amount(field, "is too large")
    # The default 28 digits would round a large amount's 7th decimal away instead of
    # refusing it; 40 hold every amount below 10^24 with 6 decimals exactly.
    with localcontext() as context:
        context.prec = 40
        context.traps[Inexact] = True
        try:
            scaled = amount * MICRO
            whole = scaled == scaled.to_integral_value()
        except Inexact:  # digits beyond the 40th: far more than 6 decimals
            whole = False
    if not whole:
        raise _bad_amount(field, "has more than 6 decimals; FLOW amounts are exact to 10^-6")
    if amount < 0 and not allow_negative:
        raise _bad_amount(field, "must not be negative")
    return int(scaled)


def _bad_amount(field: str, message: str) -> InvalidRequest:
    return InvalidRequest(f"{field} {message}", details=[{"field": field, "message": message}])
