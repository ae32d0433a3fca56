"""Two hosts behind HAProxy on a Redis Cluster behave as one service.

The topology (tests/support/topology.py) is started once for the module: a 3-master Redis
Cluster with a replica each, two hosts of two ``flowsvc serve`` workers each (127.0.0.2 and
127.0.0.3, each with its own var directory and workspace root), HAProxy in front with the
configuration docs/ ships, an anvil chain, and the fakes of a payment gateway and a model.
The tests run in this order; the last one kills a host.
"""

from __future__ import annotations

import json
import secrets
from collections import Counter
from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import Any

import h11
import httpx
import pytest
import trio

from plugins.billing.subscriptions import GRACE_RETRIES
from runtime.wire import iso
from tests.support.billing import DAY, INTERNAL, subscription, until_subscription
from tests.support.fake_openai import Gated, StreamedTurn
from tests.support.fake_provider import deliver
from tests.support.keys import create_key
from tests.support.projects import assert_well_formed, eventually, new_project
from tests.support.sse import SseEvent, open_sse
from tests.support.tokens import add_token
from tests.support.topology import (
    WORKERS_PER_HOST,
    Topology,
    process_of,
    readiness,
    running_topology,
)
from tests.support.wallet import sign_in
from tests.support.webhook_receiver import running_receiver
from tests.support.webhooks import subscribe

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def topology(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Topology]:
    with running_topology(tmp_path_factory.mktemp("topology")) as running:
        yield running


async def _statuses(urls: list[str], raw_key: str, path: str, count: int) -> list[int]:
    """``count`` concurrent requests with the key, spread over ``urls``."""
    statuses: list[int] = []
    limits = httpx.Limits(max_connections=count)
    async with httpx.AsyncClient(headers={"x-api-key": raw_key}, limits=limits,
                                 timeout=60) as caller:
        async def one(n: int) -> None:
            statuses.append((await caller.get(urls[n % len(urls)] + path)).status_code)

        async with trio.open_nursery() as nursery:
            for n in range(count):
                nursery.start_soon(one, n)
    return statuses


def _entry_points(topology: Topology) -> list[str]:
    """HAProxy and each host directly: the requests of a load reach all four workers."""
    return [topology.url, *(host.url for host in topology.hosts)]


async def test_one_chain_indexer_leader_across_hosts(topology: Topology) -> None:
    # Each host's workers share its listening socket: ask on new connections until every
    # worker of both hosts has answered, and see that one of the four leads the chain.
    states: dict[str, str] = {}
    served_by: dict[str, str] = {}

    async def all_answered() -> bool:
        for host in topology.hosts:
            ready = await trio.to_thread.run_sync(readiness, host.url)
            [chain] = ready["checks"]["chain_indexers"]["chains"].values()
            states[process_of(ready)] = chain["state"]
            served_by[process_of(ready)] = host.name
        return len(states) == len(topology.hosts) * WORKERS_PER_HOST

    await eventually(all_answered, timeout=60)
    assert sorted(states.values()) == ["indexing", "standby", "standby", "standby"], states
    assert Counter(served_by.values()) == {host.name: WORKERS_PER_HOST
                                           for host in topology.hosts}


async def _user_key(url: str, **fields: Any) -> dict[str, Any]:
    """A new user's key, with ``user_id``."""
    async with httpx.AsyncClient(base_url=url, timeout=30) as http:
        _, user = await sign_in(http)
        return {**await create_key(http, **fields), "user_id": user["id"]}


async def test_a_key_cap_is_exact_across_four_processes_on_two_hosts(
        topology: Topology) -> None:
    # Two owners at once: their meter keys are in two slots, so batches are cut per slot.
    first = await _user_key(topology.url, rate_limit_rpm=50)
    second = await _user_key(topology.url, rate_limit_rpm=20)
    urls = _entry_points(topology)
    results: dict[str, list[int]] = {}

    async def load(name: str, key: dict[str, Any], count: int) -> None:
        results[name] = await _statuses(urls, key["raw_key"], "/healthz", count)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(load, "first", first, 200)
        nursery.start_soon(load, "second", second, 80)
    assert (results["first"].count(200), results["first"].count(429)) == (50, 150)
    assert (results["second"].count(200), results["second"].count(429)) == (20, 60)
    topology.assert_hosts_running()


