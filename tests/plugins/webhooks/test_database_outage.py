"""A database outage with attempts on the wire: the dispatcher waits it out (no restart, no
crash loop) and settles every answer once the database is back, sending nothing twice.

The service runs in this process on a private PostgreSQL (``tests.support.private_servers``),
never the shared one, which this test stops.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import httpx
import trio

from tests.support.private_servers import private_postgres
from tests.support.server import client, make_settings, running_server
from tests.support.wallet import sign_in
from tests.support.webhook_receiver import Reply, running_receiver
from tests.support.webhooks import subscribe, webhook_env

PINGS = 3
# Several of the dispatcher's backoff steps (0.1 s doubling to 2 s), and longer than the
# lease: the leases run out while the answers wait to be settled, and the dispatcher must not
# take its own deliveries back and send them again.
OUTAGE_SECONDS = 8.0
LEASE_SECONDS = 6.0
# The answers are held until PostgreSQL has stopped, which can take seconds on a loaded
# machine: an attempt deadline that outlasts it (an attempt timed out shows as a retry).
TIMEOUT_SECONDS = 5.0
RECOVERY_SECONDS = 15.0  # a wide bound on a loaded machine; the backoff caps at 2 s


async def settled_history(http: httpx.AsyncClient, webhook_id: str) -> list[dict[str, Any]]:
    """The deliveries once all are settled; 503s while the database reconnects are waited out."""
    with trio.fail_after(30):
        while True:
            answer = await http.get(f"/me/webhooks/{webhook_id}/deliveries")
            if answer.status_code == 200:
                found: list[dict[str, Any]] = answer.json()["deliveries"]
                if len(found) == PINGS and all(item["state"] != "pending" for item in found):
                    return found
            else:
                assert answer.status_code == 503, answer.text
            await trio.sleep(0.1)


async def test_the_dispatcher_waits_out_a_database_outage_and_settles_what_it_sent(
        tmp_path: Path) -> None:
    answer = trio.Event()
    with private_postgres() as postgres:
        env = webhook_env(tmp_path / "var", postgres.url, timeout_seconds=TIMEOUT_SECONDS,
                          lease_seconds=LEASE_SECONDS)
        async with running_receiver(lambda _request: Reply(204, hold=answer)) as receiver, \
                running_server(make_settings(env), env) as running, client(running) as http:
            await sign_in(http)
            webhook = await subscribe(http, receiver.url())
            for _ in range(PINGS):
                assert (await http.post(f"/me/webhooks/{webhook['id']}/test")).status_code == 202
            await receiver.wait_for(PINGS)  # every attempt is on the wire, none answered
            await trio.to_thread.run_sync(postgres.stop)
            answer.set()  # the answers arrive while the database is down
            await trio.sleep(OUTAGE_SECONDS)
            await trio.to_thread.run_sync(postgres.start)
            back = trio.current_time()
            history = await settled_history(http, webhook["id"])
            recovery = trio.current_time() - back
            metrics = (await http.get("/metrics")).text
            supervisor = running.service.supervisor
            running_actors = supervisor.running() if supervisor else []

    assert [[(a["attempt"], a["outcome"], a["status_code"]) for a in item["attempts"]]
            for item in history] == [[(1, "delivered", 204)]] * PINGS
    assert len(receiver.received) == PINGS  # nothing sent twice
    assert recovery < RECOVERY_SECONDS
    assert not re.search(r'flowsvc_actor_restarts_total\{actor="webhooks.dispatcher"\}', metrics)
    assert "webhooks.dispatcher" in running_actors
