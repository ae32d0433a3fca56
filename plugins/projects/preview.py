"""Live preview of a project: its work tree as the last run left it, with scripts running.

A preview is agent-written HTML and script, so it must never act as the signed-in user.
Every preview response carries ``Content-Security-Policy: sandbox allow-scripts allow-forms
allow-popups`` (never ``allow-same-origin``): the browser runs the page in an opaque origin
that has no cookies or storage of the API's host, sends the API's SameSite cookies with none
of its requests, and cannot read the API's answers (the API sends no CORS headers). Framing
is limited to the serving origin (``frame-ancestors 'self'``) and ``nosniff`` stops a file
being run as another type than its name says.

``GET /projects/<slug>/preview/<path>`` serves the tree (a folder serves its ``index.html``).
Because the page's own requests (its scripts, styles, images) carry no cookie, a private
project's preview cannot be checked per request: its owner, checked once, is redirected to
``/projects/<slug>/preview/~<token>/<path>``, where the token (an HMAC of the project under
the service's secret) is the capability to see it, and relative links keep it. The token is
never stored in events or webhooks, which name the route without it.

With ``preview_base_url`` set (a host on another registrable domain, wildcard DNS to this
service), previews move there, one host per project, ``p<id>-<token>.<preview host>``: the
route on the API host checks the caller may see the project and redirects there, and that
host answers only with previews.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import mimetypes
import re
from urllib.parse import quote, quote_from_bytes, urlsplit

import trio
from quart import Request, Response, request

from plugins.projects.engine.commit_store import sync_workspace
from plugins.projects.engine.ending import preview_url
from plugins.projects.engine.workspace import Workspace, WorkspaceError
from plugins.projects.preview_proxy import ServerGone, from_server
from plugins.projects.records.access import find_project, visible_project
from plugins.projects.records.projects import Project, get_project_by_id
from plugins.projects.state import PROJECTS_STATE
from runtime.errors import MethodNotAllowed, NotFound, PayloadTooLarge
from runtime.http import current_service
from runtime.limits import Bucket
from runtime.openapi import Success, answers
from runtime.service import Service

MAX_FILE_BYTES = 20 * 1024 * 1024
PREVIEW_HEADERS = {
    "Content-Security-Policy": "sandbox allow-scripts allow-forms allow-popups; "
                               "frame-ancestors 'self'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}
PREVIEW_ENDPOINT = "projects.project_preview"
_HOST_LABEL = re.compile(r"p([0-9]{1,18})-([a-z2-7]{24})")
_TOKEN_SEGMENT = re.compile(r"~([a-z2-7]{24})(/.*)?", re.S)
_TOKEN_CONTEXT = b"flowsvc preview\0"


def preview_token(secret: str, project: Project) -> str:
    """The capability to see ``project``'s preview (it changes if the project's privacy
    does)."""
    message = f"{project.id}:{'private' if project.private else 'public'}".encode()
    digest = hmac.new(secret.encode(), _TOKEN_CONTEXT + message, hashlib.sha256).digest()
    return base64.b32encode(digest[:15]).decode().lower()


def _token_matches(service: Service, project: Project, token: str) -> bool:
    return hmac.compare_digest(token, preview_token(service.settings.jwt.secret, project))


def _host_url(service: Service, base: str, project: Project) -> str:
    scheme, _, origin = base.partition("://")
    return f"{scheme}://p{project.id}-{preview_token(service.settings.jwt.secret, project)}" \
           f".{origin}/"


async def _serve_tree(service: Service, project: Project, path: str) -> Response:
    """The answer of the server a run started over the project's work tree, if one runs in
    this process (``preview_proxy``); otherwise the file at ``path`` of the work tree (a
    folder: its ``index.html``).

    :raises NotFound: the path is refused (``Workspace.resolve``: traversal, ``.git``, a
        symlink out) or names no file.
    """
    root = service.state(PROJECTS_STATE).project_workspace(project.id)
    live = service.sandbox.live_server(root)
    if live is not None:
        upstream = "/" + quote(path.lstrip("/"))
        if request.query_string:
            upstream += "?" + request.query_string.decode("ascii", "replace")
        prefix = request.path.removesuffix(path.lstrip("/"))
        try:
            return _with_headers(await from_server(
                live, request.method, upstream, dict(request.headers),
                prefix if prefix.endswith("/") else prefix + "/"))
        except ServerGone:
            pass  # stopped since: the files are what there is
    workspace = Workspace(root)
    # This host may never have run the project, or not its last run: the files are those
    # of its last commit then (``engine.commit_store``).
    await sync_workspace(service, workspace, project.id, None)
    relative = path.strip("/") or "index.html"
    try:
        target = workspace.resolve(relative)
        if await trio.Path(target).is_dir():
            if not path.endswith("/"):
                # The folder's index.html links relative to the folder only with the slash.
                return _with_headers(_redirect(quote(request.path) + "/", 301))
            relative += "/index.html"
            target = workspace.resolve(relative)
    except WorkspaceError as exc:
        raise NotFound(f"no file {path!r} in the preview of {project.slug!r}: {exc}") from None
    file = trio.Path(target)
    if not await file.is_file():
        raise NotFound(f"no file {relative!r} in the preview of {project.slug!r}")
    if (await file.stat()).st_size > MAX_FILE_BYTES:
        raise PayloadTooLarge(f"file {relative!r} is over {MAX_FILE_BYTES} bytes")
    content_type = mimetypes.guess_type(target.name)[0] or "application/octet-stream"
    return _with_headers(Response(await file.read_bytes(), status=200,
                                  content_type=content_type))


def _redirect(location: str, status: int) -> Response:
    return Response("", status=status, headers={"Location": location})


def _with_headers(response: Response) -> Response:
    response.headers.update(PREVIEW_HEADERS)
    return response


def _redirect_keeping_query(target: str) -> Response:
    if request.query_string:
        target += "?" + quote_from_bytes(request.query_string, safe="/?:@!$&'()*+,;=%~")
    return _redirect(target, 302)


@answers(Success(200, "*/*", "the file, in a script-enabled sandbox"))
async def project_preview(slug: str, path: str = "") -> Response:
    """The project's work tree as the last run left it, scripts running in an opaque origin.
    A private project's owner is redirected to a capability URL (``~<token>/``); with
    ``preview_base_url``, everyone allowed is redirected to the project's preview host."""
    service = current_service()
    base = service.state(PROJECTS_STATE).settings.preview_base_url
    capability = _TOKEN_SEGMENT.fullmatch(path)
    if capability is not None:
        project = await find_project(service, slug)
        if not _token_matches(service, project, capability[1]):
            raise NotFound(f"no preview at {path!r} of project {slug!r}")
        path = (capability[2] or "/").removeprefix("/")
        if not base:
            return await _serve_tree(service, project, path)
    else:
        project = await visible_project(service, slug)
    if base:
        return _redirect_keeping_query(_host_url(service, base, project) + quote(path))
    if project.private:
        token = preview_token(service.settings.jwt.secret, project)
        return _redirect_keeping_query(f"{preview_url('', slug)}~{token}/{quote(path)}")
    return await _serve_tree(service, project, path)


