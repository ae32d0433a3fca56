"""Agents: how they are stored, found, created, and shown on the wire.

Every function taking a ``Connection`` runs inside the caller's transaction
(``service.db.write`` / ``read``). An agent is ``draft`` until first published, then
``published`` or ``unpublished``; only published agents are listed.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, Row, delete, insert, select
from sqlalchemy.exc import IntegrityError

from plugins.marketplace.errors import AgentNotFound, NotOwner
from plugins.marketplace.monetization import Monetization, parse_monetization
from plugins.marketplace.ranking import tags_of
from plugins.marketplace.tables import agent_tags, agents, tool_prices
from runtime.errors import Conflict
from runtime.users import users
from runtime.wire import as_utc, format_flow, iso

SLUG_PATTERN = r"^[a-z0-9](?:[a-z0-9-]{1,62}[a-z0-9])$"
TAG_PATTERN = r"^[a-z0-9][a-z0-9-]{0,31}$"
MAX_TAGS = 10


@dataclass(frozen=True)
class AgentDraft:
    """What an agent is made of when it is created (validated by the route models)."""

    name: str
    description: str
    agent_template: str
    instructions: str = ""
    tags: tuple[str, ...] = ()
    slug: str | None = None
    monetization: Monetization = Monetization("free")
    premium: bool = False
    linked_token: str | None = None
    source_project: str | None = None


@dataclass(frozen=True)
class Agent:
    """One agent with its tags and tool prices (micro-FLOW per call, by tool name)."""

    id: int
    slug: str
    owner_id: int
    owner_name: str
    name: str
    description: str
    agent_template: str
    instructions: str
    tags: list[str]
    monetization: Monetization
    premium: bool
    linked_token: str | None
    source_project: str | None
    status: str
    published_at: datetime | None
    created_at: datetime
    updated_at: datetime
    runs_count: int
    earned_micro: int
    rating_sum: int
    rating_count: int
    tool_prices: dict[str, int]

    @property
    def published(self) -> bool:
        return self.status == "published"


def _agent(row: Row[Any], tags: list[str], prices: dict[str, int]) -> Agent:
    return Agent(
        id=int(row.id), slug=row.slug, owner_id=int(row.owner_id), owner_name=row.owner_name,
        name=row.name, description=row.description, agent_template=row.agent_template,
        instructions=row.instructions, tags=tags,
        monetization=parse_monetization(row.monetization), premium=bool(row.premium),
        linked_token=row.linked_token, source_project=row.source_project, status=row.status,
        published_at=as_utc(row.published_at) if row.published_at else None,
        created_at=as_utc(row.created_at), updated_at=as_utc(row.updated_at),
        runs_count=int(row.runs_count), earned_micro=int(row.earned_micro),
        rating_sum=int(row.rating_sum), rating_count=int(row.rating_count),
        tool_prices=prices)


def load_agent(connection: Connection, slug: str, *, lock: bool = False) -> Agent | None:
    """The agent with ``slug``; ``lock`` takes its row lock for the transaction (PostgreSQL)."""
    query = (select(agents, users.c.display_name.label("owner_name"))
             .join(users, users.c.id == agents.c.owner_id).where(agents.c.slug == slug))
    if lock:
        query = query.with_for_update(of=agents)
    row = connection.execute(query).first()
    if row is None:
        return None
    prices = {price.tool: int(price.per_call_micro) for price in connection.execute(
        select(tool_prices).where(tool_prices.c.agent_id == row.id))}
    return _agent(row, tags_of(connection, [int(row.id)])[int(row.id)], prices)


def visible_agent(connection: Connection, slug: str, viewer_id: int | None) -> Agent:
    """The agent as ``viewer_id`` may see it: published, or any state for its owner.

    :raises AgentNotFound: no such slug, or unpublished and the viewer is not the owner.
    """
    agent = load_agent(connection, slug)
    if agent is None or (not agent.published and agent.owner_id != viewer_id):
        raise AgentNotFound(f"no agent {slug!r} in the marketplace")
    return agent


def owned_agent(connection: Connection, slug: str, user_id: int) -> Agent:
    """The agent ``user_id`` is about to change, row-locked until the transaction ends.

    :raises AgentNotFound: no such slug.
    :raises NotOwner: ``user_id`` does not own it.
    """
    agent = load_agent(connection, slug, lock=True)
    if agent is None:
        raise AgentNotFound(f"no agent {slug!r}")
    if agent.owner_id != user_id:
        raise NotOwner(f"only the owner of {slug!r} may change it")
    return agent


def slug_from(name: str) -> str:
    """A slug made from a name: lowercase words joined by dashes, at most 48 characters."""
    words = re.findall(r"[a-z0-9]+", name.lower())
    base = "-".join(words)[:48].strip("-")
    return base if len(base) >= 3 else f"agent-{base}".strip("-")


def create_agent(connection: Connection, owner_id: int, draft: AgentDraft,
                 now: datetime) -> Agent:
    """Insert a draft agent.

    Without a slug one is made from the name, with a random suffix when taken.

    :raises Conflict: the requested slug is taken.
    """
    values = {
        "owner_id": owner_id, "name": draft.name, "description": draft.description,
        "agent_template": draft.agent_template, "instructions": draft.instructions,
        "monetization": draft.monetization.wire(), "premium": draft.premium,
        "linked_token": draft.linked_token, "source_project": draft.source_project,
        "status": "draft", "published_at": None, "created_at": now, "updated_at": now,
        "runs_count": 0, "earned_micro": 0, "rating_sum": 0, "rating_count": 0,
        "trending_log2": None,
    }
    candidates = [draft.slug] if draft.slug else \
        [slug_from(draft.name)] + [f"{slug_from(draft.name)}-{secrets.token_hex(3)}"
                                   for _ in range(3)]
    for slug in candidates:
        try:
            with connection.begin_nested():
                agent_id = connection.execute(insert(agents).values(slug=slug, **values)
                                              ).inserted_primary_key[0]  # type: ignore[index]
        except IntegrityError:
            continue
        replace_tags(connection, int(agent_id), draft.tags)
        agent = load_agent(connection, slug)
        assert agent is not None
        return agent
    raise Conflict(f"the slug {candidates[0]!r} is taken; choose another")


def replace_tags(connection: Connection, agent_id: int, tags: Sequence[str]) -> None:
    """Set the agent's tags to ``tags`` (duplicates dropped)."""
    connection.execute(delete(agent_tags).where(agent_tags.c.agent_id == agent_id))
    if tags:
        connection.execute(insert(agent_tags), [{"agent_id": agent_id, "tag": tag}
                                                for tag in dict.fromkeys(tags)])


