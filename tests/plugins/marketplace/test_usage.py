"""Using published agents over real HTTP and SSE: runs billed per tool call to the caller's
key, the spend cap, premium agents, subscriptions to agents, and ratings."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import httpx

from plugins.marketplace.subscriptions import settle_due
from runtime.server import Running
from tests.support.keys import create_key
from tests.support.marketplace import marketplace_server, published_agent, signed_in
from tests.support.projects import BRIEF, GrantedFeatures
from tests.support.server import client
from tests.support.sse import SseEvent, open_sse

PRICES = {"write_file": "0.5", "git_commit": "1.25", "take_screenshot": "2"}
DEFAULT_PRICE = "0.1"
PER_CALL = {"model": "per_call", "defaultPerCallFlow": DEFAULT_PRICE}


def code(response: httpx.Response) -> str:
    return str(response.json()["error"]["code"])


@asynccontextmanager
async def key_client(running: Running, session: httpx.AsyncClient, **limits: Any
                     ) -> AsyncIterator[tuple[httpx.AsyncClient, str]]:
    """A client authenticating only with a new API key of the session's user; its id."""
    key = await create_key(session, **limits)
    async with client(running, headers={"x-api-key": key["raw_key"]}) as http:
        yield http, key["id"]


async def run_to_end(running: Running, http: httpx.AsyncClient, slug: str
                     ) -> tuple[str, list[SseEvent]]:
    """Start a run of ``slug`` on the brief and read its stream until ``done``."""
    started = await http.post(f"/agents/{slug}/runs", json={"brief": BRIEF})
    assert started.status_code == 201, started.text
    run_id = started.json()["runId"]
    assert started.json()["streamUrl"].endswith(f"/agent-runs/{run_id}/stream")
    headers = {name: http.headers[name] for name in ("x-api-key",) if name in http.headers}
    if "svc_session" in http.cookies:
        headers["Cookie"] = f"svc_session={http.cookies['svc_session']}"
    async with open_sse(running.base_url, f"/agent-runs/{run_id}/stream", headers) as stream:
        assert stream.status == 200
        events = await stream.until("done")
    return run_id, events


def price_of(tool: str) -> Decimal:
    return Decimal(PRICES.get(tool, DEFAULT_PRICE))


def flow(amount: Decimal) -> str:
    return f"{amount:.6f}"


async def key_spend(session: httpx.AsyncClient, key_id: str) -> str:
    [key] = [k for k in (await session.get("/me/api-keys")).json()["keys"] if k["id"] == key_id]
    return str(key["spend_period_used"])


async def test_a_run_charges_its_tool_prices_to_the_key_and_the_owner(
        tmp_path: Path, database_url: str) -> None:
    async with marketplace_server(tmp_path / "var", database_url) as running, \
            signed_in(running) as (owner, _), signed_in(running) as (caller, _), \
            signed_in(running) as (stranger, _), \
            key_client(running, caller) as (paying, key_id):
        slug = await published_agent(owner, PRICES, monetization=PER_CALL)
        by_session = await caller.post(f"/agents/{slug}/runs", json={"brief": BRIEF})
        assert by_session.status_code == 403 and code(by_session) == "api_key_required"
        not_yet = await caller.post(f"/agents/{slug}/ratings", json={"stars": 5})
        assert not_yet.status_code == 403 and code(not_yet) == "forbidden"

        run_id, events = await run_to_end(running, paying, slug)
        assert events[-1].json() == {"runId": run_id, "finalStatus": "completed"}
        calls = [event.json()["tool"] for event in events if event.event == "tool_call"]
        assert sorted(set(calls)) == ["git_commit", "take_screenshot", "write_file"]
        expected = flow(sum((price_of(tool) for tool in calls), Decimal(0)))
        assert expected == "7.750000"
        # Each call's result carries what it was charged: the stream adds up to the bill.
        results = [event.json() for event in events if event.event == "tool_result"]
        assert [Decimal(result["priceFlow"]) for result in results] == \
            [price_of(tool) for tool in calls]

        view = await paying.get(f"/agent-runs/{run_id}")
        assert view.status_code == 200
        prices = {item["tool"]: item["perCallFlow"] for item in view.json()["run"]["toolPrices"]}
        assert prices["write_file"] == "0.500000" and prices["list_files"] == "0.100000"
        assert view.json()["run"] | {"startedAt": None, "endedAt": None, "toolPrices": []} == {
            "runId": run_id, "agentSlug": slug, "toolCalls": len(calls), "toolPrices": [],
            "chargedFlow": expected, "status": "completed", "reason": None,
            "startedAt": None, "endedAt": None,
            "streamUrl": view.json()["run"]["streamUrl"]}
        assert view.headers["X-FLOW-Period-Used"] == expected
        assert view.headers["X-FLOW-Cost"] == "0.000000"
        assert await key_spend(caller, key_id) == expected
        earnings = (await owner.get("/me/earnings")).json()["earnings"]
        assert earnings == {"totalFlow": expected,
                            "byAgent": [{"slug": slug, "earnedFlow": expected}]}
        stats = (await stranger.get(f"/marketplace/agents/{slug}")).json()["agent"]["stats"]
        assert stats["runs"] == 1 and stats["earnedFlow"] == expected
        assert (await stranger.get(f"/agent-runs/{run_id}")).status_code == 404
        session = {"Cookie": f"svc_session={stranger.cookies['svc_session']}"}
        async with open_sse(running.base_url, f"/agent-runs/{run_id}/stream",
                            session) as stream:
            assert stream.status == 404

        rated = await caller.post(f"/agents/{slug}/ratings", json={"stars": 4})
        assert rated.status_code == 200
        assert rated.json()["stats"] == {"ratingAverage": 4.0, "ratingCount": 1}
        rerated = await paying.post(f"/agents/{slug}/ratings", json={"stars": 2})
        assert rerated.json()["stats"] == {"ratingAverage": 2.0, "ratingCount": 1}
        own = await owner.post(f"/agents/{slug}/ratings", json={"stars": 5})
        assert own.status_code == 403 and code(own) == "forbidden"
        too_many = await caller.post(f"/agents/{slug}/ratings", json={"stars": 6})
        assert too_many.status_code == 400 and code(too_many) == "invalid_request"
        missing = await caller.post("/agents/none-such/ratings", json={"stars": 3})
        assert missing.status_code == 404 and code(missing) == "agent_not_found"


