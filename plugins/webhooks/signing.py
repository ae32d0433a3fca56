"""Signing and verification of outbound webhook deliveries, and the exact bytes that get signed.

Every delivery carries two signatures over the same raw body:

* ``X-Service-Signature: t=<unix seconds>,v1=<hex>`` -- the spec's scheme: lowercase hex
  HMAC-SHA256 of ``"<t>.<raw body>"``, keyed with the subscription secret *string* (its UTF-8
  bytes, ``whsec_`` prefix included).
* ``webhook-id`` / ``webhook-timestamp`` / ``webhook-signature`` -- the Standard Webhooks 1.0
  scheme (https://www.standardwebhooks.com): ``v1,<base64 HMAC-SHA256>`` of
  ``"<id>.<timestamp>.<body>"``, keyed with the bytes that the secret's base64 part decodes to.

Secrets are minted by :func:`new_secret` as ``whsec_`` + base64 of 32 random bytes, which is the
Standard Webhooks secret format, so an integrator can hand the very same string to either our
:func:`verify_delivery` or any Standard Webhooks library. Nothing here logs or stores secrets.
"""

import base64
import binascii
import hashlib
import hmac
import json
import re
import secrets as secrets_random
import time
from collections.abc import Mapping, Sequence
from datetime import datetime
from decimal import Decimal
from typing import Literal

from runtime.wire import iso

SIGNATURE_HEADER = "X-Service-Signature"
WHSEC_PREFIX = "whsec_"
DEFAULT_TOLERANCE_SECONDS = 300
SECRET_KEY_BYTES = 32

SignatureFailure = Literal["malformed", "timestamp_out_of_tolerance", "no_matching_signature"]

_HEX_SHA256 = re.compile(r"[0-9a-f]{64}")
_DIGITS = re.compile(r"[0-9]+")
# Standard Webhooks forbids "." in the message id (it delimits the signed content); we also keep
# it header-safe so it can travel unchanged in `webhook-id`.
_EVENT_ID = re.compile(r"[A-Za-z0-9_\-]+")
_FLOW_QUANTUM = Decimal("0.000001")


class SignatureError(Exception):
    """A delivery failed verification.

    ``reason`` is stable and meant for code: ``"malformed"`` (the header cannot be parsed),
    ``"timestamp_out_of_tolerance"`` (authentic, but ``t`` is too far from now: a replay or a
    skewed clock) or ``"no_matching_signature"`` (no ``v1`` value matches any given secret).
    """

    def __init__(self, reason: SignatureFailure, message: str) -> None:
        super().__init__(message)
        self.reason: SignatureFailure = reason


def new_secret() -> str:
    """Return a fresh subscription secret: ``whsec_`` + base64 of 32 bytes from the OS CSPRNG."""
    return WHSEC_PREFIX + base64.b64encode(secrets_random.token_bytes(SECRET_KEY_BYTES)).decode()


def standard_webhooks_key(secret: str) -> bytes:
    """Return the HMAC key the Standard Webhooks scheme derives from ``secret``.

    That is the base64 decoding of the part after ``whsec_``, exactly as Standard Webhooks
    libraries derive it. Raises ``ValueError`` if ``secret`` is not ``whsec_<base64>``.
    """
    if not secret.startswith(WHSEC_PREFIX):
        raise ValueError("webhook secret must start with 'whsec_'")
    try:
        key = base64.b64decode(secret[len(WHSEC_PREFIX) :], validate=True)
    except binascii.Error as exc:
        raise ValueError("webhook secret is not 'whsec_' followed by base64") from exc
    if not key:
        raise ValueError("webhook secret has an empty key")
    return key


def _service_signature(secret: str, timestamp: int, body: bytes) -> str:
    """Lowercase hex HMAC-SHA256 of ``"<timestamp>.<body>"`` keyed with the secret string."""
    signed = str(timestamp).encode("ascii") + b"." + body
    return hmac.new(secret.encode("utf-8"), signed, hashlib.sha256).hexdigest()


