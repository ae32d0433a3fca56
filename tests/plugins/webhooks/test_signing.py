"""Tests of delivery signing, receiver-side verification, the envelope bytes and the receiving docs.

Every signature is recomputed here from the raw bytes with `hmac`, and the Standard Webhooks
signature is checked by an independent implementation of its published algorithm plus a known
answer from the Standard Webhooks reference test suite.
"""

import base64
import hashlib
import hmac
import http.client
import json
import re
import runpy
import threading
import time
from collections.abc import Iterator, Mapping
from datetime import UTC, datetime, timedelta, timezone
from decimal import Decimal
from http.server import HTTPServer
from pathlib import Path

import pytest

from plugins.webhooks.signing import (
    SIGNATURE_HEADER,
    SignatureError,
    envelope_body,
    new_secret,
    sign_delivery,
    verify_delivery,
)

DOC = Path(__file__).resolve().parents[3] / "docs" / "webhooks-receiving.md"
SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
OTHER_SECRET = "whsec_wZlQ/bxKunqfj7Hl3+GML/3RZrAJgQpBkfijaK1zEME="
T = 1_795_860_000
BODY = b'{"id":"evt_1","event":"payout.sent","user_id":7,"created_at":"2026-11-28T10:00:00.000Z"}'


def hmac_hex(secret: str, message: bytes) -> str:
    return hmac.new(secret.encode(), message, hashlib.sha256).hexdigest()


def standard_webhooks_valid(secret: str, headers: Mapping[str, str], body: bytes, now: int) -> bool:
    """Verify as the Standard Webhooks 1.0 spec describes, independently of our module."""
    key = base64.b64decode(secret.removeprefix("whsec_"))
    msg_id, timestamp = headers["webhook-id"], headers["webhook-timestamp"]
    if abs(now - int(timestamp)) > 5 * 60:
        return False
    expected = hmac.new(key, f"{msg_id}.{timestamp}.".encode() + body, hashlib.sha256).digest()
    for versioned in headers["webhook-signature"].split(" "):
        version, _, signature = versioned.partition(",")
        if version == "v1" and hmac.compare_digest(base64.b64decode(signature), expected):
            return True
    return False


def signature_reason(body: bytes, header: str, secrets: str | list[str], now: int = T) -> str:
    with pytest.raises(SignatureError) as caught:
        verify_delivery(body, header, secrets, now=now)
    return caught.value.reason


# --- secrets and signing -----------------------------------------------------------------


def test_new_secret_is_whsec_and_base64_of_32_fresh_random_bytes() -> None:
    first, second = new_secret(), new_secret()

    assert first.startswith("whsec_")
    assert len(base64.b64decode(first.removeprefix("whsec_"), validate=True)) == 32
    assert first != second


def test_service_signature_is_hex_hmac_of_t_dot_raw_body_keyed_with_the_secret_string() -> None:
    headers = sign_delivery(SECRET, BODY, timestamp=T, event_id="evt_1")

    expected = hmac_hex(SECRET, f"{T}.".encode() + BODY)
    assert headers[SIGNATURE_HEADER] == f"t={T},v1={expected}"
    assert set(headers) == {
        SIGNATURE_HEADER,
        "webhook-id",
        "webhook-timestamp",
        "webhook-signature",
    }
    assert headers["webhook-id"] == "evt_1"
    assert headers["webhook-timestamp"] == str(T)


def test_standard_webhooks_signature_matches_the_reference_suites_known_answer() -> None:
    # Vector from standard-webhooks/libraries/python/tests/test_webhooks.py::test_sign_function.
    headers = sign_delivery(
        SECRET,
        b'{"test": 2432232314}',
        timestamp=1614265330,
        event_id="msg_p5jXN8AQM9LWM0D4loKWxJek",
    )

    assert headers["webhook-signature"] == "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="


def test_standard_webhooks_verifier_accepts_a_delivery_signed_with_a_new_secret() -> None:
    secret = new_secret()
    headers = sign_delivery(secret, BODY, timestamp=T, event_id="evt_2")

    assert standard_webhooks_valid(secret, headers, BODY, now=T)
    assert not standard_webhooks_valid(new_secret(), headers, BODY, now=T)
    assert not standard_webhooks_valid(secret, headers, BODY + b" ", now=T)


@pytest.mark.parametrize(
    ("secret", "timestamp", "event_id"),
    [
        (SECRET, -1, "evt_1"),
        (SECRET, T, ""),
        (SECRET, T, "evt.1"),
        (SECRET, T, "evt 1"),
        ("plain-secret", T, "evt_1"),
        ("whsec_not base64!", T, "evt_1"),
    ],
)
def test_sign_delivery_refuses_bad_arguments(secret: str, timestamp: int, event_id: str) -> None:
    with pytest.raises(ValueError, match=r"timestamp|event_id|secret"):
        sign_delivery(secret, BODY, timestamp=timestamp, event_id=event_id)


