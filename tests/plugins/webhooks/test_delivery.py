"""End-to-end delivery: a real service sends signed events to real receivers on loopback.

Signatures are recomputed here from the raw bytes received with ``hmac``, independently of
``plugins.webhooks.signing``; the receiver helper ``verify_delivery`` is checked on the same
bytes.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import re
from decimal import Decimal
from pathlib import Path

import pytest
import trio
from sqlalchemy import update

from plugins.webhooks.signing import SignatureError, verify_delivery
from plugins.webhooks.tables import subscriptions
from tests.support.events import emit_now
from tests.support.server import client, make_settings, running_server
from tests.support.webhook_receiver import Received, Reply, running_receiver
from tests.support.webhooks import signed_in, subscribe, wait_until_settled, webhook_env

ISO_MS = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")


def service_signature_valid(secret: str, request: Received) -> bool:
    """The spec's check, from the raw bytes: HMAC-SHA256 of "<t>.<body>", any v1 may match."""
    items = [item.partition("=") for item in request.headers["x-service-signature"].split(",")]
    timestamp = next(value for key, _, value in items if key == "t")
    expected = hmac.new(secret.encode(), timestamp.encode() + b"." + request.body,
                        hashlib.sha256).hexdigest()
    return any(key == "v1" and hmac.compare_digest(value, expected) for key, _, value in items)


def standard_signature_valid(secret: str, request: Received) -> bool:
    """Standard Webhooks 1.0, from its published algorithm."""
    key = base64.b64decode(secret.removeprefix("whsec_"))
    signed = (f"{request.headers['webhook-id']}.{request.headers['webhook-timestamp']}."
              .encode() + request.body)
    expected = hmac.new(key, signed, hashlib.sha256).digest()
    return any(hmac.compare_digest(base64.b64decode(value.partition(",")[2]), expected)
               for value in request.headers["webhook-signature"].split(" "))


def timestamp_of(request: Received) -> int:
    header = request.headers["x-service-signature"]
    return int(next(item[2:] for item in header.split(",") if item.startswith("t=")))


async def test_a_delivery_is_the_envelope_signed_over_the_exact_bytes_sent(
        tmp_path: Path, database_url: str) -> None:
    env = webhook_env(tmp_path / "var", database_url)
    async with running_receiver() as receiver, \
            running_server(make_settings(env), env) as running, client(running) as http:
        user_id = await signed_in(http)
        webhook = await subscribe(http, receiver.url(), ["payment.received"])
        event = await emit_now(running.service, user_id=user_id,
                                     name="payment.received",
                                     data={"provider": "card", "amount_usd": Decimal("20"),
                                           "amount_flow": Decimal("12.5")})
        [request] = await receiver.wait_for(1)

    secret = webhook["secret"]
    assert request.method == "POST" and request.path == "/hook"
    assert request.headers["content-type"] == "application/json"
    assert service_signature_valid(secret, request)
    assert standard_signature_valid(secret, request)
    assert not service_signature_valid(secret, Received(**{**request.__dict__,
                                                           "body": request.body + b" "}))
    envelope = json.loads(request.body)
    assert envelope == {"id": event.id, "event": "payment.received", "user_id": user_id,
                        "created_at": envelope["created_at"],
                        "data": {"provider": "card", "amount_usd": "20.000000",
                                 "amount_flow": "12.500000"}}
    assert ISO_MS.match(envelope["created_at"])
    assert request.headers["webhook-id"] == event.id
    assert request.headers["webhook-timestamp"] == str(timestamp_of(request))

    header = request.headers["x-service-signature"]
    t = timestamp_of(request)
    verify_delivery(request.body, header, secret, now=t + 300)  # the helper accepts it...
    with pytest.raises(SignatureError) as wrong:
        verify_delivery(request.body, header, "whsec_" + base64.b64encode(b"x" * 32).decode(),
                        now=t)
    assert wrong.value.reason == "no_matching_signature"  # ...not with another secret...
    with pytest.raises(SignatureError) as stale:
        verify_delivery(request.body, header, secret, now=t + 301)
    assert stale.value.reason == "timestamp_out_of_tolerance"  # ...nor 301 s later


async def test_a_receiver_failing_twice_gets_each_event_three_times_with_full_jitter_spacing(
        tmp_path: Path, database_url: str) -> None:
    base = 0.2
    env = webhook_env(tmp_path / "var", database_url, backoff_base_seconds=base)
    seen: dict[str, int] = {}

    def fail_twice(request: Received) -> Reply:
        event_id = request.headers["webhook-id"]
        seen[event_id] = seen.get(event_id, 0) + 1
        return Reply(500 if seen[event_id] <= 2 else 200)

    count = 12
    async with running_receiver(fail_twice) as receiver, \
            running_server(make_settings(env), env) as running, client(running) as http:
        user_id = await signed_in(http)
        webhook = await subscribe(http, receiver.url())
        for _ in range(count):
            await emit_now(running.service, user_id=user_id,
                                 name="flow.balance.low",
                                 data={"balance": "0.500000", "threshold": "1.000000"})
        await receiver.wait_for(3 * count)
        settled = await wait_until_settled(http, webhook["id"], count)
        listed = (await http.get("/me/webhooks")).json()["webhooks"]

    by_id: dict[str, list[Received]] = {}
    for request in receiver.received:
        by_id.setdefault(request.headers["webhook-id"], []).append(request)
    assert len(by_id) == count and all(len(got) == 3 for got in by_id.values())
    first_gaps, second_gaps = [], []
    for event_id, got in by_id.items():
        assert {json.loads(request.body)["id"] for request in got} == {event_id}
        assert len({request.body for request in got}) == 1  # the same bytes every time
        assert all(service_signature_valid(webhook["secret"], request) for request in got)
        first_gaps.append(got[1].at - got[0].at)
        second_gaps.append(got[2].at - got[1].at)
    # Settling, claiming and the HTTP round trip add to each wait; on a loaded shared machine
    # that has reached half a second (test_outbox checks the schedule itself exactly).
    slack = 0.6
    # Full jitter: retry n waits uniformly between 0 and 2 * base * 2**n...
    assert max(first_gaps) <= 2 * base + slack
    assert max(second_gaps) <= 4 * base + slack
    # ...so the waits differ from event to event, and the second retry can wait longer than
    # any first retry may (each of 12 draws misses that with probability 1/2: 1 in 4096).
    assert max(first_gaps) - min(first_gaps) > 0.02
    assert max(second_gaps) > 2 * base
    assert {item["state"] for item in settled} == {"delivered"}
    assert [[a["status_code"] for a in item["attempts"]] for item in settled] == \
        [[500, 500, 200]] * count
    assert [a["outcome"] for a in settled[0]["attempts"]] == ["retry", "retry", "delivered"]
    assert listed[0]["last_error"] is None