def sign_delivery(
    secrets: str | Sequence[str], body: bytes, *, timestamp: int, event_id: str
) -> dict[str, str]:
    """Return the signature headers of one delivery attempt of ``body``.

    ``secrets`` is the subscription secret, or several while a rotated-out secret is still
    honoured: each one adds a ``v1`` value to both schemes (``t=..,v1=<new>,v1=<old>`` and the
    space-separated ``webhook-signature`` list), so receivers holding either secret verify.
    ``timestamp`` is the attempt's Unix time in seconds (a retry gets a new one); ``event_id`` is
    the envelope ``id``, stable across retries, and becomes ``webhook-id``. The caller adds
    ``Content-Type: application/json`` and must send ``body`` byte for byte.

    Raises ``ValueError`` for a negative timestamp, an ``event_id`` that is empty or not made of
    ``[A-Za-z0-9_-]``, no secret, or a secret that is not ``whsec_<base64>``.
    """
    secret_list = [secrets] if isinstance(secrets, str) else list(secrets)
    if not secret_list:
        raise ValueError("sign_delivery needs at least one secret")
    if timestamp < 0:
        raise ValueError("timestamp must be a non-negative number of Unix seconds")
    if not _EVENT_ID.fullmatch(event_id):
        raise ValueError("event_id must be non-empty and contain only letters, digits, '_', '-'")
    standard_signed = f"{event_id}.{timestamp}.".encode("ascii") + body
    service_values = [f"v1={_service_signature(secret, timestamp, body)}" for secret in secret_list]
    standard_values = [
        "v1,"
        + base64.b64encode(
            hmac.new(standard_webhooks_key(secret), standard_signed, hashlib.sha256).digest()
        ).decode("ascii")
        for secret in secret_list
    ]
    return {
        SIGNATURE_HEADER: ",".join([f"t={timestamp}", *service_values]),
        "webhook-id": event_id,
        "webhook-timestamp": str(timestamp),
        "webhook-signature": " ".join(standard_values),
    }


def _parse_signature_header(header: str) -> tuple[int, list[str]]:
    """Split ``t=<int>,v1=<hex>[,v1=<hex>...]`` into the timestamp and the v1 values.

    Unknown schemes (``v0=``, ``v2=``) are skipped so a future scheme can be added beside v1
    without breaking receivers. Raises ``SignatureError("malformed")``.
    """
    timestamp: int | None = None
    candidates: list[str] = []
    for item in header.split(","):
        name, sep, value = item.strip().partition("=")
        if not sep or not name:
            raise SignatureError("malformed", f"signature header item {item.strip()!r} lacks '='")
        if name == "t":
            if timestamp is not None or not _DIGITS.fullmatch(value):
                raise SignatureError("malformed", "signature header needs exactly one numeric t")
            timestamp = int(value)
        elif name == "v1":
            if not _HEX_SHA256.fullmatch(value):
                raise SignatureError("malformed", "a v1 value is not 64 lowercase hex digits")
            candidates.append(value)
    if timestamp is None:
        raise SignatureError("malformed", "signature header has no t value")
    if not candidates:
        raise SignatureError("malformed", "signature header has no v1 value")
    return timestamp, candidates