async def test_a_run_stops_at_the_spend_cap_and_the_next_paid_call_gets_402(
        tmp_path: Path, database_url: str) -> None:
    async with marketplace_server(tmp_path / "var", database_url) as running, \
            signed_in(running) as (owner, _), signed_in(running) as (caller, _), \
            key_client(running, caller, spend_limit_flow="2.5") as (paying, key_id):
        slug = await published_agent(owner, PRICES, monetization=PER_CALL)
        run_id, events = await run_to_end(running, paying, slug)
        assert events[-1].json() == {"runId": run_id, "finalStatus": "failed"}
        [error] = [event.json() for event in events if event.event == "error"]
        assert "spend cap" in error["message"] and error["recoverable"] is False
        calls = [event.json()["tool"] for event in events if event.event == "tool_call"]
        # Charges are admitted while the period's spend is under the cap: 0.5, 0.5 and
        # 1.25 (2.25), then 0.5 crosses it (2.75); the fifth call is refused.
        assert calls == ["write_file", "write_file", "git_commit", "write_file"]
        charged = flow(sum((price_of(tool) for tool in calls), Decimal(0)))
        assert charged == "2.750000"
        assert await key_spend(caller, key_id) == charged
        assert (await owner.get("/me/earnings")).json()["earnings"]["totalFlow"] == charged
        view = (await caller.get(f"/agent-runs/{run_id}")).json()["run"]
        assert view["chargedFlow"] == charged and view["status"] == "failed"

        refused = await paying.post(f"/agents/{slug}/runs", json={"brief": BRIEF})
        assert refused.status_code == 402 and code(refused) == "spend_cap_reached"
        assert refused.headers["X-FLOW-Period-Limit"] == "2.500000"


async def test_premium_agents_need_the_feature(tmp_path: Path, database_url: str) -> None:
    async with marketplace_server(tmp_path / "var", database_url) as running, \
            signed_in(running) as (owner, _), signed_in(running) as (caller, caller_id):
        slug = await published_agent(owner, premium=True)
        refused = await caller.post(f"/agents/{slug}/runs", json={"brief": BRIEF})
        assert refused.status_code == 403 and code(refused) == "premium_required"
        own = await owner.post(f"/agents/{slug}/runs", json={"brief": BRIEF})
        assert own.status_code == 201  # owners use their agents freely
        stats = (await owner.get(f"/marketplace/agents/{slug}")).json()["agent"]["stats"]
        assert stats["runs"] == 0  # and their own runs do not count
        running.service.pm.register(GrantedFeatures({caller_id: {"premiumAgents": True}}),
                                    name="billing-stand-in")
        _, events = await run_to_end(running, caller, slug)  # free agent: no key needed
        assert events[-1].json()["finalStatus"] == "completed"
        stats = (await owner.get(f"/marketplace/agents/{slug}")).json()["agent"]["stats"]
        assert stats["runs"] == 1


