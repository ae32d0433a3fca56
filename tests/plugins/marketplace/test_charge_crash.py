"""A paid agent run whose ``serve`` process is SIGKILLed at a random moment, then restarted:
the key's spend, its usage log, the runs' charges and the owner's earnings agree, every
round, on SQLite (in-process meter) and on PostgreSQL with Redis.

The model answers every turn with one paid ``write_file`` call after a short pause, so a
run charges a call every few tens of milliseconds and a kill lands anywhere in the charge
steps (ledger row opened, meter applied, charge recorded, tool running, events committing).
"""

from __future__ import annotations

import json
import random
from contextlib import nullcontext
from decimal import Decimal
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from tests.support.backends import POSTGRES_URL, REDIS_URL, postgres_schema, redis_prefix
from tests.support.fake_openai import FakeOpenAI, RecordedRequest, Reply, StreamedTurn
from tests.support.keys import create_key
from tests.support.marketplace import PLUGINS, published_agent
from tests.support.projects import BRIEF, service_process
from tests.support.server import free_port, settings_env
from tests.support.wallet import sign_in

ROUNDS = 3
PRICE = Decimal("0.25")
BACKENDS = ["sqlite"] + (["postgres-redis"] if POSTGRES_URL and REDIS_URL else [])


class PausingModel(FakeOpenAI):
    """Answers each turn after a pause of 10 to 40 ms; a service killed while it answers
    is no failure of the model."""

    async def _handle(self, stream: trio.SocketStream) -> None:
        try:
            await super()._handle(stream)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            pass  # the service was killed while it asked or was answered

    async def _answer(self, stream: trio.SocketStream, request: RecordedRequest,
                      reply: Reply) -> None:
        await trio.sleep(random.uniform(0.01, 0.04))
        await super()._answer(stream, request, reply)


def endless_writes() -> list[Reply]:
    return [StreamedTurn(f"Step {index}", [("write_file", json.dumps(
        {"path": f"page-{index}.html", "content": f"<h1>Page {index}</h1>"}))])
        for index in range(5000)]


async def ledgers(owner: httpx.AsyncClient, caller: httpx.AsyncClient, key_id: str,
                  runs: list[str], paying: dict[str, str]) -> dict[str, Any]:
    """What each ledger says: spend, usage log, the runs' charges, the owner's earnings."""
    [key] = [k for k in (await caller.get("/me/api-keys")).json()["keys"] if k["id"] == key_id]
    usage = (await caller.get(f"/me/api-keys/{key_id}/usage",
                              params={"since": "all"})).json()["usage"]
    charged, calls = Decimal(0), 0
    for run_id in runs:
        view = (await caller.get(f"/agent-runs/{run_id}", headers=paying)).json()["run"]
        charged += Decimal(view["chargedFlow"])
        calls += view["toolCalls"]
    earned = (await owner.get("/me/earnings")).json()["earnings"]["totalFlow"]
    return {"spend": Decimal(key["spend_period_used"]), "usage": Decimal(usage["cost_flow"]),
            "usage_charges": usage["charges"], "runs": charged, "run_calls": calls,
            "earnings": Decimal(earned)}


def agree(figures: dict[str, Any]) -> bool:
    amounts = {figures["spend"], figures["usage"], figures["runs"], figures["earnings"]}
    return len(amounts) == 1 and figures["usage_charges"] == figures["run_calls"] \
        and figures["spend"] == PRICE * figures["run_calls"]


@pytest.mark.timeout(360)
@pytest.mark.parametrize("backend", BACKENDS)
async def test_a_killed_paid_run_leaves_its_ledgers_agreeing(
        tmp_path: Path, nursery: trio.Nursery, backend: str) -> None:
    model = PausingModel(endless_writes())
    model_url: str = await nursery.start(model.serve)
    with postgres_schema() if backend != "sqlite" else nullcontext("") as schema_url:
        database_url = schema_url or f"sqlite:///{tmp_path / 'flowsvc.db'}"
        env = settings_env(
            tmp_path / "var", database_url=database_url,
            redis_url=REDIS_URL if backend != "sqlite" else "", redis_prefix=redis_prefix(),
            plugins=PLUGINS,
            extra={"FLOWSVC_LIMITS_ANONYMOUS_RPM": "0", "FLOWSVC_LIMITS_AUTHENTICATED_RPM": "0",
                   "FLOWSVC_SERVICE_LOG_LEVEL": "warning",
                   "FLOWSVC_PLUGINS_PROJECTS_BACKEND": "openai",
                   "FLOWSVC_PLUGINS_PROJECTS_MODEL_BASE_URL": model_url,
                   "FLOWSVC_PLUGINS_PROJECTS_MODEL": "fake-model",
                   "FLOWSVC_PLUGINS_PROJECTS_MODEL_API_KEY": "sk-fake",
                   "FLOWSVC_PLUGINS_PROJECTS_MAX_TURNS": "1000",
                   "FLOWSVC_PLUGINS_KEYS_CHARGE_GRACE_SECONDS": "1",
                   "FLOWSVC_PLUGINS_KEYS_CHARGE_RECONCILE_SECONDS": "0.5"})
        port = free_port()
        base_url = f"http://127.0.0.1:{port}"
        async with httpx.AsyncClient(base_url=base_url, timeout=30) as owner, \
                httpx.AsyncClient(base_url=base_url, timeout=30) as caller:
            runs: list[str] = []
            paying: dict[str, str] = {}
            key_id = slug = ""
            for round_number in range(ROUNDS):
                log_path = tmp_path / f"service-{round_number}.log"
                async with service_process(env, port, log_path) as process:
                    if round_number == 0:
                        await sign_in(owner)
                        await sign_in(caller)
                        key = await create_key(caller, rate_limit_rpm=0)
                        key_id, paying = key["id"], {"x-api-key": key["raw_key"]}
                        slug = await published_agent(owner, {"write_file": str(PRICE)},
                                                     monetization={"model": "per_call",
                                                                   "defaultPerCallFlow": "0"})
                    else:
                        figures = await settled(owner, caller, key_id, runs, paying)
                        print(f"{backend} after kill {round_number}: {figures}")
                        assert agree(figures), (round_number, figures)
                    started = await caller.post(f"/agents/{slug}/runs",
                                                json={"brief": BRIEF}, headers=paying)
                    assert started.status_code == 201, started.text
                    runs.append(started.json()["runId"])
                    await trio.sleep(random.uniform(0.3, 1.5))
                    process.kill()  # SIGKILL: no shutdown, no flush
                    await process.wait()
            async with service_process(env, port, tmp_path / "service-last.log"):
                figures = await settled(owner, caller, key_id, runs, paying)
                assert agree(figures), figures
                assert figures["run_calls"] >= ROUNDS  # each run was charged before its kill


async def settled(owner: httpx.AsyncClient, caller: httpx.AsyncClient, key_id: str,
                  runs: list[str], paying: dict[str, str]) -> dict[str, Any]:
    """The ledgers once they agree (the reconciler voids what a kill left pending), or as
    they stand after 45 s (wide: a loaded machine)."""
    figures: dict[str, Any] = {}
    with trio.move_on_after(45):
        # Another process's ledgers have no event to await: poll them as a client would.
        while not agree(figures := await ledgers(  # noqa: ASYNC110
                owner, caller, key_id, runs, paying)):
            await trio.sleep(0.2)
    return figures

