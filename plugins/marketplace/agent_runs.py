"""Runs of marketplace agents on a caller's brief, through the agent-runs contract.

A run is started through ``runtime.contracts.runs.AGENT_RUNS`` (the projects plugin's
runner, run queue and SSE event log, as for project runs) on an event stream of its own,
``agent-run-<hex>``, and a workspace of its own, ``agent-runs/<hex>``. Its
``before_tool_call`` bills each call that will start: the tool's price (fixed when the
run starts, see ``access.terms_of_use``) is charged to the caller's API key through
``keys.meter`` with the token ``run:<run id>:<call id>``, and the run's count and charge
and the owner's earning are written in the transaction that records the charge (the
keys plugin's charge ledger), so the four never disagree. When the key's spend cap is
reached the charge is refused (``SpendCapReached``) and the runner stops the run with
that reason; the key's next request is answered 402 by the keys plugin.

A database or Redis outage pauses a run at its next call instead of failing it: the
charge is retried with backoff until the dependencies answer (``runtime.backoff``), with
the same token, so it is applied and recorded once however often it is retried.
"""

from __future__ import annotations

import logging
import secrets
from dataclasses import dataclass
from datetime import datetime
from functools import partial
from typing import TYPE_CHECKING, Any

from sqlalchemy import Connection, select, update

from plugins.marketplace.access import Terms
from plugins.marketplace.catalog import Agent, price_list
from plugins.marketplace.charges import charge_key
from plugins.marketplace.errors import TemplateUnknown
from plugins.marketplace.ledger import Earning, credit, register_run
from plugins.marketplace.tables import agents, runs
from runtime.agents import AgentTemplate
from runtime.backoff import until_available
from runtime.contracts.runs import AGENT_RUNS, RunInfo, RunSpec
from runtime.wire import as_utc, format_flow, iso

if TYPE_CHECKING:
    from runtime.service import Service

log = logging.getLogger("flowsvc.marketplace")
RUN_WORKSPACES = "agent-runs"


def agent_template(service: Service, agent: Agent) -> AgentTemplate:
    """The template a run of ``agent`` uses: its base template with the owner's
    instructions appended to the system prompt.

    :raises TemplateUnknown: the base template is no longer provided by any plugin.
    """
    base = service.templates.get(agent.agent_template)
    if base is None:
        raise TemplateUnknown(f"agent {agent.slug!r} uses the template "
                              f"{agent.agent_template!r}, which no enabled plugin provides")
    prompt = base.system_prompt
    if agent.instructions:
        prompt += f"\n\nInstructions from the author of this agent:\n{agent.instructions}"
    return AgentTemplate(name=f"agent:{agent.slug}", description=agent.description,
                         system_prompt=prompt, offline_plan=base.offline_plan)


@dataclass
class CallBilling:
    """The ``before_tool_call`` of one run: charges the caller, credits the owner.

    ``run_id`` is filled in by ``prepare``, in the transaction that records the run and
    before any call can happen.
    """

    service: Service
    terms: Terms
    key_id: int | None
    run_id: str = ""

    async def __call__(self, tool: str, call_id: str) -> int:
        """Bill the call ``call_id`` of ``tool``; the micro-FLOW charged.

        :raises SpendCapReached: the key's cap is reached (the runner stops the run).
        :raises Unauthenticated: the key was revoked meanwhile.
        """
        price = self.terms.prices.get(tool, 0)
        key_id = self.key_id
        assert key_id is not None or not price  # paid runs are refused without a key
        record = partial(record_call, run_id=self.run_id, terms=self.terms,
                         key_id=key_id, tool=tool, price=price)
        await until_available(
            lambda: charge_key(self.service, key_id or 0, price, self.terms.agent.slug,
                               token=f"run:{self.run_id}:{call_id}", record=record),
            what=f"charging call {call_id} of run {self.run_id}", log=log)
        return price


def record_call(connection: Connection, *, run_id: str, terms: Terms, key_id: int | None,
                tool: str, price: int) -> None:
    """Count one call of a run and credit its price to the owner (in the transaction that
    records the charge)."""
    connection.execute(update(runs).where(runs.c.run_id == run_id).values(
        tool_calls=runs.c.tool_calls + 1, charged_micro=runs.c.charged_micro + price))
    if price:
        agent = terms.agent
        credit(connection, Earning(agent_id=agent.id, owner_id=agent.owner_id,
                                   payer_id=terms.user_id, key_id=key_id, kind="tool_call",
                                   amount_micro=price, tool=tool, run_id=run_id))


async def start_agent_run(service: Service, terms: Terms, brief: str, key_id: int | None
                          ) -> str:
    """Queue a run of ``terms.agent`` for ``terms.user_id`` on ``brief``.

    :return: the run id.
    :raises TemplateUnknown: the agent's template is gone.
    :raises Unavailable: the run queue is not running.
    """
    agent = terms.agent
    token = secrets.token_hex(10)
    stream = f"agent-run-{token}"
    billing = CallBilling(service, terms, key_id)

    def prepare(connection: Connection, run_id: str) -> None:
        billing.run_id = run_id
        register_run(connection, run_id=run_id, stream=stream, agent_id=agent.id,
                     user_id=terms.user_id, key_id=key_id, prices=terms.prices,
                     counted=terms.user_id != agent.owner_id)

    spec = RunSpec(
        owner_id=terms.user_id, template=agent_template(service, agent), brief=brief,
        stream=stream, workspace=f"{RUN_WORKSPACES}/{token}", title=agent.name,
        before_tool_call=billing, key_id=key_id)
    return await service.contract(AGENT_RUNS).start(spec, prepare=prepare)


def stream_url(service: Service, run_id: str) -> str:
    """The public URL of a run's event stream."""
    return f"{service.settings.service.public_url.rstrip('/')}/agent-runs/{run_id}/stream"


@dataclass(frozen=True)
class AgentRun:
    """What the marketplace knows of one run of an agent (``prices``: micro-FLOW per call
    by tool, fixed when it started; empty when its calls are not charged)."""

    run_id: str
    stream: str
    agent_slug: str
    user_id: int
    tool_calls: int
    charged_micro: int
    prices: dict[str, int]
    started_at: datetime

    def public(self, service: Service, progress: RunInfo | None) -> dict[str, Any]:
        """The run on the wire; ``progress`` is the engine's record of it (status, times)."""
        body: dict[str, Any] = {
            "runId": self.run_id, "agentSlug": self.agent_slug,
            "toolPrices": price_list(self.prices), "toolCalls": self.tool_calls,
            "chargedFlow": format_flow(self.charged_micro),
            "startedAt": iso(self.started_at),
            "streamUrl": stream_url(service, self.run_id)}
        if progress is not None:
            body.update(status=progress.status, reason=progress.reason,
                        endedAt=iso(progress.ended_at) if progress.ended_at else None)
        return body


def find_run(connection: Connection, run_id: str) -> AgentRun | None:
    """The marketplace run ``run_id``, or None (not a run of an agent)."""
    row = connection.execute(select(runs, agents.c.slug)
                             .join(agents, agents.c.id == runs.c.agent_id)
                             .where(runs.c.run_id == run_id)).first()
    if row is None:
        return None
    return AgentRun(run_id=row.run_id, stream=row.stream, agent_slug=row.slug,
                    user_id=int(row.user_id), tool_calls=int(row.tool_calls),
                    charged_micro=int(row.charged_micro), prices=dict(row.prices),
                    started_at=as_utc(row.started_at))