# --- verification --------------------------------------------------------------------------


def test_verify_accepts_an_authentic_delivery_up_to_300_seconds_either_way() -> None:
    header = sign_delivery(SECRET, BODY, timestamp=T, event_id="evt_1")[SIGNATURE_HEADER]

    for now in (T, T - 300, T + 300):
        verify_delivery(BODY, header, SECRET, now=now)


def test_verify_defaults_to_the_current_time() -> None:
    fresh = sign_delivery(SECRET, BODY, timestamp=int(time.time()), event_id="evt_1")

    verify_delivery(BODY, fresh[SIGNATURE_HEADER], SECRET)
    stale = sign_delivery(SECRET, BODY, timestamp=int(time.time()) - 3600, event_id="evt_1")
    with pytest.raises(SignatureError):
        verify_delivery(BODY, stale[SIGNATURE_HEADER], SECRET)


@pytest.mark.parametrize("offset", [-301, 301, -86_400])
def test_verify_rejects_a_stale_or_future_timestamp(offset: int) -> None:
    header = sign_delivery(SECRET, BODY, timestamp=T, event_id="evt_1")[SIGNATURE_HEADER]

    assert signature_reason(BODY, header, SECRET, now=T - offset) == "timestamp_out_of_tolerance"


def test_verify_rejects_wrong_secret_tampered_body_and_moved_timestamp() -> None:
    header = sign_delivery(SECRET, BODY, timestamp=T, event_id="evt_1")[SIGNATURE_HEADER]
    moved = header.replace(f"t={T}", f"t={T + 1}")

    assert signature_reason(BODY, header, OTHER_SECRET) == "no_matching_signature"
    assert signature_reason(BODY.replace(b"7", b"8"), header, SECRET) == "no_matching_signature"
    assert signature_reason(BODY, moved, SECRET) == "no_matching_signature"


def test_verify_during_rotation_accepts_either_secret_and_either_v1_value() -> None:
    new_header = sign_delivery(OTHER_SECRET, BODY, timestamp=T, event_id="evt_1")[SIGNATURE_HEADER]
    both = f"{new_header},v1={hmac_hex(SECRET, f'{T}.'.encode() + BODY)}"

    verify_delivery(BODY, new_header, [SECRET, OTHER_SECRET], now=T)
    verify_delivery(BODY, both, SECRET, now=T)
    verify_delivery(BODY, both, [OTHER_SECRET], now=T)
    assert signature_reason(BODY, both, [new_secret(), new_secret()]) == "no_matching_signature"


def test_verify_ignores_unknown_schemes_beside_v1() -> None:
    header = sign_delivery(SECRET, BODY, timestamp=T, event_id="evt_1")[SIGNATURE_HEADER]

    verify_delivery(BODY, f"{header},v0=deadbeef, v2=anything", SECRET, now=T)


GOOD_V1 = hmac_hex(SECRET, f"{T}.".encode() + BODY)


@pytest.mark.parametrize(
    "header",
    [
        "",
        "garbage",
        f"v1={GOOD_V1}",
        f"t={T}",
        f"t={T},v0=abc",
        f"t=abc,v1={GOOD_V1}",
        f"t=-{T},v1={GOOD_V1}",
        f"t={T},t={T},v1={GOOD_V1}",
        f"t={T},v1={GOOD_V1.upper()}",
        f"t={T},v1={GOOD_V1[:-1]}",
        f"t={T},v1={GOOD_V1},,",
        f"t={T};v1={GOOD_V1}",
        f"t={T},v1=é{GOOD_V1[1:]}",
    ],
)
def test_verify_rejects_malformed_headers(header: str) -> None:
    assert signature_reason(BODY, header, SECRET) == "malformed"


def test_verify_refuses_to_run_without_a_secret_or_with_negative_tolerance() -> None:
    header = sign_delivery(SECRET, BODY, timestamp=T, event_id="evt_1")[SIGNATURE_HEADER]

    with pytest.raises(ValueError, match="secret"):
        verify_delivery(BODY, header, [], now=T)
    with pytest.raises(ValueError, match="tolerance"):
        verify_delivery(BODY, header, SECRET, tolerance=-1, now=T)


# --- envelope bytes --------------------------------------------------------------------------


