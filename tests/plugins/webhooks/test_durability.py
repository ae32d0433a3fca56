"""Durability with real service processes: a kill during an attempt loses nothing and leaves
the attempt in the history, and two processes sharing one database send each attempt once."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import httpx
import trio

from tests.support.server import free_port
from tests.support.wallet import sign_in
from tests.support.webhook_receiver import Received, Reply, running_receiver
from tests.support.webhooks import (
    migrate_schema,
    service_process,
    service_processes,
    subscribe,
    wait_until_settled,
    webhook_env,
)

_ATTEMPTS = re.compile(r'^flowsvc_webhook_attempts_total\{outcome="(\w+)"\} (\S+)$', re.M)


def process_env(var_dir: Path, database_url: str, **webhooks: Any) -> dict[str, str]:
    env = webhook_env(var_dir, database_url, **webhooks)
    env["FLOWSVC_SERVICE_LOG_LEVEL"] = "warning"  # its output goes to a pipe nobody reads
    return env


def http_to(port: int, cookies: httpx.Cookies | None = None) -> httpx.AsyncClient:
    return httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=30, cookies=cookies)


async def attempts_made(http: httpx.AsyncClient) -> dict[str, float]:
    text = (await http.get("/metrics")).text
    return {outcome: float(value) for outcome, value in _ATTEMPTS.findall(text)}


async def test_a_service_killed_during_an_attempt_shows_it_and_delivers_after_restart(
        tmp_path: Path, database_url: str) -> None:
    """The first attempt fails (a retry is scheduled), the second is on the wire when the
    service gets SIGKILL: the receiver got it, so the history keeps it (``unknown``), and the
    restarted service delivers once its lease runs out."""
    # The attempt after the restart must not time out on a loaded machine (an extra "retry"
    # in the history): a wide attempt deadline for a receiver on loopback that answers at
    # once (4 s, twice the default of these tests), and a lease a little longer, which the
    # restarted service waits out.
    env = process_env(tmp_path / "var", database_url, backoff_base_seconds=0.05,
                      timeout_seconds=4, lease_seconds=5)
    restarted = False
    never = trio.Event()

    def fail_then_hang(request: Received) -> Reply:
        if restarted:
            return Reply(204)
        return Reply(500) if len(receiver.received) == 1 else Reply(hold=never)

    async with running_receiver(fail_then_hang) as receiver:
        port = free_port()
        async with service_process(env, port) as process, http_to(port) as http:
            await sign_in(http)
            webhook = await subscribe(http, receiver.url())
            ping = (await http.post(f"/me/webhooks/{webhook['id']}/test")).json()["delivery"]
            await receiver.wait_for(2, timeout=10)  # the second attempt is on the wire
            process.kill()  # SIGKILL: no shutdown code runs
            await trio.to_thread.run_sync(process.wait)
            cookies = http.cookies
        restarted = True
        port = free_port()
        async with service_process(env, port), http_to(port, cookies) as http:
            [delivery] = await wait_until_settled(http, webhook["id"], 1)

    assert delivery["state"] == "delivered"
    assert [(a["attempt"], a["outcome"]) for a in delivery["attempts"]] == \
        [(1, "retry"), (2, "unknown"), (3, "delivered")]
    assert delivery["attempts"][0]["status_code"] == 500
    assert [request.headers["webhook-id"] for request in receiver.received] == \
        [ping["event_id"]] * 3  # every attempt the receiver saw is in the history


async def test_two_processes_on_one_database_send_each_attempt_once(
        tmp_path: Path, database_url: str) -> None:
    env = process_env(tmp_path / "var", database_url, backoff_base_seconds=0.1)
    seen: dict[str, int] = {}

    def fail_first_time(request: Received) -> Reply:
        event_id = request.headers["webhook-id"]
        seen[event_id] = seen.get(event_id, 0) + 1
        return Reply(500 if seen[event_id] == 1 else 204)

    pings = 40
    await migrate_schema(env)
    env["FLOWSVC_DATABASE_MIGRATE_ON_START"] = "false"
    async with running_receiver(fail_first_time) as receiver:
        first, second = free_port(), free_port()
        async with service_processes(env, [first, second]), http_to(first) as one:
            await sign_in(one)
            webhook = await subscribe(one, receiver.url())
            async with http_to(second, one.cookies) as two, trio.open_nursery() as nursery:
                for index in range(pings):
                    nursery.start_soon(
                        (one if index % 2 else two).post, f"/me/webhooks/{webhook['id']}/test")
            await receiver.wait_for(2 * pings, timeout=60)  # wide: a loaded machine
            settled = await wait_until_settled(one, webhook["id"], pings)
            await trio.sleep(0.5)  # a duplicate attempt would show up by now
            async with http_to(second) as two:
                per_process = [await attempts_made(one), await attempts_made(two)]

    assert len(seen) == pings and set(seen.values()) == {2}
    assert len(receiver.received) == 2 * pings
    assert {item["state"] for item in settled} == {"delivered"}
    assert all(len(item["attempts"]) == 2 for item in settled)
    assert sum(counts.get("retry", 0) for counts in per_process) == pings
    assert sum(counts.get("delivered", 0) for counts in per_process) == pings
    assert all(sum(counts.values()) > 0 for counts in per_process)  # both did some of the work
    assert all(counts.get("stale", 0) == 0 for counts in per_process)