_DEFAULT_PORTS = {"http": 80, "https": 443}


def _host_and_port(url: str) -> tuple[str, int]:
    """The lowercase host of ``url`` and its port (the scheme's when none is written).

    :raises ValueError: the port is not a number in range.
    """
    parts = urlsplit(url)
    port = parts.port
    return ((parts.hostname or "").lower().removesuffix("."),
            port if port is not None else _DEFAULT_PORTS.get(parts.scheme, 0))


def _preview_host_label(service: Service, request_host: str) -> str | None:
    """The first label of ``request_host`` when it is a preview host (a subdomain of
    ``preview_base_url``'s host, same port, not the API's public host); else None."""
    base = service.state(PROJECTS_STATE).settings.preview_base_url
    if not base:
        return None
    preview_host, preview_port = _host_and_port(base)
    try:
        host, port = _host_and_port(f"{urlsplit(base).scheme}://{request_host}")
    except ValueError:  # not a port: not a preview host either
        return None
    label, _, parent = host.partition(".")
    if parent != preview_host or port != preview_port \
            or host == _host_and_port(service.settings.service.public_url)[0]:
        return None
    return label


def preview_bucket(service: Service, current: Request, client_ip: str) -> Bucket | None:
    """The bucket of an anonymous ``GET``/``HEAD`` that only a preview answers (the preview
    route, or any path on a preview host): ``preview:<address>``, ``preview_rpm`` a minute.
    Nothing else is claimed, so API answers stay in the anonymous bucket."""
    if current.method not in ("GET", "HEAD"):
        return None
    rule = current.url_rule
    if not (rule is not None and rule.endpoint == PREVIEW_ENDPOINT) \
            and _preview_host_label(service, current.host) is None:
        return None
    return Bucket(f"preview:{client_ip}", service.state(PROJECTS_STATE).settings.preview_rpm,
                  "anonymous preview requests per IP")


async def serve_preview_host() -> Response | None:
    """Before any route: a request to a preview host gets its project's preview, or 404;
    never an API answer. None for every other host, the API's public one always."""
    service = current_service()
    label = _preview_host_label(service, request.host)
    if label is None:
        return None
    matched = _HOST_LABEL.fullmatch(label)
    project = None
    if matched is not None:
        project = await service.db.read(get_project_by_id, int(matched[1]))
    if project is None or matched is None or not _token_matches(service, project, matched[2]):
        raise NotFound(f"no preview at {request.host}")
    if request.method not in ("GET", "HEAD"):
        raise MethodNotAllowed(f"a preview answers only GET and HEAD, not {request.method}")
    return await _serve_tree(service, project, request.path.lstrip("/"))
