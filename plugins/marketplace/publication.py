"""Publishing, unpublishing and pricing an agent: the owner's writes.

Each function runs in one transaction (``service.db.write``) and starts by locking the
agent's row through ``owned_agent``, so concurrent changes of one agent are serialised and
the ranking history is written in order. Publishing emits ``agent.published`` in the same
transaction: the event exists if and only if the publication committed.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sqlalchemy import Connection, update

from plugins.marketplace.catalog import (
    Agent,
    load_agent,
    owned_agent,
    price_list,
    replace_tags,
    replace_tool_prices,
)
from plugins.marketplace.errors import ToolUnknown
from plugins.marketplace.monetization import Monetization
from plugins.marketplace.ranking import close_entries, micros, open_entries, scores_of
from plugins.marketplace.tables import agents
from runtime.events import EventType
from runtime.wire import iso, utcnow

if TYPE_CHECKING:
    from runtime.service import Service

AGENT_PUBLISHED = EventType(
    "agent.published",
    "An agent of yours was published in the marketplace, or its publication settings changed.")


@dataclass(frozen=True)
class PublicationSettings:
    """What a publish request may change; None leaves a setting as it is."""

    name: str | None = None
    description: str | None = None
    instructions: str | None = None
    tags: tuple[str, ...] | None = None
    monetization: Monetization | None = None
    premium: bool | None = None


def _reloaded(connection: Connection, slug: str) -> Agent:
    agent = load_agent(connection, slug)
    assert agent is not None  # the caller holds its row lock
    return agent


def publish(service: Service, connection: Connection, slug: str, user_id: int,
            settings: PublicationSettings) -> Agent:
    """Apply ``settings`` and list the agent; emit ``agent.published``.

    Publishing an agent that is already published only updates its settings (its place
    in the ``new`` sort stays).

    :raises AgentNotFound, NotOwner: as ``owned_agent``.
    """
    agent = owned_agent(connection, slug, user_id)
    now = utcnow()
    values: dict[str, Any] = {"updated_at": now}
    for field in ("name", "description", "instructions", "premium"):
        if getattr(settings, field) is not None:
            values[field] = getattr(settings, field)
    if settings.monetization is not None:
        values["monetization"] = settings.monetization.wire()
    first_listing = not agent.published
    if first_listing:
        values.update(status="published", published_at=now)
    connection.execute(update(agents).where(agents.c.id == agent.id).values(**values))
    if settings.tags is not None:
        replace_tags(connection, agent.id, settings.tags)
    if first_listing:
        row = connection.execute(agents.select().where(agents.c.id == agent.id)).one()
        open_entries(connection, agent.id, scores_of(row), micros(now))
    agent = _reloaded(connection, slug)
    service.emit_event(connection, user_id=agent.owner_id, name=AGENT_PUBLISHED.name,
                       data={"slug": agent.slug, "marketplace_meta": marketplace_meta(
                           service, agent, first_listing)})
    return agent


def marketplace_meta(service: Service, agent: Agent, first_listing: bool) -> dict[str, Any]:
    """What ``agent.published`` tells about the listing (webhook payloads are snake_case)."""
    base = service.settings.service.public_url.rstrip("/")
    return {
        "name": agent.name, "description": agent.description, "tags": agent.tags,
        "premium": agent.premium, "monetization": agent.monetization.wire(),
        "tool_prices": price_list(agent.tool_prices),
        "linked_token": agent.linked_token,
        "published_at": iso(agent.published_at) if agent.published_at else None,
        "first_publication": first_listing,
        "url": f"{base}/marketplace/agents/{agent.slug}",
    }


def unpublish(connection: Connection, slug: str, user_id: int) -> Agent:
    """Hide the agent from the marketplace at once (a no-op when it is not published).

    Subscriptions to it run to the end of their period and are not renewed (the
    scheduler checks the agent's state at renewal time).

    :raises AgentNotFound, NotOwner: as ``owned_agent``.
    """
    agent = owned_agent(connection, slug, user_id)
    if not agent.published:
        return agent
    now = utcnow()
    connection.execute(update(agents).where(agents.c.id == agent.id)
                       .values(status="unpublished", updated_at=now))
    close_entries(connection, agent.id, micros(now))
    return _reloaded(connection, slug)


def set_tool_prices(connection: Connection, slug: str, user_id: int,
                    prices: Mapping[str, int], allowed_tools: Collection[str]) -> Agent:
    """Replace the agent's tool prices (micro-FLOW per call, by tool).

    :raises AgentNotFound, NotOwner: as ``owned_agent``.
    :raises ToolUnknown: a tool is not in the platform's allowed tool list.
    """
    agent = owned_agent(connection, slug, user_id)
    unknown = sorted(set(prices) - set(allowed_tools))
    if unknown:
        known = ", ".join(sorted(allowed_tools)) or "none"
        raise ToolUnknown(f"unknown tool {unknown[0]!r}; allowed tools: {known}",
                          details=[{"field": "tool", "message": f"{tool!r} is not allowed"}
                                   for tool in unknown])
    replace_tool_prices(connection, agent.id, prices)
    connection.execute(update(agents).where(agents.c.id == agent.id).values(updated_at=utcnow()))
    return _reloaded(connection, slug)
