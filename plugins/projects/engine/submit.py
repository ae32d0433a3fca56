"""Submitting a run: what a run is asked for with, and the one way to start one.

A run is described by a :class:`RunRequest`: who owns it, the template (or any
``AgentTemplate`` built from an agent's config), the brief, the workspace, the event
stream it publishes to, and optionally a ``before_tool_call`` callback (to charge each
call) and the API key it is charged to. Projects start their runs through
:func:`start_run`; other plugins through the ``AGENT_RUNS`` contract (``provided.py``),
which calls it too. It sends ``SubmitRun`` to the run queue (``engine.run_queue``), which
holds the run as a :class:`Job` until a slot executes it (``engine.execute``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trio

from plugins.projects.engine.model_backends import ModelBackend
from runtime.actors import Request
from runtime.agents import AgentTemplate
from runtime.contracts.runs import BeforeToolCall, Prepare
from runtime.service import Service

QUEUE = "projects.queue"


@dataclass(frozen=True)
class RunRequest:
    """Everything one agent run needs.

    :param owner_id: the user the run belongs to (its priority comes from their features).
    :param template: the agent: system prompt for a model, offline plan for the offline
        backend (a marketplace agent builds one from its config).
    :param brief: what to build.
    :param workspace: the run's own git repository (created on first use).
    :param stream: the event stream it publishes to (``project-<id>`` for a project).
    :param project: ``title`` and ``slug`` shown to offline plans and tools (screenshot URLs).
    :param project_id: the project whose status follows the run, if any.
    :param before_tool_call: ``runtime.contracts.runs.BeforeToolCall``; raising stops
        the run (``failed``) - the marketplace charges per call here.
    :param key_id: the API key the run is charged to, recorded on the run.
    :param backend: the model backend; default: the one ``[plugins.projects]`` configures.
    """

    owner_id: int
    template: AgentTemplate
    brief: str
    workspace: Path
    stream: str
    project: Mapping[str, Any] = field(default_factory=dict)
    project_id: int | None = None
    before_tool_call: BeforeToolCall | None = None
    key_id: int | None = None
    backend: ModelBackend | None = None


@dataclass(frozen=True)
class SubmitRun(Request[str]):
    """Message to the run queue: record and queue ``request``; the reply is its run id.

    :param prepare: called in the transaction that records the run (raising aborts it).
    :param priority: see ``priority_of``.
    """

    request: RunRequest
    prepare: Prepare | None
    priority: int


def priority_of(features: Mapping[str, bool]) -> int:
    """The queue priority of a user's run: 2 with ``dedicatedRuntime`` (its own slot),
    1 with ``priorityQueue`` (ahead of the rest), else 0."""
    if features.get("dedicatedRuntime"):
        return 2
    return 1 if features.get("priorityQueue") else 0


async def start_run(service: Service, request: RunRequest, *,
                    prepare: Prepare | None = None) -> str:
    """Queue a run and return its id; its events start on ``request.stream`` once a slot
    takes it (at once when one is free).

    :param prepare: called as ``prepare(connection, run_id)`` in the transaction that
        records the run (projects check and move their status there); raising aborts.
    :raises Unavailable: the run queue is not running.
    :raises: whatever ``prepare`` raises.
    """
    priority = priority_of(await service.features(request.owner_id))
    return await service.registry.lookup(QUEUE).call(SubmitRun(request, prepare, priority),
                                                      timeout=30)


@dataclass
class Job:
    """A submitted run, as the queue holds it; ``cancel_scope`` stops its agent."""

    run_id: str
    request: RunRequest
    priority: int
    order: int
    cancel_scope: trio.CancelScope = field(default_factory=trio.CancelScope)
    lane: str = ""