async def test_subscriptions_survive_unpublishing_until_their_period_ends(
        tmp_path: Path, database_url: str) -> None:
    async with marketplace_server(tmp_path / "var", database_url) as running, \
            signed_in(running) as (owner, _), signed_in(running) as (caller, _), \
            signed_in(running) as (stranger, _), \
            key_client(running, caller) as (paying, key_id), \
            key_client(running, stranger, spend_limit_flow="3") as (other_key, _):
        monthly = {"model": "subscription", "priceFlow": "3", "periodDays": 30}
        hidden = await published_agent(owner, PRICES, monetization=monthly, name="Hidden Later")
        kept = await published_agent(owner, monetization=monthly, name="Kept Listed")
        per_call = await published_agent(owner, monetization=PER_CALL, name="Per Call")

        unsubscribed = await paying.post(f"/agents/{hidden}/runs", json={"brief": BRIEF})
        assert unsubscribed.status_code == 403 and code(unsubscribed) == "subscription_required"
        by_session = await caller.post(f"/agents/{hidden}/subscribe")
        assert by_session.status_code == 403 and code(by_session) == "api_key_required"
        wrong_model = await paying.post(f"/agents/{per_call}/subscribe")
        assert wrong_model.status_code == 409 and code(wrong_model) == "conflict"
        subscribed = await paying.post(f"/agents/{hidden}/subscribe")
        assert subscribed.status_code == 201, subscribed.text
        subscription = subscribed.json()["subscription"]
        assert subscription["status"] == "active" and subscription["renew"] is True
        assert subscription["priceFlow"] == "3.000000" and subscription["periodDays"] == 30
        period_end = datetime.fromisoformat(subscription["periodEnd"].replace("Z", "+00:00"))
        start = datetime.fromisoformat(subscription["periodStart"].replace("Z", "+00:00"))
        assert period_end - start == timedelta(days=30)
        twice = await paying.post(f"/agents/{hidden}/subscribe")
        assert twice.status_code == 409 and code(twice) == "conflict"
        kept_first = await paying.post(f"/agents/{kept}/subscribe")
        assert kept_first.status_code == 201
        cancelled = await paying.post(f"/agents/{kept}/subscription/cancel")
        assert cancelled.json()["subscription"]["renew"] is False
        resumed = await paying.post(f"/agents/{kept}/subscribe")  # back on, nothing charged
        assert resumed.status_code == 200 and resumed.json()["subscription"]["renew"] is True
        assert await key_spend(caller, key_id) == "6.000000"

        _, events = await run_to_end(running, paying, hidden)  # calls are covered
        assert events[-1].json()["finalStatus"] == "completed"
        assert await key_spend(caller, key_id) == "6.000000"

        assert (await owner.post(f"/agents/{hidden}/unpublish")).status_code == 200
        assert (await stranger.get(f"/marketplace/agents/{hidden}")).status_code == 404
        gone = await other_key.post(f"/agents/{hidden}/runs", json={"brief": BRIEF})
        assert gone.status_code == 404 and code(gone) == "agent_not_found"
        no_new = await other_key.post(f"/agents/{hidden}/subscribe")
        assert no_new.status_code == 404 and code(no_new) == "agent_not_found"
        _, events = await run_to_end(running, paying, hidden)  # the period goes on
        assert events[-1].json()["finalStatus"] == "completed"
        # The stranger's key can pay one period of "kept", not a renewal.
        assert (await other_key.post(f"/agents/{kept}/subscribe")).status_code == 201

        # The period ends: the subscription to the unpublished agent ends, unrenewed and
        # uncharged; the one to the agent still listed is renewed and charged again, unless
        # the key cannot pay.
        report = await settle_due(running.service, period_end + timedelta(minutes=1))
        assert report == {"renewed": 1, "ended": 2}
        [theirs] = (await stranger.get("/me/agent-subscriptions")).json()["subscriptions"]
        assert theirs["status"] == "ended" and theirs["endReason"] == "payment_failed"
        mine = {item["agentSlug"]: item for item in
                (await caller.get("/me/agent-subscriptions")).json()["subscriptions"]}
        assert mine[hidden]["status"] == "ended"
        assert mine[hidden]["endReason"] == "agent_unpublished"
        assert mine[hidden]["endedAt"] == subscription["periodEnd"]
        assert mine[kept]["status"] == "active"
        assert mine[kept]["periodStart"] == kept_first.json()["subscription"]["periodEnd"]
        assert await key_spend(caller, key_id) == "9.000000"
        assert (await owner.get("/me/earnings")).json()["earnings"]["totalFlow"] == "12.000000"
        ended = await paying.post(f"/agents/{hidden}/runs", json={"brief": BRIEF})
        assert ended.status_code == 404 and code(ended) == "agent_not_found"
        assert await settle_due(running.service, period_end + timedelta(minutes=2)) == {
            "renewed": 0, "ended": 0}
        not_mine = await stranger.post(f"/agents/{kept}/subscription/cancel")
        assert not_mine.status_code == 404 and code(not_mine) == "not_found"
