"""Contract: start, read and stream agent runs (provided by the projects plugin).

The projects plugin owns the run engine (queue, agent loop, workspaces) and the live
stream (event log, ring, SSE). Another plugin runs an agent on its own stream with
``service.contract(AGENT_RUNS).start(RunSpec(...))``, reads the run back with ``get`` and
answers a client's ``text/event-stream`` request with ``stream_response`` (the marketplace
runs published agents this way).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Protocol

from runtime.agents import AgentTemplate
from runtime.contracts import Contract

if TYPE_CHECKING:
    from quart import Response
    from sqlalchemy import Connection

BeforeToolCall = Callable[[str, str], Awaitable[int | None]]
"""Awaited as ``before_tool_call(tool, call_id)`` before each tool call of a run that will
start (a known tool, arguments that fit its schema), once per call; it returns the
micro-FLOW charged for the call, shown as ``priceFlow`` in its ``tool_result``, or None
when the call is not billed. Raising stops the run (``failed``, the exception's message
as the reason); the call does not start. ``call_id`` (``call-<n>``) is unique within the
run, so ``run id + call id`` names the call for an idempotent charge."""

Prepare = Callable[["Connection", str], None]
"""Called as ``prepare(connection, run_id)`` in the transaction that records a new run."""


@dataclass(frozen=True)
class RunSpec:
    """One agent run to start.

    :param owner_id: the user the run belongs to (its queue priority comes from their
        feature flags).
    :param template: the agent: system prompt for a model, offline plan for the offline
        backend.
    :param brief: what to build.
    :param stream: the event stream the run publishes to; a plugin uses names of its own
        (``agent-run-<hex>``), never ``project-<id>``.
    :param workspace: the run's own folder (a git repository, created on first use), as a
        relative path under the engine's workspace root (``agent-runs/<hex>``).
    :param title: shown to offline plans and in the workspace's first commit.
    :param before_tool_call: see ``BeforeToolCall`` (the marketplace bills each call here).
    :param key_id: the API key the run is charged to, recorded with the run.
    """

    owner_id: int
    template: AgentTemplate
    brief: str
    stream: str
    workspace: str
    title: str = ""
    before_tool_call: BeforeToolCall | None = None
    key_id: int | None = None


@dataclass(frozen=True)
class RunInfo:
    """A run as the engine records it.

    :param status: ``queued``, ``running``, then ``completed``, ``failed`` or ``cancelled``.
    :param reason: why a run failed or was cancelled.
    :param sha: the workspace commit a completed run ended on.
    """

    run_id: str
    stream: str
    owner_id: int
    status: str
    reason: str | None
    sha: str | None
    queued_at: datetime
    started_at: datetime | None
    ended_at: datetime | None


class AgentRuns(Protocol):
    """The run engine and the live stream, as other plugins see them."""

    async def start(self, spec: RunSpec, *, prepare: Prepare | None = None) -> str:
        """Queue a run; return its id. Its events start on ``spec.stream`` once a slot
        takes it (at once when one is free).

        :raises Unavailable: the run queue is not running.
        :raises: whatever ``prepare`` raises (nothing is recorded then).
        """
        ...

    async def get(self, run_id: str) -> RunInfo | None:
        """The run ``run_id``, or None when there is none."""
        ...

    async def stream_response(self, stream: str, *, latest_run_id: str | None) -> Response:
        """The ``text/event-stream`` answer to the current request for ``stream``: replay
        from its ``Last-Event-ID`` (without one, from the first event of
        ``latest_run_id``), then live events.

        :raises Unavailable: the stream cannot be served now.
        """
        ...


AGENT_RUNS: Contract[AgentRuns] = Contract("agent runs")
