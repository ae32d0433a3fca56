"""Wire formats: times in ISO 8601 UTC with milliseconds, FLOW amounts as exact decimals."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone
from decimal import Decimal, localcontext

import pytest

from runtime.errors import InvalidRequest
from runtime.wire import (
    MICRO,
    as_utc,
    format_flow,
    format_units,
    iso,
    iso_from_unix,
    parse_flow,
    utcnow,
)


def test_iso_is_utc_with_milliseconds_and_z() -> None:
    moment = datetime(2026, 11, 22, 10, 18, 0, 987654, tzinfo=UTC)
    assert iso(moment) == "2026-11-22T10:18:00.987Z"  # truncated, never rounded up
    plus_two = timezone(timedelta(hours=2))
    assert iso(datetime(2026, 1, 1, 1, 0, tzinfo=plus_two)) == "2025-12-31T23:00:00.000Z"
    assert iso(datetime(2026, 1, 1, 12, 0, 0, 5000)) == "2026-01-01T12:00:00.005Z"  # naive: UTC


def test_iso_from_unix() -> None:
    assert iso_from_unix(0) == "1970-01-01T00:00:00.000Z"
    assert iso_from_unix(1_795_000_000.25) == "2026-11-18T11:06:40.250Z"


def test_as_utc_and_utcnow() -> None:
    naive = datetime(2026, 5, 1, 8, 30)
    assert as_utc(naive) == datetime(2026, 5, 1, 8, 30, tzinfo=UTC)
    assert as_utc(datetime(2026, 5, 1, 10, 30, tzinfo=timezone(timedelta(hours=2)))).hour == 8
    assert utcnow().tzinfo is UTC


@pytest.mark.parametrize(("micro", "text"), [
    (0, "0.000000"), (1, "0.000001"), (1_500_000, "1.500000"), (-2_000_001, "-2.000001"),
    (123 * MICRO, "123.000000"),
])
def test_format_flow_has_exactly_six_decimals(micro: int, text: str) -> None:
    assert format_flow(micro) == text
    assert parse_flow(text, "amount", allow_negative=True) == micro


@pytest.mark.parametrize(("value", "micro"), [
    ("1.5", 1_500_000), (" 2.5 ", 2_500_000), ("0.000001", 1), ("1.0000000", MICRO),
    ("1e3", 1000 * MICRO), (3, 3 * MICRO), (0.1, 100_000), ("-0", 0),
    ("123456789012345678901234.123456", 123456789012345678901234123456),
])
def test_parse_flow_accepts_exact_amounts(value: object, micro: int) -> None:
    assert parse_flow(value, "amount") == micro


@pytest.mark.parametrize(("value", "why"), [
    ("1.1234567", "more than 6 decimals"),
    ("1e-7", "more than 6 decimals"),
    # 31 significant digits: the 7th decimal must be refused, not rounded away.
    ("123456789012345678901234.1234567", "more than 6 decimals"),
    ("1." + "0" * 60 + "1", "more than 6 decimals"),
    ("1e24", "too large"),
    ("-1", "must not be negative"),
    ("NaN", "finite"),
    ("Infinity", "finite"),
    ("one", "decimal string"),
    ("", "decimal string"),
    (True, "decimal string"),
    (None, "decimal string"),
    ([1], "decimal string"),
])
def test_parse_flow_refuses_inexact_or_invalid_amounts(value: object, why: str) -> None:
    with pytest.raises(InvalidRequest) as caught:
        parse_flow(value, "priceFlow")
    assert why in caught.value.message
    assert caught.value.details is not None
    assert [detail["field"] for detail in caught.value.details] == ["priceFlow"]
    assert caught.value.message.startswith("priceFlow ")


def test_negative_amounts_when_allowed() -> None:
    assert parse_flow("-1.25", "delta", allow_negative=True) == -1_250_000


@pytest.mark.parametrize(("value", "decimals", "text"), [
    (0, 18, "0"),
    (1, 18, "0.000000000000000001"),
    (10**18, 18, "1"),
    (15 * 10**17, 18, "1.5"),
    (1234 * 10**18, 18, "1234"),
    (1234 * 10**18 + 5 * 10**15, 18, "1234.005"),
    (10**18 - 1, 18, "0.999999999999999999"),
    (-1, 18, "-0.000000000000000001"),
    (-25 * 10**17, 18, "-2.5"),
    (2**256 - 1, 18, "115792089237316195423570985008687907853269984665640564039457"
                      ".584007913129639935"),
    (1_500_000, 6, "1.5"),
    (1234, 0, "1234"),
    (-7, 0, "-7"),
])
def test_format_units_is_exact(value: int, decimals: int, text: str) -> None:
    assert format_units(value, decimals) == text


def test_format_units_agrees_with_exact_decimal_arithmetic() -> None:
    with localcontext() as context:
        context.prec = 200
        for exponent in range(0, 78, 7):
            value = 3**exponent * 7 + exponent
            expected = format(Decimal(value).scaleb(-18).normalize(), "f")
            assert format_units(value) == expected


def test_format_units_refuses_negative_decimals() -> None:
    with pytest.raises(ValueError):
        format_units(1, -1)
