"""Downloads of a project's build: single files and the artifact zip, from any host.

Both are read from the commits stored in the database (``engine.commit_store``), never
from a host's workspace, so every host serves them, whichever host ran the build and
whether or not it is still up. A screenshot a run just took, before any commit holds it,
is stored with its event (``commit_store.store_screenshot``) and served from there too. Any
other file no commit holds yet is served from the work tree of the host that holds it, when
the request reaches it.

Agent-written files may hold script (HTML, SVG), so every file is served with
``Content-Security-Policy: sandbox`` (the browser runs it in a unique origin without
scripts or forms) and ``X-Content-Type-Options: nosniff``. Paths go through
``Workspace.resolve``, which refuses traversal, symlinks out and ``.git``. The views are
module-level functions that ``routes`` mounts on the plugin's blueprint.
"""

from __future__ import annotations

import io
import mimetypes
import zipfile
from collections.abc import AsyncIterator
from pathlib import PurePosixPath

import trio
from quart import Response, request

from plugins.projects.engine.commit_store import (
    StoredCommit,
    StoredFile,
    content_chunks,
    files_of,
    find_commit,
    find_screenshot,
    read_content,
)
from plugins.projects.engine.workspace import SYMLINK_MODE, Workspace, WorkspaceError
from plugins.projects.records.access import visible_project
from plugins.projects.state import PROJECTS_STATE
from runtime.errors import InvalidRequest, NotFound, PayloadTooLarge
from runtime.http import current_service
from runtime.openapi import Success, answers
from runtime.service import Service

MAX_FILE_BYTES = 20 * 1024 * 1024
SANDBOX_HEADERS = {"Content-Security-Policy": "sandbox", "X-Content-Type-Options": "nosniff",
                   "Cache-Control": "no-cache"}


def _ref() -> str | None:
    """The ``ref`` query parameter: a commit sha, full or abbreviated; None when absent."""
    ref = request.args.get("ref", "HEAD")
    if ref == "HEAD":
        return None
    if not (7 <= len(ref) <= 64 and all(c in "0123456789abcdef" for c in ref)):
        raise InvalidRequest("ref must be a commit sha (hexadecimal)",
                             details=[{"field": "ref", "message": "not a commit sha"}])
    return ref


@answers(Success(200, "*/*", "the file, with its guessed content type"))
async def project_file(slug: str, path: str) -> Response:
    """A file of the project's build at its last commit, or at ``?ref=<sha>``, sandboxed
    (private projects: owner only)."""
    service = current_service()
    project = await visible_project(service, slug)
    ref = _ref()
    workspace = Workspace(service.state(PROJECTS_STATE).project_workspace(project.id))
    try:
        target = workspace.resolve(path)
    except WorkspaceError as exc:
        raise NotFound(f"no file {path!r} in project {slug!r}: {exc}") from None
    content_type = mimetypes.guess_type(target.name)[0] or "application/octet-stream"
    commit = await service.db.read(find_commit, project.id, ref)
    if commit is None and ref is not None:
        raise NotFound(f"project {slug!r} has no commit {ref}")
    relative = PurePosixPath(path).as_posix()
    stored = await service.db.read(files_of, commit.id, relative) if commit is not None else []
    if not stored and ref is None:
        screenshot = await service.db.read(find_screenshot, project.id, relative)
        stored = [screenshot] if screenshot is not None else []
    if stored and stored[0].mode != SYMLINK_MODE:
        if stored[0].size > MAX_FILE_BYTES:
            raise _too_large(path)
        content = await service.db.read(read_content, stored[0].blob)
        return Response(content, status=200, headers=SANDBOX_HEADERS,
                        content_type=content_type)
    file = trio.Path(target)
    if stored or ref is not None or not await file.is_file():
        raise NotFound(f"no file {path!r} in project {slug!r}")
    if (await file.stat()).st_size > MAX_FILE_BYTES:
        raise _too_large(path)
    return Response(await file.read_bytes(), status=200, headers=SANDBOX_HEADERS,
                    content_type=content_type)


def _too_large(path: str) -> PayloadTooLarge:
    return PayloadTooLarge(f"file {path!r} is over {MAX_FILE_BYTES} bytes; download the "
                           "artifact instead")


@answers(Success(200, "application/zip"))
async def artifact(slug: str) -> Response:
    """The build as a zip: at ``?ref=<sha>`` (the ``artifact_url`` of a run), else at its
    last commit (private projects: owner only)."""
    service = current_service()
    project = await visible_project(service, slug)
    ref = _ref()
    commit = await service.db.read(find_commit, project.id, ref)
    if commit is None:
        raise NotFound(f"project {slug!r} has nothing built yet" if ref is None
                       else f"no artifact of project {slug!r} at {ref}")
    files = await service.db.read(files_of, commit.id)
    name = f"{project.slug}-{ref[:12]}.zip" if ref is not None else f"{project.slug}.zip"
    response = Response(_zip(service, commit, files), status=200,
                        content_type="application/zip", headers={
                            "Content-Disposition": f'attachment; filename="{name}"',
                            "X-Content-Type-Options": "nosniff"})
    response.timeout = None  # a large build takes a while; Quart would cut it after 60 s
    return response


class _Sink(io.RawIOBase):
    """Where the zip is written: the bytes wait here until the response sends them."""

    def __init__(self) -> None:
        self._chunks: list[bytes] = []
        self._position = 0

    def writable(self) -> bool:
        return True

    def write(self, data: bytes | bytearray | memoryview) -> int:  # type: ignore[override]
        self._chunks.append(bytes(data))
        self._position += len(data)
        return len(data)

    def tell(self) -> int:
        return self._position

    def take(self) -> bytes:
        taken = b"".join(self._chunks)
        self._chunks.clear()
        return taken


async def _zip(service: Service, commit: StoredCommit, files: list[StoredFile]
               ) -> AsyncIterator[bytes]:
    """The zip of a stored commit, streamed: each file is read from the database a chunk
    at a time and compressed in a worker thread."""
    sink = _Sink()
    when = commit.created_at.timetuple()[:6]
    with zipfile.ZipFile(sink, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for file in files:
            entry = zipfile.ZipInfo(file.path, date_time=when)
            entry.external_attr = (file.mode | 0o777 if file.mode == SYMLINK_MODE
                                   else file.mode) << 16
            entry.compress_type = zipfile.ZIP_STORED if file.mode == SYMLINK_MODE \
                else zipfile.ZIP_DEFLATED
            entry.file_size = file.size
            with archive.open(entry, "w") as member:
                async for chunk in content_chunks(service, file):
                    await trio.to_thread.run_sync(member.write, chunk)
                    if written := sink.take():
                        yield written
    yield sink.take()  # the rest of the last file and the zip's central directory