async def test_spend_cap_overruns_by_less_than_one_request(topology: Topology) -> None:
    async with httpx.AsyncClient(base_url=topology.url, timeout=30) as http:
        await sign_in(http)
        key = await create_key(http, spend_limit_flow="1")
        statuses = await _statuses(_entry_points(topology), key["raw_key"], "/me", 40)
        # 0.4 a request: the third crosses the cap of 1 and is served, none after it.
        assert (statuses.count(200), statuses.count(402)) == (3, 37)
        [listed] = (await http.get("/me/api-keys")).json()["keys"]
        assert listed["spend_period_used"] == "1.200000"


def _later(text: str, days: float) -> str:
    return iso(datetime.fromisoformat(text.replace("Z", "+00:00")) + timedelta(days=days))


BILLING_EVENTS = ["payment.received", "subscription.granted", "subscription.grace",
                  "subscription.canceled", "subscription.ended"]


async def test_billing_renews_retries_and_lapses_once_and_each_webhook_once(
        topology: Topology) -> None:
    """Two subscribers renew, two others' cards are declined: a renewal, then a retry a day,
    then the lapse; each done by one of the four workers, each event delivered once."""
    gateway = topology.fakes.gateway
    users: list[tuple[httpx.AsyncClient, str, str]] = []  # (client, customer, renewsAt)
    async with running_receiver() as receiver:
        for _ in range(4):
            http = httpx.AsyncClient(base_url=topology.url, timeout=30)
            await sign_in(http)
            await subscribe(http, receiver.url(), BILLING_EVENTS)
            started = await http.post("/subscriptions/checkout",
                                      json={"tier": "plus", "provider": "gateway"})
            assert started.status_code == 201, started.text
            customer = f"cus_{secrets.token_hex(6)}"
            body, headers = gateway.signed_event(
                gateway.session_of_url(started.json()["checkoutUrl"]), customer=customer)
            paid = await deliver(f"{topology.url}/billing/webhooks/gateway", body, headers)
            assert paid.json()["outcome"] == "granted", paid.text
            users.append((http, customer, (await subscription(http))["renewsAt"]))
        renewing, declined = users[:2], users[2:]
        gateway.declining.update(customer for _, customer, _ in declined)
        try:
            await _advance(topology, 30 * DAY + 60)
            for http, _, renews_at in renewing:
                await until_subscription(http, periodStart=renews_at, status="active")
            for day in range(1, GRACE_RETRIES + 1):
                for http, _, renews_at in declined:
                    await until_subscription(http, status="grace",
                                             renewsAt=_later(renews_at, day))
                await _advance(topology, DAY)
            for http, _, _ in declined:
                await until_subscription(http, status="canceled", tier="none", timeout=30)
            # checkout + renewal for each renewing user; grace, canceled and ended for each
            # declined one (with their checkout's payment and grant)
            expected = 2 * (2 + 2) + 2 * (2 + 3)
            received = await receiver.wait_for(expected, timeout=60)
            await trio.sleep(1)  # room for a second delivery, which must not come
        finally:
            for http, _, _ in users:
                await http.aclose()
    envelopes = [json.loads(request.body) for request in receiver.received]
    assert len(envelopes) == len(received) == expected
    assert len({envelope["id"] for envelope in envelopes}) == expected  # none twice
    by_event = Counter(envelope["event"] for envelope in envelopes)
    assert by_event == {"payment.received": 6, "subscription.granted": 6,
                        "subscription.grace": 2, "subscription.canceled": 2,
                        "subscription.ended": 2}, by_event
    charges = Counter(charge["customer"] for charge in gateway.charges)
    intents = Counter(key for path, key in gateway.requests if path == "/v1/payment_intents")
    assert all(count == 1 for count in intents.values()), intents  # no charge sent twice
    assert [charges[customer] for _, customer, _ in renewing] == [1, 1]
    # The renewal and each retry, once (the lapse charges nothing).
    assert [charges[customer] for _, customer, _ in declined] == [1 + GRACE_RETRIES] * 2