def verify_delivery(
    body: bytes,
    signature_header: str,
    secrets: str | Sequence[str],
    *,
    tolerance: int = DEFAULT_TOLERANCE_SECONDS,
    now: int | None = None,
) -> None:
    """Check that ``body`` was signed by flowsvc with one of ``secrets`` within ``tolerance``.

    This is the receiver-side helper for integrators. ``body`` must be the raw request body as
    received (not re-serialized JSON); ``signature_header`` is the value of
    ``X-Service-Signature``. Pass several secrets while rotating: a delivery matching any of
    them is accepted. Comparisons are constant-time. Returns ``None`` when the delivery is
    authentic and fresh; then deduplicate it by the envelope ``id``, since delivery is
    at-least-once.

    Raises ``SignatureError`` whose ``reason`` is ``"malformed"``, ``"no_matching_signature"``
    or ``"timestamp_out_of_tolerance"`` (checked after the signature, so that reason is only
    given for authentic but stale or early deliveries). Raises ``ValueError`` when called with
    no secret or a negative tolerance.

    Example::

        from plugins.webhooks.signing import SignatureError, verify_delivery

        def handle(raw_body: bytes, headers: dict[str, str]) -> int:
            try:
                verify_delivery(raw_body, headers["X-Service-Signature"], [SECRET])
            except (KeyError, SignatureError):
                return 400
            envelope = json.loads(raw_body)
            if already_processed(envelope["id"]):
                return 200
            process(envelope)
            return 200
    """
    secret_list = [secrets] if isinstance(secrets, str) else list(secrets)
    if not secret_list:
        raise ValueError("verify_delivery needs at least one secret")
    if tolerance < 0:
        raise ValueError("tolerance must be non-negative")
    timestamp, candidates = _parse_signature_header(signature_header)
    expected = [_service_signature(secret, timestamp, body) for secret in secret_list]
    # Compare every pair without an early exit, so timing does not reveal which matched.
    matched = False
    for candidate in candidates:
        for digest in expected:
            matched |= hmac.compare_digest(candidate, digest)
    if not matched:
        raise SignatureError("no_matching_signature", "no v1 signature matches the secret(s)")
    current = int(time.time()) if now is None else now
    if abs(current - timestamp) > tolerance:
        raise SignatureError(
            "timestamp_out_of_tolerance",
            f"signature timestamp is {current - timestamp} s from now; at most {tolerance} s",
        )


def _utc_iso(moment: datetime) -> str:
    """``runtime.wire.iso`` for aware datetimes only: a naive one's zone would be a guess."""
    if moment.tzinfo is None or moment.utcoffset() is None:
        raise ValueError("datetime must be timezone-aware")
    return iso(moment)


def _json_default(value: object) -> str:
    """Serialize the non-JSON types a payload may hold, following the API conventions."""
    if isinstance(value, Decimal):
        if not value.is_finite():
            raise ValueError(f"cannot send non-finite amount {value}")
        quantized = value.quantize(_FLOW_QUANTUM)
        # Refuse rather than round: a webhook must never report a different amount.
        if quantized != value:
            raise ValueError(f"amount {value} has more than 6 decimals")
        return format(quantized, "f")
    if isinstance(value, datetime):
        return _utc_iso(value)
    raise TypeError(f"{type(value).__name__} is not JSON serializable in a webhook payload")


def envelope_body(
    event_id: str, event: str, user_id: int, created_at: datetime, data: Mapping[str, object]
) -> bytes:
    """Return the exact JSON bytes of one delivery envelope ``{id, event, user_id, created_at,
    data}``.

    The output is compact (no spaces) and pure ASCII (non-ASCII escaped), so every receiver sees
    the same bytes the signature covers. ``created_at`` and datetimes inside ``data`` become
    ISO 8601 UTC with milliseconds and ``Z``; ``Decimal`` values become strings with exactly 6
    decimals (``"1.500000"``). Build it once per event and reuse the bytes for every attempt.

    Raises ``ValueError`` for a naive datetime, a non-finite ``Decimal`` or one with more than 6
    decimals, or a float NaN/infinity; ``TypeError`` for other values JSON cannot carry.
    """
    envelope = {
        "id": event_id,
        "event": event,
        "user_id": user_id,
        "created_at": _utc_iso(created_at),
        "data": dict(data),
    }
    text = json.dumps(envelope, separators=(",", ":"), allow_nan=False, default=_json_default)
    return text.encode("ascii")
