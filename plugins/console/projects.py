"""The console's projects pages: the caller's projects (``GET /me/projects``, 50 a page),
create a project on a token the caller owns, start a run,
and watch it (``static/build.js``: the plan's steps above the raw event log, commits,
screenshots and the preview in a sandboxed frame, from ``GET /projects/<slug>/stream``,
which EventSource resumes with ``Last-Event-ID``). Private projects are the owner's only:
the API answers anyone else 403, which the page shows."""

from __future__ import annotations

from quart import Blueprint, Response, request
from quart_schema import hide

from plugins.console.api import Answer, call, page_query
from plugins.console.deployment import dev_wallet_available
from plugins.console.security import check_csrf, page
from plugins.console.session import SIGN_IN, after_form, see_other, signed_in_user
from runtime.http import current_service

blueprint = Blueprint("console_projects", __name__, template_folder="templates")
PROJECTS = "/console/projects"
TEMPLATES = ("fullstack-builder", "bot-builder", "content-machine", "research-agent")
PROJECTS_PAGE = 50  # ?limit= in the URL changes it


async def index_page(*, status: int = 200, error: Answer | None = None,
                 form: dict[str, str] | None = None) -> Response:
    user = await signed_in_user()
    if user is None:
        return see_other(SIGN_IN)
    chosen = {"tokenSlug": request.args.get("token", ""), **(form or {})}
    paging = page_query(PROJECTS_PAGE)
    listed = await call("GET", "/me/projects", query=paging)
    return await page("projects.html", status=status, user=user,
                      error=error or (None if listed.ok else listed),
                      projects=listed.body.get("projects", []),
                      next_cursor=listed.body.get("nextCursor"), limit=paging["limit"],
                      templates=TEMPLATES, form=chosen, dev_wallet=dev_wallet_available())


@blueprint.get(PROJECTS)
@hide
async def projects() -> Response:
    slug = request.args.get("slug", "").strip()
    if slug:
        return see_other(f"{PROJECTS}/{slug}")
    return await index_page()


@blueprint.post(PROJECTS)
@hide
async def create_project() -> Response:
    form = await check_csrf()
    body = {"tokenSlug": form.get("tokenSlug", ""), "title": form.get("title", ""),
            "brief": form.get("brief", ""), "agentTemplate": form.get("agentTemplate", ""),
            "private": form.get("private") == "on"}
    answer = await call("POST", "/projects", body=body)
    slug = answer.body.get("slug")
    if answer.ok and isinstance(slug, str):
        return see_other(f"{PROJECTS}/{slug}")
    return after_form(answer, PROJECTS) or await index_page(status=answer.status, error=answer,
                                                        form=form)


async def _project_page(slug: str, *, status: int = 200, error: Answer | None = None
                        ) -> Response:
    user = await signed_in_user()
    if user is None:
        return see_other(SIGN_IN)
    shown = await call("GET", f"/projects/{slug}")
    return await page("project.html", status=shown.status if not shown.ok else status,
                      user=user, project=shown.body if shown.ok else None, slug=slug,
                      error=error or (None if shown.ok else shown),
                      public_url=current_service().settings.service.public_url.rstrip("/"))


@blueprint.get(f"{PROJECTS}/<slug>")
@hide
async def project(slug: str) -> Response:
    return await _project_page(slug)


@blueprint.post(f"{PROJECTS}/<slug>/start")
@hide
async def start(slug: str) -> Response:
    await check_csrf()
    answer = await call("POST", f"/projects/{slug}/start")
    return after_form(answer, f"{PROJECTS}/{slug}") or await _project_page(
        slug, status=answer.status, error=answer)
