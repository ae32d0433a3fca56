"""Routes of the marketplace: agents, publication, tool prices, ratings, earnings, listing.

Views are module-level functions on ``blueprint``; they find the service with
``current_service()`` and the plugin's settings with ``service.state(MARKETPLACE)``.
Runs and subscriptions are in ``usage_routes``.
"""

from __future__ import annotations

from functools import partial
from typing import TypeVar

from pydantic import BaseModel, ValidationError
from quart import Blueprint, Response, request
from quart_schema import (
    RequestSchemaValidationError,
    document_querystring,
    document_request,
    document_response,
    validate_querystring,
    validate_request,
)
from sqlalchemy import Connection

from plugins.marketplace.catalog import (
    AgentDraft,
    agent_detail,
    create_agent,
    listing_item,
    price_list,
    visible_agent,
)
from plugins.marketplace.errors import TemplateUnknown
from plugins.marketplace.from_project import create_from_project
from plugins.marketplace.ledger import owner_earnings, rate
from plugins.marketplace.models import (
    AgentFromProjectRequest,
    AgentResponse,
    AgentsPage,
    CreateAgentRequest,
    ListQuery,
    PublishRequest,
    RatingRequest,
    ToolPricesRequest,
    ToolPricesResponse,
)
from plugins.marketplace.monetization import FREE, parse_monetization
from plugins.marketplace.publication import (
    PublicationSettings,
    publish,
    set_tool_prices,
    unpublish,
)
from plugins.marketplace.ranking import decode_cursor, list_page, now_us
from plugins.marketplace.state import MARKETPLACE
from runtime.context import current_principal, require_user
from runtime.contracts.projects import PROJECTS
from runtime.errors import InvalidRequest, NotFound
from runtime.http import current_service, json_response
from runtime.openapi import answers
from runtime.service import Service
from runtime.wire import format_flow, parse_flow, utcnow

M = TypeVar("M", bound=BaseModel)
MAX_PAGE = 100


async def optional_body(model: type[M]) -> M:
    """The request body validated by ``model``; an empty body counts as ``{}``.

    :raises RequestSchemaValidationError: the body does not fit ``model`` (rendered as 400
        ``invalid_request`` with details by the core).
    """
    raw = await request.get_data(as_text=False)
    data = {} if not raw.strip() else await request.get_json(force=True)
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise RequestSchemaValidationError(exc) from None


def check_template(service: Service, name: str) -> None:
    """:raises TemplateUnknown: ``name`` is not one of the platform's agent templates."""
    if name not in service.templates:
        known = ", ".join(sorted(service.templates)) or "none"
        raise TemplateUnknown(f"unknown agentTemplate {name!r}; templates: {known}",
                              details=[{"field": "agentTemplate", "message": "unknown"}])


def _rate(connection: Connection, slug: str, user_id: int, stars: int) -> tuple[int, int]:
    """Rate agent ``slug`` as ``user_id``; the sum of its stars and its count of ratings."""
    agent = visible_agent(connection, slug, user_id)
    return rate(connection, agent.id, agent.owner_id, user_id, stars)


blueprint = Blueprint("marketplace", __name__)


@blueprint.post("/agents")
@validate_request(CreateAgentRequest)
@document_response(AgentResponse, 201)
async def create(data: CreateAgentRequest) -> Response:
    """Create a draft agent owned by the caller."""
    service = current_service()
    principal = require_user()
    check_template(service, data.agentTemplate)
    monetization = FREE if data.monetization is None else \
        parse_monetization(data.monetization)
    draft = AgentDraft(name=data.name, description=data.description,
                       agent_template=data.agentTemplate, instructions=data.instructions,
                       tags=tuple(data.tags), slug=data.slug, monetization=monetization,
                       premium=data.premium)
    agent = await service.db.write(create_agent, principal.user_id, draft, utcnow())
    return json_response({"agent": agent_detail(agent, principal.user_id)}, 201)


@blueprint.post("/agents/from-project")
@validate_request(AgentFromProjectRequest)
@document_response(AgentResponse, 201)
@answers(NotFound)
async def from_project(data: AgentFromProjectRequest) -> Response:
    """Make a draft agent from the caller's project whose last run completed; it is
    linked to the project's token."""
    service = current_service()
    principal = require_user()
    monetization = FREE if data.monetization is None else \
        parse_monetization(data.monetization)
    draft = AgentDraft(name=data.name or "", description=data.description or "",
                       agent_template="", tags=tuple(data.tags), slug=data.slug,
                       monetization=monetization, premium=data.premium)
    agent = await service.db.write(create_from_project, service.contract(PROJECTS),
                                   data.projectSlug, principal.user_id, draft)
    return json_response({"agent": agent_detail(agent, principal.user_id)}, 201)