def replace_tool_prices(connection: Connection, agent_id: int, prices: Mapping[str, int]) -> None:
    """Set the agent's tool prices (micro-FLOW per call, by tool) to exactly ``prices``."""
    connection.execute(delete(tool_prices).where(tool_prices.c.agent_id == agent_id))
    if prices:
        connection.execute(insert(tool_prices), [
            {"agent_id": agent_id, "tool": tool, "per_call_micro": micro}
            for tool, micro in prices.items()])


def price_list(prices: Mapping[str, int]) -> list[dict[str, str]]:
    """Tool prices on the wire, by tool name."""
    return [{"tool": tool, "perCallFlow": format_flow(prices[tool])} for tool in sorted(prices)]


def rating_average(stars_sum: int, count: int) -> float | None:
    """The mean of the stars, to 2 decimals; None without ratings."""
    return round(stars_sum / count, 2) if count else None


def _common(source: Agent | Row[Any], tags: list[str], monetization: Monetization,
            published_at: datetime | None) -> dict[str, Any]:
    """Fields shared by the detail and the listing; ``source`` is an Agent or an agents row
    with ``owner_name`` (both carry the same attribute names)."""
    ratings = int(source.rating_count)
    body: dict[str, Any] = {
        "slug": source.slug, "name": source.name, "description": source.description,
        "tags": tags, "owner": {"id": str(source.owner_id), "displayName": source.owner_name},
        "premium": bool(source.premium), "monetization": monetization.wire(),
        "publishedAt": iso(published_at) if published_at else None,
        "stats": {"runs": int(source.runs_count),
                  "earnedFlow": format_flow(int(source.earned_micro)),
                  "ratingAverage": rating_average(int(source.rating_sum), ratings),
                  "ratingCount": ratings},
    }
    if source.linked_token is not None:
        body["linkedToken"] = {"slug": source.linked_token}
    return body


def agent_detail(agent: Agent, viewer_id: int | None) -> dict[str, Any]:
    """The detail view; the owner also sees the state and the agent's instructions."""
    body = _common(agent, agent.tags, agent.monetization, agent.published_at)
    body.update({"agentTemplate": agent.agent_template, "status": agent.status,
                 "toolPrices": price_list(agent.tool_prices),
                 "createdAt": iso(agent.created_at)})
    if agent.source_project is not None:
        body["sourceProject"] = agent.source_project
    if viewer_id == agent.owner_id:
        body["instructions"] = agent.instructions
    return body


def listing_item(row: Row[Any], tags: list[str]) -> dict[str, Any]:
    """One agent of a listing page (a row of ``ranking.list_page``)."""
    return _common(row, tags, parse_monetization(row.monetization),
                   as_utc(row.published_at) if row.published_at else None)
