"""Routes for using agents: subscriptions to agents and runs of published agents.

Runs go through the agent-runs contract (``runtime.contracts.runs``, the projects
plugin's runner, run queue and event stream).
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
from runtime.http import json_response
from runtime.service import Service
from runtime.wire import utcnow


def build_usage_blueprint(service: Service) -> Blueprint:
    """The routes of subscriptions to agents and of runs of agents."""
    blueprint = Blueprint("marketplace_usage", __name__)

    @blueprint.post("/agents/<slug>/subscribe")
    async def subscribe(slug: str) -> Response:
        """Buy a period of a subscription agent (charged to the caller's API key), or turn
        renewal back on for a cancelled subscription still in its period."""
        principal = require_user()
        user_id = principal.user_id

        def look(connection: Connection) -> tuple[Agent, Subscription | None]:
            agent = visible_agent(connection, slug, user_id)
            return agent, find_subscription(connection, agent.id, user_id)

        agent, current = await service.db.read(look)
        await check_premium(service, agent, user_id)
        if not check_can_subscribe(agent, user_id, current, utcnow()):
            resumed = await service.db.write(set_renewal, agent.id, user_id, True, utcnow())
            return json_response({"subscription": resumed.public()})
        key_id = billing_key(principal, "a subscription")
        await charge_key(service, key_id, agent.monetization.price_micro, agent.slug)
        started = await service.db.write(start_period, agent, user_id, key_id, utcnow())
        return json_response({"subscription": started.public()}, 201)

    @blueprint.post("/agents/<slug>/subscription/cancel")
    async def cancel(slug: str) -> Response:
        """Stop renewal: the subscription runs to the end of its period."""
        user_id = require_user().user_id

        def stop(connection: Connection) -> Subscription:
            agent = load_agent(connection, slug)
            if agent is None:
                raise AgentNotFound(f"no agent {slug!r}")
            return set_renewal(connection, agent.id, user_id, False, utcnow())

        return json_response({"subscription": (await service.db.write(stop)).public()})

    @blueprint.get("/me/agent-subscriptions")
    async def mine() -> Response:
        """The caller's subscriptions to agents, current and ended."""
        user_id = require_user().user_id
        found = await service.db.read(user_subscriptions, user_id)
        return json_response({"subscriptions": [item.public() for item in found]})

    @blueprint.post("/agents/<slug>/runs")
    @validate_request(RunRequest)
    @document_response(RunStarted, 201)
    async def run(slug: str, data: RunRequest) -> Response:
        """Run a published agent (or one the caller subscribes to, or owns) on the caller's
        brief; paid tool calls are charged to the caller's API key."""
        principal = require_user()
        terms = await service.db.read(terms_of_use, slug, principal.user_id,
                                       sorted(service.tools), utcnow())
        await check_premium(service, terms.agent, principal.user_id)
        key_id = billing_key(principal, "running a paid agent") if terms.paid \
            else principal.key_id
        run_id = await start_agent_run(service, terms, data.brief, key_id)
        return json_response({"runId": run_id, "streamUrl": stream_url(service, run_id)}, 201)

    async def own_run(run_id: str) -> AgentRun:
        user_id = require_user().user_id
        found = await service.db.read(find_run, run_id)
        if found is None or found.user_id != user_id:
            raise NotFound(f"no run {run_id!r} of yours")
        return found

    @blueprint.get("/agent-runs/<run_id>")
    async def run_view(run_id: str) -> Response:
        """A run the caller started: its status, tool calls and what it was charged."""
        found = await own_run(run_id)
        record = await service.contract(AGENT_RUNS).get(run_id)
        return json_response({"run": found.public(service, record)})

    @blueprint.get("/agent-runs/<run_id>/stream")
    async def run_stream(run_id: str) -> Response:
        """The run's events (``text/event-stream``, as a project's stream; caller only)."""
        found = await own_run(run_id)
        return await service.contract(AGENT_RUNS).stream_response(found.stream,
                                                                  latest_run_id=run_id)

    return blueprint
