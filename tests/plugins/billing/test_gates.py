"""The feature gates that other plugins already read, observed through HTTP with real
subscriptions: ``priorityQueue`` and ``dedicatedRuntime`` in the run queue, ``premiumAgents``
in the marketplace, changing the moment a subscription activates or lapses.

``fasterSse`` and ``privateProjects`` are observed by the projects plugin's own tests
(``tests/plugins/projects/test_feature_gates.py``).
"""

from __future__ import annotations

from contextlib import AsyncExitStack
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import trio

from tests.support.billing import DAY, billing_stack, until_subscription
from tests.support.fake_openai import FakeOpenAI, Stall, StreamedTurn
from tests.support.marketplace import published_agent, signed_in
from tests.support.projects import BRIEF, eventually, new_project, token_owner


def at(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


async def test_subscribers_runs_start_first_and_max_takes_the_reserved_slot(
        tmp_path: Path, database_url: str, nursery: trio.Nursery) -> None:
    model = FakeOpenAI([Stall(5)] + [StreamedTurn("Done.")] * 4)
    base_url = await nursery.start(model.serve)
    projects = {"FLOWSVC_PLUGINS_PROJECTS_BACKEND": "openai",
                "FLOWSVC_PLUGINS_PROJECTS_MODEL_BASE_URL": base_url,
                "FLOWSVC_PLUGINS_PROJECTS_MODEL": "m",
                "FLOWSVC_PLUGINS_PROJECTS_RUN_SLOTS": "1",
                "FLOWSVC_PLUGINS_PROJECTS_DEDICATED_SLOTS": "1",
                "FLOWSVC_PLUGINS_PROJECTS_MODEL_TIMEOUT_SECONDS": "3"}
    async with billing_stack(tmp_path / "var", database_url, extra=projects,
                             plugins=["auth", "chain", "projects", "billing"]) as stack, \
            AsyncExitStack() as exits:
        clients = {name: await exits.enter_async_context(token_owner(stack.running, name))
                   for name in ("blocker", "plain", "plus", "max")}
        await stack.subscribe(clients["plus"], "plus")
        await stack.subscribe(clients["max"], "max", provider="gateway")
        slugs = {name: (await new_project(http, name))["slug"]
                 for name, http in clients.items()}
        for name in ("blocker", "plain", "plus", "max"):
            started = await clients[name].post(f"/projects/{slugs[name]}/start")
            assert started.status_code == 201, started.text
            await trio.sleep(0.05)
        runs: dict[str, dict[str, Any]] = {}

        async def all_ended() -> bool:
            for name, http in clients.items():
                runs[name] = (await http.get(f"/projects/{slugs[name]}")).json()["lastRun"]
            return all(run["endedAt"] for run in runs.values())

        await eventually(all_ended, timeout=30)
        started_at = {name: at(run["startedAt"]) for name, run in runs.items()}
        # The blocker holds the shared slot for 3 s (its model stalls) while the others queue.
        # max (dedicatedRuntime) took the reserved slot while the blocker held the shared one;
        # plus (priorityQueue) went ahead of the plain run that was queued before it.
        assert started_at["max"] < at(runs["blocker"]["endedAt"])
        assert started_at["blocker"] < started_at["plus"] < started_at["plain"]


async def test_premium_agents_follow_the_subscription(tmp_path: Path, database_url: str
                                                      ) -> None:
    plugins = ["auth", "keys", "chain", "projects", "marketplace", "billing"]
    async with billing_stack(tmp_path / "var", database_url, plugins=plugins) as stack, \
            signed_in(stack.running) as (owner, _), signed_in(stack.running) as (caller, _):
        slug = await published_agent(owner, premium=True)

        async def run_agent() -> httpx.Response:
            return await caller.post(f"/agents/{slug}/runs", json={"brief": BRIEF})

        refused = await run_agent()
        assert refused.status_code == 403
        assert refused.json()["error"]["code"] == "premium_required"
        await stack.subscribe(caller, "plus")  # plus has no premium agents
        assert (await run_agent()).status_code == 403
        assert (await caller.post("/me/subscription/change", json={"tier": "pro"})).status_code \
            == 202
        upgrade = (await caller.get("/me/subscription")).json()["openInvoice"]
        paid = await stack.cryptopay.pay(stack.cryptopay.invoice_of_url(upgrade["checkoutUrl"]))
        assert paid.json()["outcome"] == "granted"
        allowed = await run_agent()  # at once: no cache stands between payment and gate
        assert allowed.status_code == 201, allowed.text

        assert (await caller.post("/me/subscription/cancel")).status_code == 200
        assert (await run_agent()).status_code == 201  # still paid until the period ends
        stack.advance(31 * DAY)
        await until_subscription(caller, tier="none")
        lapsed = await run_agent()
        assert lapsed.status_code == 403 and lapsed.json()["error"]["code"] == "premium_required"