async def test_a_receiver_that_always_fails_gets_4_attempts_then_last_error(
        tmp_path: Path, database_url: str) -> None:
    env = webhook_env(tmp_path / "var", database_url)
    async with running_receiver(lambda request: Reply(503)) as receiver, \
            running_server(make_settings(env), env) as running, client(running) as http:
        user_id = await signed_in(http)
        webhook = await subscribe(http, receiver.url())
        event = await emit_now(running.service, user_id=user_id,
                                     name="payout.failed",
                                     data={"payout_id": "po_1", "amount_flow": "1.000000",
                                           "reason": "no route"})
        [delivery] = await wait_until_settled(http, webhook["id"], 1)
        await trio.sleep(0.3)  # a fifth attempt would have come by now
        [listed] = (await http.get("/me/webhooks")).json()["webhooks"]

    assert len(receiver.received) == 4
    assert {request.headers["webhook-id"] for request in receiver.received} == {event.id}
    assert len({timestamp_of(request) for request in receiver.received}) >= 1
    assert delivery["state"] == "failed"
    assert [a["outcome"] for a in delivery["attempts"]] == ["retry", "retry", "retry", "failed"]
    assert [a["error"] for a in delivery["attempts"]] == ["HTTP 503"] * 4
    assert listed["last_error"] == f"HTTP 503 (event {event.id}, attempt 4)"
    assert ISO_MS.match(listed["last_error_at"])
    assert "secret" not in listed


async def test_a_delivery_that_breaks_the_sender_fails_alone_and_the_dispatcher_goes_on(
        tmp_path: Path, database_url: str) -> None:
    env = webhook_env(tmp_path / "var", database_url)
    async with running_receiver() as receiver, \
            running_server(make_settings(env), env) as running, client(running) as http:
        user_id = await signed_in(http)
        broken = await subscribe(http, receiver.url("/broken"))
        healthy = await subscribe(http, receiver.url("/healthy"))
        await running.service.db.write(lambda connection: connection.execute(
            update(subscriptions).where(subscriptions.c.id == int(broken["id"]))
            .values(secret="not-a-whsec-secret")))  # a corrupt row: signing raises
        await emit_now(running.service, user_id=user_id, name="payout.sent", data={})
        [failed] = await wait_until_settled(http, broken["id"], 1)
        [delivered] = await wait_until_settled(http, healthy["id"], 1)
        await http.post(f"/me/webhooks/{healthy['id']}/test")
        await receiver.wait_for(2)

    assert [request.path for request in receiver.received] == ["/healthy", "/healthy"]
    assert failed["state"] == "failed"
    assert [a["error"] for a in failed["attempts"]] == ["internal error while sending"]
    assert delivered["state"] == "delivered"
    assert running.service.supervisor is not None
    assert not running.service.supervisor.gave_up.is_set()


async def test_a_hung_hosts_backlog_does_not_hold_back_another_hosts_new_delivery(
        tmp_path: Path, database_url: str) -> None:
    """One attempt at a time per host, the hung host's queue full (4) and more of its pings
    due: a ping to another host is claimed and sent at once, not after the hung attempt's
    30 s deadline (the claimer waited for half a queue of sends under any backlog)."""
    env = webhook_env(tmp_path / "var", database_url, per_host_concurrency=1,
                      timeout_seconds=30, lease_seconds=40,
                      allowed_hosts=["127.0.0.1", "localhost"])
    hung = trio.Event()
    async with running_receiver(lambda _request: Reply(204, hold=hung)) as slow, \
            running_receiver() as quick, \
            running_server(make_settings(env), env) as running, client(running) as http:
        await signed_in(http)
        slow_hook = await subscribe(http, slow.url())
        for _ in range(6):  # 4 claimed (the queue of one host), 2 left due: a backlog
            assert (await http.post(f"/me/webhooks/{slow_hook['id']}/test")).status_code == 202
        await slow.wait_for(1)
        quick_hook = await subscribe(http, f"http://localhost:{quick.port}/hook")
        assert (await http.post(f"/me/webhooks/{quick_hook['id']}/test")).status_code == 202
        await quick.wait_for(1, timeout=15)  # the hung attempt has 30 s left
        assert len(slow.received) == 1  # still hung: the quick one did not wait for it
        hung.set()