@blueprint.post("/agents/<slug>/publish")
@document_request(PublishRequest)
@document_response(AgentResponse, 200)
async def publish_agent(slug: str) -> Response:
    """Publish the agent (owner only), applying any publication settings sent."""
    service = current_service()
    principal = require_user()
    data = await optional_body(PublishRequest)
    settings = PublicationSettings(
        name=data.name, description=data.description, instructions=data.instructions,
        tags=None if data.tags is None else tuple(data.tags), premium=data.premium,
        monetization=None if data.monetization is None
        else parse_monetization(data.monetization))
    agent = await service.db.write(partial(publish, service), slug, principal.user_id,
                                   settings)
    return json_response({"agent": agent_detail(agent, principal.user_id)})


@blueprint.post("/agents/<slug>/unpublish")
@document_response(AgentResponse, 200)
async def unpublish_agent(slug: str) -> Response:
    """Hide the agent from the marketplace (owner only)."""
    principal = require_user()
    agent = await current_service().db.write(unpublish, slug, principal.user_id)
    return json_response({"agent": agent_detail(agent, principal.user_id)})


@blueprint.post("/agents/<slug>/tool-prices")
@validate_request(ToolPricesRequest)
@document_response(ToolPricesResponse, 200)
async def tool_prices(slug: str, data: ToolPricesRequest) -> Response:
    """Replace the agent's per-tool prices in FLOW (owner only)."""
    service = current_service()
    principal = require_user()
    prices: dict[str, int] = {}
    for index, entry in enumerate(data.root):
        if entry.tool in prices:
            raise InvalidRequest(f"tool {entry.tool!r} is priced twice", details=[
                {"field": f"{index}.tool", "message": "duplicate tool"}])
        prices[entry.tool] = parse_flow(entry.perCallFlow, f"{index}.perCallFlow")
    agent = await service.db.write(set_tool_prices, slug, principal.user_id, prices,
                                   frozenset(service.tools))
    return json_response({"toolPrices": price_list(agent.tool_prices)})


@blueprint.post("/agents/<slug>/ratings")
@validate_request(RatingRequest)
async def rate_agent(slug: str, data: RatingRequest) -> Response:
    """Rate an agent the caller has run (1 to 5 stars; a new rating replaces the old)."""
    principal = require_user()
    stars_sum, count = await current_service().db.write(_rate, slug, principal.user_id,
                                                        data.stars)
    return json_response({"rating": {"stars": data.stars},
                          "stats": {"ratingAverage": round(stars_sum / count, 2),
                                    "ratingCount": count}})


@blueprint.get("/me/earnings")
async def earnings() -> Response:
    """What the caller's agents have earned, in total and per agent."""
    principal = require_user()
    total, by_agent = await current_service().db.read(owner_earnings, principal.user_id)
    return json_response({"earnings": {
        "totalFlow": format_flow(total),
        "byAgent": [{"slug": slug, "earnedFlow": format_flow(amount)}
                    for slug, amount in by_agent]}})


@blueprint.get("/marketplace/agents")
@validate_querystring(ListQuery)
@document_querystring(ListQuery)
@document_response(AgentsPage, 200)
async def listing(query_args: ListQuery) -> Response:
    """A page of published agents ranked by ``sort``, optionally with ``tag``."""
    service = current_service()
    settings = service.state(MARKETPLACE).settings
    now = now_us()
    sort, tag, after = query_args.sort or "trending", query_args.tag, None
    snapshot, listed = now - settings.snapshot_lag_ms * 1000, now
    if query_args.cursor is not None:
        after = decode_cursor(query_args.cursor, now=now,
                              ttl_seconds=settings.cursor_ttl_seconds)
        for field, asked, carried in (("sort", query_args.sort, after.sort),
                                      ("tag", query_args.tag, after.tag)):
            if field in request.args and asked != carried:
                raise InvalidRequest(
                    f"the cursor belongs to a listing with another {field}",
                    details=[{"field": "cursor", "message": f"{field} differs"}])
        sort, tag, snapshot, listed = after.sort, after.tag, after.snapshot_us, after.listed_us
    page = await service.db.read(partial(list_page, sort=sort, tag=tag,
                                         limit=min(query_args.limit, MAX_PAGE),
                                         snapshot_us=snapshot, listed_us=listed,
                                         after=after))
    return json_response({
        "agents": [listing_item(row, page.tags[int(row.id)]) for row in page.rows],
        "nextCursor": page.next_cursor.encode() if page.next_cursor else None})


@blueprint.get("/marketplace/agents/<slug>")
@document_response(AgentResponse, 200)
async def detail(slug: str) -> Response:
    """One agent: published, or in any state for its owner."""
    principal = current_principal()
    viewer = principal.user_id if principal and principal.via != "internal" else None
    agent = await current_service().db.read(visible_agent, slug, viewer)
    return json_response({"agent": agent_detail(agent, viewer)})
