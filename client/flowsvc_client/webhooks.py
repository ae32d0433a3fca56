"""Receiving flowsvc webhooks: check a delivery's signature before acting on it.

A delivery carries ``X-Service-Signature: t=<unix seconds>,v1=<hex>[,v1=<hex>]``: each
``v1`` is the hex HMAC-SHA256, keyed with a subscription secret (the whole ``whsec_...``
string), of ``<t>.<raw body>``. While a secret is being rotated the service signs with the
new and the old secret, so the header has two ``v1`` values and a receiver holding either
accepts it. ``t`` must be within ``tolerance`` seconds of now (300 by default, the spec's),
which stops a captured delivery from being replayed later. See docs/webhooks-receiving.md.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import time
from collections.abc import Mapping, Sequence
from typing import Any

from flowsvc_client.errors import WebhookSignatureError

SIGNATURE_HEADER = "X-Service-Signature"
TOLERANCE_SECONDS = 300


def _signature_parts(header: str) -> tuple[str, list[str]]:
    timestamp: str | None = None
    signatures: list[str] = []
    for item in header.split(","):
        name, _, value = item.strip().partition("=")
        if name == "t":
            if timestamp is not None or not (value.isascii() and value.isdigit()):
                raise WebhookSignatureError("malformed", "the header needs one numeric t")
            timestamp = value
        elif name == "v1":
            signatures.append(value)
    if timestamp is None or not signatures:
        raise WebhookSignatureError("malformed", "the header needs a t and a v1 value")
    return timestamp, signatures


def verify_webhook(body: bytes, headers: Mapping[str, str], secrets: str | Sequence[str], *,
                   tolerance: int = TOLERANCE_SECONDS, now: float | None = None
                   ) -> dict[str, Any]:
    """The delivery envelope ``{id, event, user_id, created_at, data}`` of an authentic,
    fresh delivery.

    :param body: the raw request body, exactly as received (never re-serialised JSON).
    :param headers: the request headers (any mapping; ``X-Service-Signature`` is looked up
        in any case).
    :param secrets: the subscription's secret, or several while you rotate to a new one.
    :param now: the current Unix time (tests); default the clock's.
    :raises WebhookSignatureError: ``malformed`` header, ``no_matching_signature``, or
        ``timestamp_out_of_tolerance`` (checked after the signature, so only an authentic
        but stale or early delivery is told so).

    Deduplicate by the envelope's ``id``: delivery is at least once.
    """
    keys = [secrets] if isinstance(secrets, str) else list(secrets)
    if not keys:
        raise ValueError("verify_webhook needs at least one secret")
    header = next((value for name, value in headers.items()
                   if name.lower() == SIGNATURE_HEADER.lower()), None)
    if header is None:
        raise WebhookSignatureError("malformed", f"no {SIGNATURE_HEADER} header")
    timestamp, signatures = _signature_parts(header)
    signed = timestamp.encode() + b"." + body
    expected = [hmac.new(key.encode(), signed, hashlib.sha256).hexdigest() for key in keys]
    # Every pair is compared, in constant time, so timing does not tell which secret matched.
    matched = False
    for signature in signatures:
        for digest in expected:
            matched |= hmac.compare_digest(signature.encode(), digest.encode())
    if not matched:
        raise WebhookSignatureError("no_matching_signature",
                                    "no v1 signature matches the secret(s)")
    skew = (time.time() if now is None else now) - int(timestamp)
    if abs(skew) > tolerance:
        raise WebhookSignatureError("timestamp_out_of_tolerance",
                                    f"the signature is {skew:.0f} s from now; at most {tolerance}")
    envelope: dict[str, Any] = json.loads(body)
    return envelope
