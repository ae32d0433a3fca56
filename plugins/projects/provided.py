"""What the projects plugin provides to other plugins: ``runtime.contracts.runs.AGENT_RUNS``
and ``runtime.contracts.projects.PROJECTS`` (see those modules for the contracts)."""

from __future__ import annotations

from pathlib import PurePosixPath

from quart import Response
from sqlalchemy import Connection

from plugins.projects.engine.run_rows import RunRecord, get_run
from plugins.projects.engine.submit import RunRequest, start_run
from plugins.projects.live.sse import requested_last_event_id, stream_response
from plugins.projects.records.projects import get_project
from plugins.projects.state import ProjectsState
from runtime.contracts.projects import ProjectSource
from runtime.contracts.runs import Prepare, RunInfo, RunSpec
from runtime.errors import Conflict, Forbidden, NotFound
from runtime.service import Service


def run_info(record: RunRecord) -> RunInfo:
    return RunInfo(run_id=record.id, stream=record.stream, owner_id=record.owner_id,
                   status=record.status, reason=record.reason, sha=record.sha,
                   queued_at=record.queued_at, started_at=record.started_at,
                   ended_at=record.ended_at)


class EngineRuns:
    """``AgentRuns`` over this plugin's run queue, run rows and live stream."""

    def __init__(self, service: Service, state: ProjectsState) -> None:
        self._service = service
        self._state = state

    async def start(self, spec: RunSpec, *, prepare: Prepare | None = None) -> str:
        """See ``AgentRuns.start``.

        :raises ValueError: ``spec.workspace`` is not a relative path inside the root.
        """
        relative = PurePosixPath(spec.workspace)
        if relative.is_absolute() or ".." in relative.parts or not relative.parts:
            raise ValueError(f"RunSpec.workspace must be a relative path: {spec.workspace!r}")
        if spec.stream.startswith("project-"):
            raise ValueError(f"RunSpec.stream {spec.stream!r} is a project's stream")
        request = RunRequest(
            owner_id=spec.owner_id, template=spec.template, brief=spec.brief,
            workspace=self._state.workspaces / relative, stream=spec.stream,
            project={"title": spec.title}, before_tool_call=spec.before_tool_call,
            key_id=spec.key_id)
        return await start_run(self._service, request, prepare=prepare)

    async def get(self, run_id: str) -> RunInfo | None:
        record = await self._service.db.read(get_run, run_id)
        return run_info(record) if record is not None else None

    async def stream_response(self, stream: str, *, latest_run_id: str | None) -> Response:
        return await stream_response(self._service, self._state.settings, stream,
                                     requested_last_event_id(), latest_run_id)


class ProjectSources:
    """``ProjectCatalog`` over this plugin's project and run rows."""

    def completed_project(self, connection: Connection, slug: str, user_id: int
                          ) -> ProjectSource:
        project = get_project(connection, slug)
        if project is None or (project.private and project.owner_id != user_id):
            raise NotFound(f"no project {slug!r}")
        if project.owner_id != user_id:
            raise Forbidden(f"only the owner of project {slug!r} can make an agent of it")
        run = get_run(connection, project.last_run_id) if project.last_run_id else None
        if run is None or run.status != "completed":
            raise Conflict(f"project {slug!r} has no completed run to make an agent from")
        return ProjectSource(slug=project.slug, title=project.title, brief=project.brief,
                             agent_template=project.agent_template,
                             token_slug=project.token_slug)
