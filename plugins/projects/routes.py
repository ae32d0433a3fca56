"""Routes of the projects plugin: projects, runs, the stream, subscriptions, files.

Views are module-level functions on ``blueprint``; they find the service with
``current_service()`` and the plugin's settings with ``service.state(PROJECTS_STATE)``.
The workspace downloads are views of ``downloads``, mounted here on the same blueprint.
"""

from __future__ import annotations

import re
from functools import partial
from typing import Any, Literal

import trio
from pydantic import BaseModel, ConfigDict, Field, field_validator
from quart import Blueprint, Response
from quart_schema import document_response, validate_querystring, validate_request

from plugins.projects.downloads import artifact, project_file
from plugins.projects.engine.ending import artifact_url
from plugins.projects.engine.run_queue import CANCEL_CHANNEL
from plugins.projects.engine.run_rows import RunRecord, get_run
from plugins.projects.engine.submit import RunRequest, start_run
from plugins.projects.errors import (
    MessengerNotLinked,
    PrivateProjectsRequired,
    TemplateUnknown,
)
from plugins.projects.live.sse import requested_last_event_id, stream_response
from plugins.projects.preview import project_preview, serve_preview_host
from plugins.projects.records.access import owned_project, visible_project
from plugins.projects.records.projects import (
    END_STATUSES,
    Project,
    begin_run,
    cancel_idle,
    create_project,
    get_project_by_id,
    list_owned,
)
from plugins.projects.records.subscribers import subscribe, unsubscribe
from plugins.projects.state import PROJECTS_STATE
from runtime.context import caller_first, require_user
from runtime.contracts.tokens import SLUG_PATTERN, TOKENS
from runtime.errors import Conflict
from runtime.http import current_service, json_response
from runtime.inputs import Body
from runtime.openapi import Success, answers
from runtime.service import Service
from runtime.users import get_user
from runtime.wire import iso

blueprint = Blueprint("projects", __name__)
blueprint.add_url_rule("/projects/<slug>/files/<path:path>", view_func=project_file,
                       methods=["GET"])
blueprint.add_url_rule("/projects/<slug>/artifact", view_func=artifact, methods=["GET"])
blueprint.add_url_rule("/projects/<slug>/preview/", view_func=project_preview, methods=["GET"])
blueprint.add_url_rule("/projects/<slug>/preview/<path:path>", view_func=project_preview,
                       methods=["GET"])
blueprint.before_app_request(serve_preview_host)
CANCEL_WAIT_SECONDS = 5.0
PAGE_DEFAULT, PAGE_MAX = 20, 100
_POLL_SECONDS = 0.05
_PARAGRAPH_BREAK = re.compile(r"\n[ \t]*\r?\n")


