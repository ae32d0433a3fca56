"""Helpers for the marketplace tests: a server with the marketplace, users, seeded agents.

Seeding goes through the plugin's own table functions in one transaction (the same code
the routes run), so hundreds of agents with varied earnings, runs and ratings take a
fraction of a second on either database.
"""

from __future__ import annotations

import random
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy import Connection

from plugins.marketplace.catalog import AgentDraft, create_agent
from plugins.marketplace.ledger import Earning, credit, rate, register_run
from plugins.marketplace.publication import PublicationSettings, publish
from runtime.server import Running
from runtime.service import Service
from runtime.wire import utcnow
from tests.support.backends import REDIS_URL, redis_prefix
from tests.support.server import client, make_settings, running_server, settings_env
from tests.support.wallet import sign_in

TEMPLATE = "fullstack-builder"


PLUGINS = ["auth", "keys", "chain", "projects", "marketplace"]


@asynccontextmanager
async def marketplace_server(var_dir: Path, database_url: str,
                             plugins: list[str] | None = None,
                             extra: dict[str, str] | None = None) -> AsyncIterator[Running]:
    """A running service with ``plugins`` (default: auth, keys, chain, projects, marketplace), a
    short listing snapshot lag (100 ms), the request buckets lifted (tests make many
    requests from one address and user) and a database deadline of 60 s (tests seed hundreds
    of agents in one transaction, which can outlast the default 5 s on a loaded machine). It
    runs as deployed: on SQLite with in-process state, on PostgreSQL with Redis when the tests
    have one."""
    redis_url = REDIS_URL if database_url.startswith("postgres") else ""
    env = settings_env(var_dir, database_url=database_url, redis_url=redis_url,
                       redis_prefix=redis_prefix(), plugins=plugins or PLUGINS,
                       extra={"FLOWSVC_PLUGINS_MARKETPLACE_SNAPSHOT_LAG_MS": "100",
                              "FLOWSVC_LIMITS_ANONYMOUS_RPM": "0",
                              "FLOWSVC_LIMITS_AUTHENTICATED_RPM": "0",
                              "FLOWSVC_DATABASE_TIMEOUT_SECONDS": "60", **(extra or {})})
    async with running_server(make_settings(env), env) as running:
        yield running


async def new_agent(http: httpx.AsyncClient, **fields: Any) -> dict[str, Any]:
    """Create a draft agent through the API; the ``agent`` of the answer."""
    body = {"name": "Pizza Site Builder", "description": "Builds ordering sites for pizzerias.",
            "agentTemplate": TEMPLATE, **fields}
    created = await http.post("/agents", json=body)
    assert created.status_code == 201, created.text
    agent: dict[str, Any] = created.json()["agent"]
    return agent


async def published_agent(http: httpx.AsyncClient, prices: dict[str, str] | None = None,
                          **fields: Any) -> str:
    """Create, price and publish an agent through the API; its slug."""
    slug = str((await new_agent(http, **fields))["slug"])
    if prices is not None:
        priced = await http.post(f"/agents/{slug}/tool-prices", json=[
            {"tool": tool, "perCallFlow": price} for tool, price in prices.items()])
        assert priced.status_code == 200, priced.text
    published = await http.post(f"/agents/{slug}/publish")
    assert published.status_code == 200, published.text
    return slug


@asynccontextmanager
async def signed_in(running: Running) -> AsyncIterator[tuple[httpx.AsyncClient, int]]:
    """A client holding a fresh wallet's session, and that user's id."""
    async with client(running) as http:
        _, user = await sign_in(http)
        yield http, int(str(user["id"]))


async def new_users(running: Running, count: int) -> list[int]:
    """Ids of ``count`` users who signed in once."""
    ids = []
    for _ in range(count):
        async with signed_in(running) as (_, user_id):
            ids.append(user_id)
    return ids


def seed_agents(service: Service, connection: Connection, owner_id: int, prefix: str,
                count: int, *, raters: list[int], rng: random.Random,
                tags: tuple[str, ...] = ()) -> list[str]:
    """Create and publish ``count`` agents with random earnings, runs and ratings."""
    slugs = []
    for index in range(count):
        slug = f"{prefix}-{index:04d}"
        agent = create_agent(connection, owner_id, AgentDraft(
            name=f"Agent {prefix} {index}", description="seeded for a test",
            agent_template=TEMPLATE, slug=slug, tags=tags), utcnow())
        publish(service, connection, slug, owner_id, PublicationSettings())
        shake(connection, agent.id, owner_id, raters, rng)
        slugs.append(slug)
    return slugs


def shake(connection: Connection, agent_id: int, owner_id: int, raters: list[int],
          rng: random.Random) -> None:
    """Move an agent's scores: an earning, some runs, ratings from users who ran it."""
    if rng.random() < 0.8:
        credit(connection, Earning(agent_id=agent_id, owner_id=owner_id, payer_id=raters[0],
                                   key_id=None, kind="tool_call",
                                   amount_micro=rng.randrange(1, 5_000_000)))
    for rater in rng.sample(raters, rng.randrange(0, len(raters) + 1)):
        run_id = f"run_{uuid.uuid4().hex[:24]}"
        register_run(connection, run_id=run_id, stream=f"seed-{run_id}", agent_id=agent_id,
                     user_id=rater, key_id=None, prices={})
        rate(connection, agent_id, owner_id, rater, rng.randrange(1, 6))
