"""Downloads of a project's workspace: single files and the built artifact.

Agent-written files may hold script (HTML, SVG), so every file is served with
``Content-Security-Policy: sandbox`` (the browser runs it in a unique origin without
scripts or forms) and ``X-Content-Type-Options: nosniff``. Paths go through
``Workspace.resolve``, which refuses traversal, symlinks out and ``.git``. The views are
module-level functions that ``routes`` mounts on the plugin's blueprint.
"""

from __future__ import annotations

import mimetypes
import tempfile
from pathlib import Path

import trio
from quart import Response, request

from plugins.projects.engine.workspace import Workspace, WorkspaceError
from plugins.projects.records.access import visible_project
from plugins.projects.state import PROJECTS_STATE
from runtime.errors import InvalidRequest, NotFound, PayloadTooLarge
from runtime.http import current_service
from runtime.openapi import Success, answers

MAX_FILE_BYTES = 20 * 1024 * 1024
SANDBOX_HEADERS = {"Content-Security-Policy": "sandbox", "X-Content-Type-Options": "nosniff",
                   "Cache-Control": "no-cache"}


@answers(Success(200, "*/*", "the file, with its guessed content type"))
async def project_file(slug: str, path: str) -> Response:
    """A file of the project's workspace, sandboxed (private projects: owner only)."""
    service = current_service()
    project = await visible_project(service, slug)
    workspace = Workspace(service.state(PROJECTS_STATE).project_workspace(project.id))
    try:
        target = workspace.resolve(path)
    except WorkspaceError as exc:
        raise NotFound(f"no file {path!r} in project {slug!r}: {exc}") from None
    file = trio.Path(target)
    if not await file.is_file():
        raise NotFound(f"no file {path!r} in project {slug!r}")
    if (await file.stat()).st_size > MAX_FILE_BYTES:
        raise PayloadTooLarge(f"file {path!r} is over {MAX_FILE_BYTES} bytes; download "
                              "the artifact instead")
    content_type = mimetypes.guess_type(target.name)[0] or "application/octet-stream"
    return Response(await file.read_bytes(), status=200, headers=SANDBOX_HEADERS,
                    content_type=content_type)


@answers(Success(200, "application/zip"))
async def artifact(slug: str) -> Response:
    """The built workspace as a zip: at ``?ref=<sha>`` (the ``artifact_url`` of a run),
    else at its last commit (private projects: owner only)."""
    service = current_service()
    project = await visible_project(service, slug)
    ref = request.args.get("ref", "HEAD")
    if ref != "HEAD" and not (7 <= len(ref) <= 64 and all(c in "0123456789abcdef"
                                                          for c in ref)):
        raise InvalidRequest("ref must be a commit sha (hexadecimal)",
                             details=[{"field": "ref", "message": "not a commit sha"}])
    workspace = Workspace(service.state(PROJECTS_STATE).project_workspace(project.id))
    if await workspace.head() is None:
        raise NotFound(f"project {slug!r} has nothing built yet")
    with tempfile.TemporaryDirectory(prefix="flowsvc-artifact-") as folder:
        target = Path(folder) / "artifact.zip"
        try:
            await workspace.archive(target, ref)
        except WorkspaceError as exc:
            raise NotFound(f"no artifact of project {slug!r} at {ref}: {exc}") from None
        data = await trio.Path(target).read_bytes()
    name = f"{project.slug}-{ref[:12]}.zip" if ref != "HEAD" else f"{project.slug}.zip"
    return Response(data, status=200, content_type="application/zip", headers={
        "Content-Disposition": f'attachment; filename="{name}"',
        "X-Content-Type-Options": "nosniff"})