def test_envelope_body_is_compact_ordered_json_with_ms_utc_time_and_6_decimal_amounts() -> None:
    created = datetime(2026, 11, 22, 11, 18, 0, 123_999, tzinfo=timezone(timedelta(hours=1)))
    data = {
        "payout_id": "po_1",
        "amount_flow": Decimal("1.5"),
        "fees": [Decimal("0"), Decimal("1E+3")],
        "sent_at": datetime(2026, 11, 22, 10, 0, tzinfo=UTC),
        "note": "café",
    }

    body = envelope_body("evt_1", "payout.sent", 42, created, data)

    assert body == (
        b'{"id":"evt_1","event":"payout.sent","user_id":42,"created_at":"2026-11-22T10:18:00.123Z",'
        b'"data":{"payout_id":"po_1","amount_flow":"1.500000","fees":["0.000000","1000.000000"],'
        b'"sent_at":"2026-11-22T10:00:00.000Z","note":"caf\\u00e9"}}'
    )
    assert json.loads(body)["data"]["note"] == "café"


@pytest.mark.parametrize(
    ("created_at", "data", "error"),
    [
        (datetime(2026, 1, 1), {}, ValueError),  # naive: its zone would be a guess
        (datetime(2026, 1, 1, tzinfo=UTC), {"amount": Decimal("0.0000001")}, ValueError),
        (datetime(2026, 1, 1, tzinfo=UTC), {"amount": Decimal("NaN")}, ValueError),
        (datetime(2026, 1, 1, tzinfo=UTC), {"ratio": float("inf")}, ValueError),
        (datetime(2026, 1, 1, tzinfo=UTC), {"raw": b"bytes"}, TypeError),
    ],
)
def test_envelope_body_refuses_values_it_cannot_send_faithfully(
    created_at: datetime, data: dict[str, object], error: type[Exception]
) -> None:
    with pytest.raises(error):
        envelope_body("evt_1", "payout.sent", 42, created_at, data)


# --- docs/webhooks-receiving.md ----------------------------------------------------------------


def doc_block(language: str, first_line_prefix: str) -> str:
    blocks = re.findall(rf"```{language}\n(.*?)```", DOC.read_text(), flags=re.DOTALL)
    matching = [block for block in blocks if block.startswith(first_line_prefix)]
    assert len(matching) == 1, f"expected one {language} block starting {first_line_prefix!r}"
    return str(matching[0])


def test_the_docs_sample_delivery_is_really_signed() -> None:
    request = doc_block("http", "POST ")
    head, _, body = request.partition("\n\n")
    headers = {
        name: value for name, _, value in (line.partition(": ") for line in head.splitlines()[1:])
    }
    raw_body = body.rstrip("\n").encode()

    verify_delivery(raw_body, headers[SIGNATURE_HEADER], SECRET, now=T)
    assert standard_webhooks_valid(SECRET, headers, raw_body, now=T)
    assert json.loads(raw_body)["id"] == headers["webhook-id"]


@pytest.fixture(
    params=["# receiver_with_flowsvc.py", "# receiver_stdlib.py"], ids=["flowsvc", "stdlib"]
)
def doc_receiver(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[int]:
    """Serve a documented receiver on loopback, knowing SECRET and OTHER_SECRET; yield its port."""
    script = tmp_path / "receiver.py"
    script.write_text(doc_block("python", request.param))
    monkeypatch.setenv("FLOWSVC_WEBHOOK_SECRETS", f"{SECRET} {OTHER_SECRET}")
    namespace = runpy.run_path(str(script))
    server = HTTPServer(("127.0.0.1", 0), namespace["Receiver"])
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    try:
        yield server.server_port
    finally:
        server.shutdown()
        thread.join()
        server.server_close()


def post(port: int, body: bytes, headers: Mapping[str, str]) -> int:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        connection.request("POST", "/hook", body=body, headers=dict(headers))
        return connection.getresponse().status
    finally:
        connection.close()


def test_documented_receiver_accepts_once_and_rejects_forgeries(
    doc_receiver: int, capsys: pytest.CaptureFixture[str]
) -> None:
    now = int(time.time())
    body = envelope_body("evt_9", "payout.sent", 7, datetime.now(UTC), {"amount": Decimal(2)})
    signed = sign_delivery(OTHER_SECRET, body, timestamp=now, event_id="evt_9")
    forged = sign_delivery(new_secret(), body, timestamp=now, event_id="evt_9")
    stale = sign_delivery(SECRET, body, timestamp=now - 301, event_id="evt_9")

    assert post(doc_receiver, body, signed) == 204
    assert post(doc_receiver, body, signed) == 204  # a redelivery is acknowledged...
    assert capsys.readouterr().out.count("received payout.sent") == 1  # ...but handled once
    assert post(doc_receiver, body, forged) == 400
    assert post(doc_receiver, body + b" ", signed) == 400
    assert post(doc_receiver, body, stale) == 400
    assert post(doc_receiver, body, {}) == 400