class CreateProjectRequest(Body):
    """``POST /projects``; unknown fields are refused."""

    model_config = ConfigDict(json_schema_extra={"examples": [
        {"tokenSlug": "moon", "title": "Moon landing page", "brief": "A one-page site for "
         "the MOON token: what it is, how to buy it, and a live price chart.",
         "agentTemplate": "fullstack-builder", "private": False}]})
    tokenSlug: str = Field(pattern=SLUG_PATTERN, description="slug of a token you own")
    title: str = Field(min_length=1, max_length=120)
    brief: str = Field(min_length=1, max_length=4000,
                       description="what the agents should build, as a single paragraph")
    agentTemplate: str = Field(min_length=1, max_length=64,
                               description="fullstack-builder, bot-builder, content-machine "
                                           "or research-agent")
    private: bool = False

    @field_validator("title", "brief")
    @classmethod
    def _not_blank(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("must not be blank")
        return value.strip()

    @field_validator("brief")
    @classmethod
    def _single_paragraph(cls, value: str) -> str:
        if _PARAGRAPH_BREAK.search(value):
            raise ValueError("must be a single paragraph (no blank line)")
        return value


RunStatus = Literal["queued", "running", "completed", "failed", "cancelled"]


class ProjectSummary(BaseModel):
    id: str
    slug: str
    tokenSlug: str
    status: Literal["idle"] | RunStatus
    createdAt: str


class RunView(BaseModel):
    runId: str
    status: RunStatus
    reason: str | None
    sha: str | None
    queuedAt: str
    startedAt: str | None
    endedAt: str | None


class ProjectView(ProjectSummary):
    title: str
    brief: str
    agentTemplate: str
    private: bool
    ownerId: str
    updatedAt: str
    lastRun: RunView | None
    streamUrl: str
    artifactUrl: str | None


class ProjectPageQuery(BaseModel):
    limit: int = Field(PAGE_DEFAULT, ge=1, description="page size; more than 100 is clamped "
                       "to 100")
    cursor: str | None = Field(None, pattern=r"^[0-9]{1,19}$", description="nextCursor of the "
                               "previous page")


class ProjectListItem(ProjectSummary):
    title: str
    agentTemplate: str
    private: bool
    updatedAt: str


class ProjectListResponse(BaseModel):
    projects: list[ProjectListItem]
    nextCursor: str | None


class StartResponse(BaseModel):
    runId: str


class SubscribedResponse(BaseModel):
    subscribed: bool


def project_view(service: Service, project: Project, run: RunRecord | None) -> dict[str, Any]:
    """The Project resource as ``GET /projects/<slug>`` answers it."""
    public_url = service.settings.service.public_url
    artifact = artifact_url(public_url, project.slug, run.sha) \
        if run is not None and run.status == "completed" else None
    return {**project.public(), "lastRun": run.public() if run else None,
            "streamUrl": f"{public_url.rstrip('/')}/projects/{project.slug}/stream",
            "artifactUrl": artifact}


async def _answer(service: Service, slug: str) -> Response:
    """The project ``slug`` as the caller may see it, with its last run."""
    project = await visible_project(service, slug)
    run = await service.db.read(get_run, project.last_run_id) if project.last_run_id \
        else None
    return json_response(project_view(service, project, run))


@blueprint.post("/projects")
@caller_first(require_user)
@validate_request(CreateProjectRequest)
@document_response(ProjectSummary, 201)
async def create(data: CreateProjectRequest) -> Response:
    """Create a project attached to a token the caller owns; it starts ``idle``. A private
    one needs the ``privateProjects`` feature (the max tier)."""
    service = current_service()
    principal = require_user()
    if data.private and \
            not (await service.features(principal.user_id)).get("privateProjects", False):
        raise PrivateProjectsRequired("private projects need the privateProjects feature "
                                      "(the max subscription tier)")
    if data.agentTemplate not in service.templates:
        known = ", ".join(service.templates) or "none"
        raise TemplateUnknown(f"agentTemplate {data.agentTemplate!r} is not a preset "
                              f"(presets: {known})",
                              details=[{"field": "agentTemplate", "message": "unknown"}])
    project = await service.db.write(partial(
        create_project, tokens=service.contract(TOKENS), owner_id=principal.user_id,
        owner_address=principal.address, token_slug=data.tokenSlug, title=data.title,
        brief=data.brief, agent_template=data.agentTemplate, private=data.private))
    return json_response(project.summary(), 201)


@blueprint.get("/me/projects")
@caller_first(require_user)
@validate_querystring(ProjectPageQuery)
@document_response(ProjectListResponse, 200)
async def list_mine(query_args: ProjectPageQuery) -> Response:
    """The caller's own projects (private ones included), newest first, a page at a time."""
    principal = require_user()
    limit = min(query_args.limit, PAGE_MAX)
    found = await current_service().db.read(
        list_owned, principal.user_id, int(query_args.cursor) if query_args.cursor else None,
        limit + 1)
    page = found[:limit]
    return json_response({
        "projects": [{**project.summary(), "title": project.title,
                      "agentTemplate": project.agent_template, "private": project.private,
                      "updatedAt": iso(project.updated_at)} for project in page],
        "nextCursor": str(page[-1].id) if len(found) > limit else None})


@blueprint.get("/projects/<slug>")
@document_response(ProjectView, 200)
async def read(slug: str) -> Response:
    """The project, its status and its last run (private projects: owner only)."""
    return await _answer(current_service(), slug)


@blueprint.post("/projects/<slug>/start")
@document_response(StartResponse, 201)
async def start(slug: str) -> Response:
    """Start an agent run of the project (owner only); its events start on the stream."""
    service = current_service()
    project, principal = await owned_project(service, slug)
    template = service.templates.get(project.agent_template)
    if template is None:
        raise TemplateUnknown(f"agentTemplate {project.agent_template!r} is no longer "
                              "provided by any enabled plugin")
    request = RunRequest(
        owner_id=project.owner_id, template=template, brief=project.brief,
        workspace=service.state(PROJECTS_STATE).project_workspace(project.id),
        stream=project.stream, project={"title": project.title, "slug": project.slug},
        project_id=project.id, key_id=principal.key_id)
    run_id = await start_run(service, request, prepare=partial(_begin, project.id))
    return json_response({"runId": run_id}, 201)


@blueprint.post("/projects/<slug>/cancel")
@document_response(ProjectView, 200)
async def cancel(slug: str) -> Response:
    """Cancel the project (owner only): an idle one at once, a queued or running run
    as soon as it stops (normally well within a second)."""
    service = current_service()
    project, _ = await owned_project(service, slug)
    if project.status in END_STATUSES:
        raise Conflict(f"project {slug!r} is already {project.status}")
    if project.status == "idle" and await service.db.write(cancel_idle, project.id):
        return await _answer(service, slug)
    if project.last_run_id is not None:
        await service.shared.publish(CANCEL_CHANNEL, project.last_run_id)
        await _until_ended(service, project.id)
    return await _answer(service, slug)


@blueprint.get("/projects/<slug>/stream")
@answers(Success(200, "text/event-stream"))
async def stream(slug: str) -> Response:
    """The live build stream (``text/event-stream``; private projects: owner only)."""
    service = current_service()
    project = await visible_project(service, slug)
    return await stream_response(service, service.state(PROJECTS_STATE).settings,
                                 project.stream, requested_last_event_id(),
                                 project.last_run_id)


async def _follower(slug: str) -> tuple[Service, int, Project]:
    """The service, the signed-in caller's user id and the project ``slug`` they may see.

    :raises Unauthenticated: no signed-in caller (checked first).
    """
    service = current_service()
    user_id = require_user().user_id
    return service, user_id, await visible_project(service, slug)


@blueprint.post("/projects/<slug>/subscribe")
@document_response(SubscribedResponse, 200)
async def subscribe_route(slug: str) -> Response:
    """Subscribe to the project's milestones through the messaging platform's bot."""
    service, user_id, project = await _follower(slug)
    user = await service.db.read(get_user, user_id)
    if user is None or user.messenger_id is None:
        raise MessengerNotLinked("link a messaging account first (sign in through the "
                                 "bot): milestones are sent there")
    await service.db.write(subscribe, project.id, user_id)
    return json_response({"subscribed": True})


@blueprint.delete("/projects/<slug>/subscribe")
@document_response(SubscribedResponse, 200)
async def unsubscribe_route(slug: str) -> Response:
    """Stop the project's milestone notifications."""
    service, user_id, project = await _follower(slug)
    await service.db.write(unsubscribe, project.id, user_id)
    return json_response({"subscribed": False})


async def _until_ended(service: Service, project_id: int) -> None:
    """Wait (up to ``CANCEL_WAIT_SECONDS``) for the project to reach an end status.

    The run may be held by another process, so the database is the only place to watch.
    """
    for _ in range(int(CANCEL_WAIT_SECONDS / _POLL_SECONDS)):
        project = await service.db.read(get_project_by_id, project_id)
        if project is None or project.status in END_STATUSES:
            return
        await trio.sleep(_POLL_SECONDS)


def _begin(project_id: int, connection: Any, run_id: str) -> None:
    begin_run(connection, project_id, run_id)
