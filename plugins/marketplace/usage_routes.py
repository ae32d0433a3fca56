"""Routes for using agents: subscriptions to agents and runs of published agents.

Runs go through the agent-runs contract (``runtime.contracts.runs``, the projects
plugin's runner, run queue and event stream). Views are module-level functions on
``blueprint``; they find the service with ``current_service()``.
"""

from __future__ import annotations

from quart import Blueprint, Response
from quart_schema import document_response, validate_request
from sqlalchemy import Connection

from plugins.marketplace.access import check_premium, terms_of_use
from plugins.marketplace.agent_runs import AgentRun, find_run, start_agent_run, stream_url
from plugins.marketplace.catalog import Agent, load_agent, visible_agent
from plugins.marketplace.charges import billing_key, charge_key
from plugins.marketplace.errors import AgentNotFound
from plugins.marketplace.models import RunRequest, RunStarted
from plugins.marketplace.subscriptions import (
    Subscription,
    check_can_subscribe,
    find_subscription,
    set_renewal,
    start_period,
    user_subscriptions,
)
from runtime.context import require_user
from runtime.contracts.runs import AGENT_RUNS
from runtime.errors import NotFound
from runtime.http import current_service, json_response
from runtime.openapi import Success, answers
from runtime.wire import utcnow


def _agent_and_subscription(connection: Connection, slug: str, user_id: int
                            ) -> tuple[Agent, Subscription | None]:
    """Agent ``slug`` as ``user_id`` may see it, and their subscription to it if any."""
    agent = visible_agent(connection, slug, user_id)
    return agent, find_subscription(connection, agent.id, user_id)


def _stop_renewal(connection: Connection, slug: str, user_id: int) -> Subscription:
    """Turn off renewal of ``user_id``'s subscription to agent ``slug``."""
    agent = load_agent(connection, slug)
    if agent is None:
        raise AgentNotFound(f"no agent {slug!r}")
    return set_renewal(connection, agent.id, user_id, False, utcnow())


async def _own_run(run_id: str) -> AgentRun:
    """The marketplace run ``run_id`` of the caller.

    :raises NotFound: there is none, or it is someone else's.
    """
    user_id = require_user().user_id
    found = await current_service().db.read(find_run, run_id)
    if found is None or found.user_id != user_id:
        raise NotFound(f"no run {run_id!r} of yours")
    return found


blueprint = Blueprint("marketplace_usage", __name__)


@blueprint.post("/agents/<slug>/subscribe")
async def subscribe(slug: str) -> Response:
    """Buy a period of a subscription agent (charged to the caller's API key), or turn
    renewal back on for a cancelled subscription still in its period."""
    service = current_service()
    principal = require_user()
    user_id = principal.user_id
    agent, current = await service.db.read(_agent_and_subscription, slug, user_id)
    await check_premium(service, agent, user_id)
    if not check_can_subscribe(agent, user_id, current, utcnow()):
        resumed = await service.db.write(set_renewal, agent.id, user_id, True, utcnow())
        return json_response({"subscription": resumed.public()})
    key_id = billing_key(principal, "a subscription")
    started: list[Subscription] = []

    def record(connection: Connection) -> None:
        started.append(start_period(connection, agent, user_id, key_id, utcnow()))

    # The token names this purchase by the state it starts from (no subscription yet, or
    # the one that ended), so a client retrying after a 503 cannot pay twice: a purchase
    # that went through moves the period end, and the retry is refused as a conflict.
    since = current.period_end.isoformat() if current is not None else "first"
    await charge_key(service, key_id, agent.monetization.price_micro, agent.slug,
                     token=f"subscribe:{agent.id}:{user_id}:{since}", record=record)
    return json_response({"subscription": started[0].public()}, 201)


@blueprint.post("/agents/<slug>/subscription/cancel")
async def cancel(slug: str) -> Response:
    """Stop renewal: the subscription runs to the end of its period."""
    user_id = require_user().user_id
    stopped = await current_service().db.write(_stop_renewal, slug, user_id)
    return json_response({"subscription": stopped.public()})


@blueprint.get("/me/agent-subscriptions")
async def mine() -> Response:
    """The caller's subscriptions to agents, current and ended."""
    user_id = require_user().user_id
    found = await current_service().db.read(user_subscriptions, user_id)
    return json_response({"subscriptions": [item.public() for item in found]})


@blueprint.post("/agents/<slug>/runs")
@validate_request(RunRequest)
@document_response(RunStarted, 201)
async def run(slug: str, data: RunRequest) -> Response:
    """Run a published agent (or one the caller subscribes to, or owns) on the caller's
    brief; paid tool calls are charged to the caller's API key."""
    service = current_service()
    principal = require_user()
    terms = await service.db.read(terms_of_use, slug, principal.user_id,
                                  sorted(service.tools), utcnow())
    await check_premium(service, terms.agent, principal.user_id)
    key_id = billing_key(principal, "running a paid agent") if terms.paid \
        else principal.key_id
    run_id = await start_agent_run(service, terms, data.brief, key_id)
    return json_response({"runId": run_id, "streamUrl": stream_url(service, run_id)}, 201)


@blueprint.get("/agent-runs/<run_id>")
async def run_view(run_id: str) -> Response:
    """A run the caller started: its status, tool calls and what it was charged."""
    service = current_service()
    found = await _own_run(run_id)
    record = await service.contract(AGENT_RUNS).get(run_id)
    return json_response({"run": found.public(service, record)})


@blueprint.get("/agent-runs/<run_id>/stream")
@answers(Success(200, "text/event-stream"))
async def run_stream(run_id: str) -> Response:
    """The run's events (``text/event-stream``, as a project's stream; caller only)."""
    found = await _own_run(run_id)
    return await current_service().contract(AGENT_RUNS).stream_response(
        found.stream, latest_run_id=run_id)