async def _advance(topology: Topology, seconds: float) -> None:
    """Move the billing clock through one host; wait until the other host's workers follow."""
    async with httpx.AsyncClient(timeout=30) as internal:
        moved = await internal.post(f"{topology.hosts[0].url}/internal/billing/clock",
                                    headers=INTERNAL, json={"advanceSeconds": seconds})
        assert moved.status_code == 200, moved.text
        offset = moved.json()["offsetSeconds"]

        async def followed() -> bool:
            for _ in range(4):  # new connections: several workers of the other host
                answer = await internal.get(f"{topology.hosts[1].url}/internal/billing/clock",
                                            headers={**INTERNAL, "connection": "close"})
                if answer.json()["offsetSeconds"] != offset:
                    return False
            return True

        await eventually(followed, timeout=30)


async def test_a_master_killed_under_load_is_waited_out(topology: Topology) -> None:
    urls = _entry_points(topology)
    key = await _user_key(topology.url, rate_limit_rpm=0)
    refusals: list[httpx.Response] = []
    served = 0
    healed = trio.Event()

    async def load() -> None:
        nonlocal served
        async with httpx.AsyncClient(headers={"x-api-key": key["raw_key"]},
                                     timeout=60) as caller:
            n = 0
            while not healed.is_set():
                response = await caller.get(urls[n % len(urls)] + "/healthz")
                n += 1
                if response.status_code == 200:
                    served += 1
                else:
                    refusals.append(response)

    async with trio.open_nursery() as nursery:
        for _ in range(8):
            nursery.start_soon(load)
        await trio.sleep(1)
        # The master of the key owner's slot (its meter keys and bucket).
        killed = topology.cluster.kill_master(f"{{u{key['user_id']}}}")
        await trio.to_thread.run_sync(topology.cluster.wait_healthy, 60)
        # Until the workers' clients have found the promoted replica: a clean answer.
        with trio.fail_after(60):
            while True:
                statuses = await _statuses(urls, key["raw_key"], "/healthz", 40)
                if statuses == [200] * 40:
                    break
                await trio.sleep(0.5)
        healed.set()
    assert served > 0 and refusals
    for response in refusals:
        # A worker's own 503 with the envelope (HAProxy's 503 would say the same).
        assert response.status_code == 503, response.text
        assert response.json()["error"]["code"] == "unavailable"
    topology.assert_hosts_running()
    # Caps are exact after the failover (two owners: batches cut per slot, sent to the
    # promoted replica too, which must be given the script), and the killed node comes back
    # as a replica.
    keys = [await _user_key(topology.url, rate_limit_rpm=cap) for cap in (30, 20)]
    results: list[list[int]] = []

    async def load_capped(raw: str) -> None:
        results.append(await _statuses(urls, raw, "/healthz", 90))

    async with trio.open_nursery() as nursery:
        for capped in keys:
            nursery.start_soon(load_capped, capped["raw_key"])
    assert sorted(statuses.count(200) for statuses in results) == [20, 30]
    await trio.to_thread.run_sync(topology.cluster.restart, killed)
    topology.assert_hosts_running()
    # /readyz answered 503 during the failover: HAProxy took the hosts out for a while.
    await trio.to_thread.run_sync(topology.wait_balanced)


SUBSCRIBERS = 6


