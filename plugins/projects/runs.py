"""Agent runs: the one way to start one (:func:`start_run`) and how one executes.

A run is described by a :class:`RunRequest`: who owns it, the template (or any
``AgentTemplate`` built from an agent's config), the brief, the workspace, the event
stream it publishes to, and optionally a ``before_tool_call`` callback (to charge each
call) and the API key it is charged to. Projects start their runs through it; the
marketplace runs a published agent on a caller's brief through the same call.

Execution (:func:`execute_run`, called by the run queue once a slot is free) drives the
agent loop within ``run_timeout_seconds`` and always ends the run with ``done``: a
crash, a timeout or the service stopping emit ``error`` and end it ``failed``; the owner
cancelling ends it ``cancelled``.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trio

from plugins.projects.backends import ModelBackend, OfflineBackend, OpenAIChatBackend
from plugins.projects.ending import RunEnding
from plugins.projects.publisher import Notify, RunPublisher
from plugins.projects.runner import run_agent
from plugins.projects.settings import ProjectsSettings
from plugins.projects.workspace import Workspace
from runtime.actors import Request
from runtime.agents import AgentTemplate, Tool, ToolContext
from runtime.contracts.runs import BeforeToolCall, Prepare
from runtime.service import Service

log = logging.getLogger("flowsvc.projects.runs")
QUEUE = "projects.queue"
FINISH_SECONDS = 10.0
STOPPED_REASON = "the service stopped during the run"


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
    :param before_tool_call: awaited with the tool name before each call; raising stops
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


def make_backend(settings: ProjectsSettings, request: RunRequest) -> ModelBackend:
    """The configured backend: the offline plan player, or an OpenAI-compatible model (its
    API key from ``model_api_key``, else the ``OPENAI_API_KEY`` environment variable)."""
    if request.backend is not None:
        return request.backend
    if settings.backend == "offline":
        return OfflineBackend(request.template, request.brief, request.project)
    api_key = settings.model_api_key or os.environ.get("OPENAI_API_KEY", "")
    return OpenAIChatBackend(settings.model_base_url, settings.model, api_key,
                             timeout=settings.model_timeout_seconds)


def offered_tools(service: Service, settings: ProjectsSettings) -> dict[str, Tool]:
    """The allowed tools a run is offered (``run_command`` only when commands are enabled)."""
    return {name: tool for name, tool in service.tools.items()
            if name != "run_command" or settings.allow_commands}


@dataclass
class Job:
    """A submitted run, as the queue holds it; ``cancel_scope`` stops its agent."""

    run_id: str
    request: RunRequest
    priority: int
    order: int
    cancel_scope: trio.CancelScope = field(default_factory=trio.CancelScope)
    lane: str = ""


def publisher_for(service: Service, settings: ProjectsSettings, stream: str, run_id: str,
                  project_id: int | None, notify: Notify | None) -> RunPublisher:
    return RunPublisher(service, stream=stream, run_id=run_id, project_id=project_id,
                        keep=settings.replay_events, notify=notify)


async def _drive(service: Service, settings: ProjectsSettings, job: Job,
                 publisher: RunPublisher) -> RunEnding:
    """Run the agent; how it ended (the runner emits ``error`` for the failures it knows)."""
    request = job.request
    try:
        with job.cancel_scope:
            with trio.move_on_after(settings.run_timeout_seconds):
                await Workspace(request.workspace).ensure_repository()
                context = ToolContext(
                    workspace=request.workspace, allow_commands=settings.allow_commands,
                    command_timeout=settings.command_timeout_seconds,
                    public_base_url=service.settings.service.public_url,
                    project_slug=str(request.project.get("slug", "")))
                outcome = await run_agent(
                    template=request.template, brief=request.brief,
                    backend=make_backend(settings, request),
                    tools=offered_tools(service, settings), context=context,
                    emit=publisher.emit, before_tool_call=request.before_tool_call,
                    max_turns=settings.max_turns)
                return RunEnding(outcome.final_status, outcome.reason)
            return RunEnding("failed", "the run timed out after "
                                       f"{settings.run_timeout_seconds:g} seconds")
        return RunEnding("cancelled", "cancelled by the owner")
    except Exception as exc:
        log.exception("run %s crashed", job.run_id)
        return RunEnding("failed", f"the run crashed: {type(exc).__name__}")


async def execute_run(service: Service, settings: ProjectsSettings, job: Job,
                      notify: Notify | None) -> None:
    """Execute a queued run to its end; the run's ``done`` is always committed.

    :raises trio.Cancelled: when the service stops; the run is first ended ``failed``.
    """
    request = job.request
    publisher = publisher_for(service, settings, request.stream, job.run_id,
                              request.project_id, notify)
    ending = RunEnding("failed", STOPPED_REASON)
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(publisher.write_continuously)
            ending = await _drive(service, settings, job, publisher)
            if ending.status == "completed":
                sha = publisher.last_commit_sha or await Workspace(request.workspace).head()
                ending = RunEnding("completed", None, sha)
            nursery.cancel_scope.cancel()
    finally:
        with trio.CancelScope(shield=True), trio.move_on_after(FINISH_SECONDS):
            await end_with(publisher, ending)


async def end_with(publisher: RunPublisher, ending: RunEnding) -> None:
    """Emit ``error`` for a failure nobody reported yet, then commit ``done`` and the end."""
    if ending.status == "failed" and not publisher.error_emitted:
        await publisher.emit("error", {"message": ending.reason or "the run failed",
                                       "recoverable": False})
    await publisher.finish(ending)
