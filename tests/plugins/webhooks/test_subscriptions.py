"""The /me/webhooks routes: subscriptions, the catalogue, pings, history, redelivery, recovery."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import trio
from sqlalchemy import Connection, func, select

from plugins.webhooks.signing import verify_delivery
from plugins.webhooks.tables import events, subscriptions
from runtime.idempotency import idempotency_keys
from runtime.principal import SESSION_COOKIE
from runtime.wire import iso
from tests.support.backends import another_database
from tests.support.events import emit_now
from tests.support.server import client, make_settings, running_server
from tests.support.wallet import sign_in
from tests.support.webhook_receiver import Received, Reply, running_receiver
from tests.support.webhooks import deliveries, signed_in, subscribe, wait_until_settled, webhook_env

SPEC_EVENTS_OF_BILLING_AND_CHAIN = {"payment.received", "subscription.granted", "payout.sent",
                                    "payout.failed", "flow.balance.low"}


async def test_subscriptions_are_created_listed_read_and_deleted_by_their_owner_only(
        tmp_path: Path, database_url: str) -> None:
    env = webhook_env(tmp_path / "var", database_url, max_subscriptions=2)
    async with running_server(make_settings(env), env) as running, \
            client(running) as http, client(running) as other, client(running) as anonymous:
        await sign_in(http)
        await sign_in(other)
        created = await http.post("/me/webhooks", json={
            "url": "http://127.0.0.1:9/a", "events": ["payout.sent", "payout.sent"]})
        second = await http.post("/me/webhooks", json={"url": "http://127.0.0.1:9/b",
                                                       "events": []})
        third = await http.post("/me/webhooks", json={"url": "http://127.0.0.1:9/c",
                                                      "events": []})
        unknown = await http.post("/me/webhooks", json={"url": "http://127.0.0.1:9/d",
                                                        "events": ["payout.sent", "nope.x"]})
        missing_events = await http.post("/me/webhooks", json={"url": "http://127.0.0.1:9/e"})
        webhook = created.json()["webhook"]
        listed = await http.get("/me/webhooks")
        one = await http.get(f"/me/webhooks/{webhook['id']}")
        foreign = [await other.get(f"/me/webhooks/{webhook['id']}"),
                   await other.delete(f"/me/webhooks/{webhook['id']}"),
                   await other.post(f"/me/webhooks/{webhook['id']}/test"),
                   await other.get(f"/me/webhooks/{webhook['id']}/deliveries")]
        other_list = await other.get("/me/webhooks")
        unauthenticated = [await anonymous.get("/me/webhooks"),
                           await anonymous.get("/me/webhooks/events"),
                           await anonymous.post("/me/webhooks", json={"url": "x", "events": []})]
        deleted = await http.delete(f"/me/webhooks/{webhook['id']}")
        after = [await http.get(f"/me/webhooks/{webhook['id']}"),
                 await http.delete(f"/me/webhooks/{webhook['id']}")]
        remaining = await http.get("/me/webhooks")

    assert created.status_code == 201
    assert webhook["secret"].startswith("whsec_") and webhook["events"] == ["payout.sent"]
    assert second.json()["webhook"]["secret"] != webhook["secret"]
    assert third.status_code == 409 and third.json()["error"]["code"] == "webhook_limit_reached"
    assert unknown.status_code == 400
    assert unknown.json()["error"]["code"] == "event_unknown"
    assert unknown.json()["error"]["details"] == [
        {"field": "events", "message": "unknown event 'nope.x'"}]
    assert missing_events.status_code == 400
    assert missing_events.json()["error"]["code"] == "invalid_request"
    assert listed.status_code == 200
    assert [item["id"] for item in listed.json()["webhooks"]] == \
        [webhook["id"], second.json()["webhook"]["id"]]
    assert all("secret" not in item for item in listed.json()["webhooks"])
    assert listed.json()["webhooks"][0] == {
        "id": webhook["id"], "url": "http://127.0.0.1:9/a", "events": ["payout.sent"],
        "created_at": webhook["created_at"], "last_error": None, "last_error_at": None}
    assert one.json() == {"webhook": listed.json()["webhooks"][0]}
    assert [r.status_code for r in foreign] == [404] * 4
    assert other_list.json() == {"webhooks": []}
    assert [r.status_code for r in unauthenticated] == [401] * 3
    assert deleted.status_code == 204 and deleted.content == b""
    assert [r.status_code for r in after] == [404, 404]
    assert [item["id"] for item in remaining.json()["webhooks"]] == \
        [second.json()["webhook"]["id"]]


async def test_the_catalogue_lists_what_the_enabled_plugins_declare(
        tmp_path: Path, database_url: str) -> None:
    env = webhook_env(tmp_path / "var", database_url)
    async with running_server(make_settings(env), env) as running, client(running) as http:
        await sign_in(http)
        catalogue = (await http.get("/me/webhooks/events")).json()["events"]
        token = http.cookies[SESSION_COOKIE]
        async with client(running, headers={"Authorization": f"Bearer {token}"}) as bearer:
            bearer_list = await bearer.get("/me/webhooks")
            bearer_created = await bearer.post("/me/webhooks", json={
                "url": "http://127.0.0.1:9/", "events": ["flow.balance.low"]})
    # A database of its own: the first service's chain branch is not enabled here.
    with another_database(tmp_path, database_url) as bare_url:
        only_webhooks = webhook_env(tmp_path / "var2", bare_url, plugins=["auth", "webhooks"])
        async with running_server(make_settings(only_webhooks), only_webhooks) as running, \
                client(running) as http:
            await sign_in(http)
            bare = (await http.get("/me/webhooks/events")).json()["events"]
            refused = await http.post("/me/webhooks", json={"url": "http://127.0.0.1:9/",
                                                            "events": ["payout.sent"]})

    names = [item["name"] for item in catalogue]
    assert SPEC_EVENTS_OF_BILLING_AND_CHAIN <= set(names) and names == sorted(names)
    assert all(set(item) == {"name", "description"} and item["description"]
               for item in catalogue)
    assert bearer_list.json() == {"webhooks": []}
    assert bearer_created.status_code == 201
    assert not SPEC_EVENTS_OF_BILLING_AND_CHAIN & {item["name"] for item in bare}
    assert refused.status_code == 400 and refused.json()["error"]["code"] == "event_unknown"


async def test_the_test_ping_is_delivered_and_signed_like_any_event_whatever_the_filter(
        tmp_path: Path, database_url: str) -> None:
    env = webhook_env(tmp_path / "var", database_url)
    async with running_receiver() as receiver, \
            running_server(make_settings(env), env) as running, client(running) as http:
        user_id = await signed_in(http)
        webhook = await subscribe(http, receiver.url(), ["payout.sent"])
        answer = await http.post(f"/me/webhooks/{webhook['id']}/test")
        [request] = await receiver.wait_for(1)
        [delivery] = await wait_until_settled(http, webhook["id"], 1)

    assert answer.status_code == 202
    queued = answer.json()["delivery"]
    assert queued["event"] == "webhook.ping" and queued["state"] == "pending"
    envelope = json.loads(request.body)
    assert envelope["id"] == queued["event_id"] == request.headers["webhook-id"]
    assert envelope["event"] == "webhook.ping" and envelope["user_id"] == user_id
    assert envelope["data"] == {"webhook_id": webhook["id"], "message": "test ping from flowsvc"}
    verify_delivery(request.body, request.headers["x-service-signature"], webhook["secret"])
    assert delivery["state"] == "delivered"
    assert delivery["attempts"][0]["status_code"] == 204
    assert delivery["attempts"][0]["duration_ms"] >= 0


async def test_a_rotated_secret_signs_beside_the_old_one_during_the_overlap(
        tmp_path: Path, database_url: str) -> None:
    env = webhook_env(tmp_path / "var", database_url)
    async with running_receiver() as receiver, \
            running_server(make_settings(env), env) as running, client(running) as http:
        await sign_in(http)
        webhook = await subscribe(http, receiver.url())
        rotated = await http.post(f"/me/webhooks/{webhook['id']}/rotate-secret")
        await http.post(f"/me/webhooks/{webhook['id']}/test")
        [request] = await receiver.wait_for(1)
        listed = (await http.get("/me/webhooks")).json()["webhooks"]

    new_secret = rotated.json()["webhook"]["secret"]
    assert rotated.status_code == 200 and new_secret != webhook["secret"]
    assert "secret" not in listed[0]
    header = request.headers["x-service-signature"]
    assert header.count("v1=") == 2 and request.headers["webhook-signature"].count("v1,") == 2
    verify_delivery(request.body, header, new_secret)
    verify_delivery(request.body, header, webhook["secret"])


async def test_a_repeated_creation_or_rotation_replays_the_webhook_without_its_secret(
        tmp_path: Path, database_url: str) -> None:
    env = webhook_env(tmp_path / "var", database_url)
    body = {"url": "http://127.0.0.1:9/once", "events": []}
    async with running_server(make_settings(env), env) as running, client(running) as http:
        await sign_in(http)
        created, created_again = [await http.post(
            "/me/webhooks", json=body, headers={"Idempotency-Key": "create-once"})
            for _ in range(2)]
        rotate = f"/me/webhooks/{created.json()['webhook']['id']}/rotate-secret"
        rotated, rotated_again = [await http.post(rotate, headers={"Idempotency-Key": "rotate"})
                                  for _ in range(2)]
        missing = [await http.post("/me/webhooks/999999/rotate-secret",
                                   headers={"Idempotency-Key": "rotate-missing"})
                   for _ in range(2)]
        listed = (await http.get("/me/webhooks")).json()["webhooks"]

        def read_back(connection: Connection) -> tuple[list[bytes], str]:
            stored = connection.execute(select(idempotency_keys.c.body)).scalars().all()
            secret = connection.execute(select(subscriptions.c.secret)).scalar_one()
            return [bytes(item) for item in stored], secret

        stored, current_secret = await running.service.db.read(read_back)

    secrets = [created.json()["webhook"]["secret"], rotated.json()["webhook"]["secret"]]
    assert created.status_code == created_again.status_code == 201
    assert rotated.status_code == rotated_again.status_code == 200
    for first, again in ((created, created_again), (rotated, rotated_again)):
        assert again.headers["Idempotent-Replayed"] == "true"
        assert "secret" not in again.json()["webhook"] and "whsec_" not in again.text
        assert again.json() == {"webhook": {
            name: value for name, value in first.json()["webhook"].items() if name != "secret"}}
    assert [item["id"] for item in listed] == [created.json()["webhook"]["id"]]
    assert current_secret == secrets[1]  # the replay rotated nothing
    assert [answer.status_code for answer in missing] == [404, 404]
    assert missing[1].headers["Idempotent-Replayed"] == "true"
    assert len(stored) == 3 and all(b"whsec_" not in item for item in stored)
    assert not any(secret.encode() in item for item in stored for secret in secrets)


async def test_history_pages_and_redelivery_and_recovery_resend_failed_events(
        tmp_path: Path, database_url: str) -> None:
    env = webhook_env(tmp_path / "var", database_url, max_retries=0)
    healthy = False
    release = trio.Event()  # holds the first answer after the fix, to see it pending

    def until_fixed(request: Received) -> Reply:
        return Reply(204, hold=release) if healthy else Reply(500)

    async with running_receiver(until_fixed) as receiver, \
            running_server(make_settings(env), env) as running, client(running) as http:
        user_id = await signed_in(http)
        webhook = await subscribe(http, receiver.url())
        before = datetime.now(UTC) - timedelta(seconds=1)
        emitted = [await emit_now(running.service, user_id=user_id,
                                        name="subscription.granted",
                                        data={"tier": "pro", "amount_flow": "0.000000"})
                   for _ in range(3)]
        await wait_until_settled(http, webhook["id"], 3)
        first_page = await http.get(f"/me/webhooks/{webhook['id']}/deliveries",
                                    params={"limit": 2})
        second_page = await http.get(f"/me/webhooks/{webhook['id']}/deliveries",
                                     params={"limit": 2,
                                             "cursor": first_page.json()["nextCursor"]})
        failed_only = await http.get(f"/me/webhooks/{webhook['id']}/deliveries",
                                     params={"state": "failed", "limit": 500})
        bad_cursor = await http.get(f"/me/webhooks/{webhook['id']}/deliveries",
                                    params={"cursor": "abc"})
        healthy = True
        base = f"/me/webhooks/{webhook['id']}"
        redelivered = await http.post(f"{base}/deliveries/{emitted[0].id}/redeliver")
        again_while_pending = await http.post(f"{base}/deliveries/{emitted[0].id}/redeliver")
        unknown_event = await http.post(f"{base}/deliveries/evt_nope/redeliver")
        await receiver.wait_for(4)
        release.set()
        recovered = await http.post(f"{base}/recover", json={"since": iso(before)})
        backwards = await http.post(f"{base}/recover", json={
            "since": iso(before), "until": iso(before - timedelta(seconds=1))})
        naive = await http.post(f"{base}/recover", json={"since": "2026-01-01T00:00:00"})
        unix = await http.post(f"{base}/recover", json={"since": 1_700_000_000})  # not a time
        await receiver.wait_for(6)
        final = await wait_until_settled(http, webhook["id"], 3)
        nothing_left = await http.post(f"{base}/recover", json={"since": iso(before)})

    pages = first_page.json()["deliveries"] + second_page.json()["deliveries"]
    assert [item["event_id"] for item in pages] == [event.id for event in reversed(emitted)]
    assert second_page.json()["nextCursor"] is None
    assert len(failed_only.json()["deliveries"]) == 3
    assert bad_cursor.status_code == 400
    assert redelivered.status_code == 202
    assert redelivered.json()["delivery"]["state"] == "pending"
    assert again_while_pending.status_code == 409
    assert again_while_pending.json()["error"]["code"] == "delivery_pending"
    assert unknown_event.status_code == 404
    assert recovered.status_code == 202 and recovered.json() == {"recovered": 2}
    assert backwards.status_code == 400 and naive.status_code == 400
    assert unix.status_code == 400 and unix.json()["error"]["details"][0]["field"] == "since"
    assert nothing_left.json() == {"recovered": 0}
    assert {item["state"] for item in final} == {"delivered"}
    ids = [request.headers["webhook-id"] for request in receiver.received]
    assert sorted(ids) == sorted([event.id for event in emitted] * 2)
    redelivered_history = next(item for item in final if item["event_id"] == emitted[0].id)
    assert [a["outcome"] for a in redelivered_history["attempts"]] == ["failed", "delivered"]
    assert [a["attempt"] for a in redelivered_history["attempts"]] == [1, 2]


async def test_history_filters_by_event_type_on_the_server_and_pages_within_it(
        tmp_path: Path, database_url: str) -> None:
    env = webhook_env(tmp_path / "var", database_url)
    async with running_receiver() as receiver, \
            running_server(make_settings(env), env) as running, client(running) as http:
        user_id = await signed_in(http)
        webhook = await subscribe(http, receiver.url())
        pings = []
        for _ in range(2):
            pings.append((await http.post(f"/me/webhooks/{webhook['id']}/test"))
                         .json()["delivery"]["event_id"])
            await emit_now(running.service, user_id=user_id, name="subscription.granted",
                           data={"tier": "pro", "amount_flow": "0.000000"})
        await wait_until_settled(http, webhook["id"], 4)
        listing = f"/me/webhooks/{webhook['id']}/deliveries"
        first = await http.get(listing, params={"event": "webhook.ping", "limit": 1})
        second = await http.get(listing, params={"event": "webhook.ping", "limit": 1,
                                                 "cursor": first.json()["nextCursor"]})
        granted = await http.get(listing, params={"event": "subscription.granted",
                                                  "state": "delivered"})
        unknown = await http.get(listing, params={"event": "no.such.event"})
        refused = [await http.get(listing, params={"event": value}) for value in ("", "e" * 129)]

    assert first.status_code == 200, first.text
    assert [item["event_id"] for item in first.json()["deliveries"]
            + second.json()["deliveries"]] == list(reversed(pings))
    assert second.json()["nextCursor"] is None
    assert [item["event"] for item in granted.json()["deliveries"]] == ["subscription.granted"] * 2
    assert unknown.json() == {"deliveries": [], "nextCursor": None}
    assert [answer.status_code for answer in refused] == [400, 400]
    assert refused[0].json()["error"]["code"] == "invalid_request"


async def test_deleting_a_subscription_stops_its_pending_deliveries(
        tmp_path: Path, database_url: str) -> None:
    env = webhook_env(tmp_path / "var", database_url, backoff_base_seconds=0.1)
    release = trio.Event()  # the first attempt is answered (500) only after the delete
    async with running_receiver(lambda request: Reply(500, hold=release)) as receiver, \
            running_server(make_settings(env), env) as running, client(running) as http:
        user_id = await signed_in(http)
        webhook = await subscribe(http, receiver.url())
        await emit_now(running.service, user_id=user_id, name="payout.sent",
                             data={"payout_id": "po_2", "amount_flow": "3.000000",
                                   "tx_hash": "0x" + "ab" * 32})
        await receiver.wait_for(1)
        deleted = await http.delete(f"/me/webhooks/{webhook['id']}")
        release.set()
        # Had the failure been settled, every retry would come within
        # 2 * 0.1 * (1 + 2 + 4) = 1.4 s.
        await trio.sleep(1.5)
        history = await http.get(f"/me/webhooks/{webhook['id']}/deliveries")
        metrics = (await http.get("/metrics")).text

    assert deleted.status_code == 204
    assert len(receiver.received) == 1
    assert history.status_code == 404
    assert 'flowsvc_webhook_attempts_total{outcome="stale"} 1.0' in metrics


async def test_emitting_for_a_user_without_subscriptions_writes_nothing(
        tmp_path: Path, database_url: str) -> None:
    env = webhook_env(tmp_path / "var", database_url)
    async with running_receiver() as receiver, \
            running_server(make_settings(env), env) as running, client(running) as http:
        user_id = await signed_in(http)
        webhook = await subscribe(http, receiver.url(), ["payout.sent"])
        await emit_now(running.service, user_id=user_id, name="payout.failed",
                             data={"payout_id": "po_3", "amount_flow": "1.000000",
                                   "reason": "x"})
        await emit_now(running.service, user_id=user_id + 1000,
                             name="payout.sent", data={})
        await trio.sleep(0.3)
        history = await deliveries(http, webhook["id"])
        stored = await running.service.db.read(
            lambda connection: connection.execute(
                select(func.count()).select_from(events)).scalar_one())

    assert receiver.received == [] and history == [] and stored == 0


async def test_every_route_works_with_an_api_key_alone(tmp_path: Path, database_url: str) -> None:
    env = webhook_env(tmp_path / "var", database_url,
                      plugins=["auth", "keys", "webhooks", "billing", "chain"])
    async with running_receiver() as receiver, \
            running_server(make_settings(env), env) as running, client(running) as session:
        await signed_in(session)
        created_key = await session.post("/me/api-keys", json={"name": "ci"})
        raw_key = created_key.json()["key"]["raw_key"]
        async with client(running, headers={"x-api-key": raw_key}) as http, \
                client(running, headers={"x-api-key": raw_key + "x"}) as wrong:
            webhook = await subscribe(http, receiver.url())
            base = f"/me/webhooks/{webhook['id']}"
            answers = {
                "list": await http.get("/me/webhooks"),
                "events": await http.get("/me/webhooks/events"),
                "get": await http.get(base),
                "test": await http.post(f"{base}/test"),
                "rotate": await http.post(f"{base}/rotate-secret"),
            }
            await receiver.wait_for(1)
            await wait_until_settled(http, webhook["id"], 1)
            event_id = answers["test"].json()["delivery"]["event_id"]
            answers["deliveries"] = await http.get(f"{base}/deliveries")
            answers["redeliver"] = await http.post(f"{base}/deliveries/{event_id}/redeliver")
            answers["recover"] = await http.post(f"{base}/recover",
                                                 json={"since": "2026-01-01T00:00:00Z"})
            answers["delete"] = await http.delete(base)
            refused = await wrong.get("/me/webhooks")

    assert {name: answer.status_code for name, answer in answers.items()} == {
        "list": 200, "events": 200, "get": 200, "test": 202, "rotate": 200, "deliveries": 200,
        "redeliver": 202, "recover": 202, "delete": 204}
    assert refused.status_code == 401