async def test_subscribers_of_a_killed_host_resume_on_the_other_once_in_order(
        topology: Topology) -> None:
    """A run goes on on host 2 while its subscribers, spread by HAProxy over both hosts,
    read its first turn; host 1 is SIGKILLed; its subscribers' streams end, they reconnect
    through HAProxy with Last-Event-ID and read the rest from host 2."""
    gate = trio.Event()  # of the fakes' run: set through it
    topology.fakes.model.script = [
        StreamedTurn("Plan:\n1. Look\n2. Report", [("list_files", "{}")] * 3),
        Gated(gate, StreamedTurn("Looking again", [("list_files", "{}")] * 3)),
        StreamedTurn("All done.")]
    host1, host2 = topology.hosts
    async with httpx.AsyncClient(base_url=topology.url, timeout=30) as http:
        wallet, _ = await sign_in(http)
        added = await add_token(topology.url, "hosted", wallet.address.lower())
        assert added.status_code == 201, added.text
        slug = (await new_project(http, "hosted", agentTemplate="research-agent"))["slug"]
        path = f"/projects/{slug}/stream"
        streams: list[list[SseEvent]] = [[] for _ in range(SUBSCRIBERS)]
        first_hosts: list[str] = []
        host1_killed = trio.Event()

        async def subscriber(index: int, task_status: trio.TaskStatus[None]) -> None:
            events = streams[index]
            async with open_sse(topology.url, path) as stream:
                assert stream.status == 200
                first_hosts.append(stream.headers["x-served-by"])
                task_status.started()
                served_by = stream.headers["x-served-by"]
                await _read_until(stream, events, "tool_result", count=3)
                if served_by == "flowsvc-2":
                    await _read_to_the_end(stream, events)
                    return
                await host1_killed.wait()
                await _read_to_the_end(stream, events)  # cut: host 1 died
            while not events or events[-1].event != "done":  # as EventSource does
                async with open_sse(topology.url, path,
                                    {"Last-Event-ID": str(events[-1].id)}) as stream:
                    assert stream.status == 200
                    assert stream.headers["x-served-by"] == "flowsvc-2"
                    await _read_to_the_end(stream, events)

        async with trio.open_nursery() as nursery:
            for index in range(SUBSCRIBERS):
                await nursery.start(subscriber, index)
            assert Counter(first_hosts) == {"flowsvc-1": 3, "flowsvc-2": 3}
            # The run on host 2 (started there directly): it survives host 1.
            session = {"svc_session": http.cookies["svc_session"]}  # set for HAProxy's host
            async with httpx.AsyncClient(base_url=host2.url, timeout=30,
                                         cookies=session) as on_host2:
                started = await on_host2.post(f"/projects/{slug}/start")
                assert started.status_code == 201, started.text

            async def read_turn_one() -> bool:
                return all(sum(event.event == "tool_result" for event in events) >= 3
                           for events in streams)

            await eventually(read_turn_one, timeout=60)
            await trio.to_thread.run_sync(host1.kill)
            host1_killed.set()
            # Turn 2 is produced after host 1 died: host 1's subscribers must reconnect.
            topology.fakes.background.call_soon(gate.set)
    # Every subscriber: every event of the run once, in order, up to one "done".
    for events in streams:
        assert_well_formed(events)
        assert [event.event for event in events].count("done") == 1
        assert events == streams[0]
    assert events[-1].json()["finalStatus"] == "completed", events[-1].data
    assert host2.running()


async def _read_until(stream: Any, events: list[SseEvent], name: str, count: int) -> None:
    while sum(event.event == name for event in events) < count:
        events.append(await stream.next_event(60))


async def _read_to_the_end(stream: Any, events: list[SseEvent]) -> None:
    """Read until ``done`` or until the stream ends or is cut (its host died: the
    connection closes in the middle of the chunked body)."""
    while not events or events[-1].event != "done":
        try:
            events.append(await stream.next_event(60))
        except (EOFError, h11.RemoteProtocolError, trio.BrokenResourceError):
            return
