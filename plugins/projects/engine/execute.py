"""Executing a run: the agent loop within the run's limits, always ended with ``done``.

The run queue (``engine.run_queue``) calls :func:`execute_run` once a slot takes a run. It
drives the agent loop (``engine.agent_loop``) within ``run_timeout_seconds`` and always
ends the run with ``done``: a crash, a timeout or the service stopping emit ``error`` and
end it ``failed``; the owner cancelling ends it ``cancelled``.
"""

from __future__ import annotations

import logging
import os

import trio

from plugins.projects.engine.agent_loop import run_agent
from plugins.projects.engine.commit_store import sync_workspace
from plugins.projects.engine.ending import RunEnding
from plugins.projects.engine.model_backends import ModelBackend, OfflineBackend, OpenAIChatBackend
from plugins.projects.engine.run_publisher import RunPublisher
from plugins.projects.engine.submit import Job, RunRequest
from plugins.projects.engine.workspace import Workspace
from plugins.projects.records.notifier import Notify
from plugins.projects.settings import ProjectsSettings
from runtime.agents import Tool, ToolContext
from runtime.service import Service

log = logging.getLogger("flowsvc.projects.runs")
FINISH_SECONDS = 10.0
STOPPED_REASON = "the service stopped during the run"


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


_COMMAND_TOOLS = frozenset({"run_command", "start_preview"})


def offered_tools(service: Service, settings: ProjectsSettings) -> dict[str, Tool]:
    """The allowed tools a run is offered: those the sandbox can serve here
    (``Tool.needs``), and the ones that run the build's commands (``run_command``,
    ``start_preview``) only when commands are enabled."""
    return {name: tool for name, tool in service.tools.items()
            if (name not in _COMMAND_TOOLS or settings.allow_commands)
            and (tool.needs is None or service.sandbox.offers(tool.needs))}


def publisher_for(service: Service, settings: ProjectsSettings, stream: str, run_id: str,
                  project_id: int | None, notify: Notify | None,
                  workspace: Workspace | None = None) -> RunPublisher:
    return RunPublisher(service, stream=stream, run_id=run_id, project_id=project_id,
                        keep=settings.replay_events, notify=notify, workspace=workspace)


async def _drive(service: Service, settings: ProjectsSettings, job: Job,
                 publisher: RunPublisher) -> RunEnding:
    """Run the agent; how it ended (the agent loop emits ``error`` for the failures it knows)."""
    request = job.request
    try:
        with job.cancel_scope:
            with trio.move_on_after(settings.run_timeout_seconds):
                workspace = Workspace(request.workspace)
                await workspace.ensure_repository()
                if request.project_id is not None:
                    await sync_workspace(service, workspace, request.project_id, job.run_id)
                context = ToolContext(
                    workspace=request.workspace, allow_commands=settings.allow_commands,
                    command_timeout=settings.command_timeout_seconds,
                    public_base_url=service.settings.service.public_url,
                    project_slug=str(request.project.get("slug", "")),
                    sandbox=service.sandbox)
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
                              request.project_id, notify, Workspace(request.workspace))
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
