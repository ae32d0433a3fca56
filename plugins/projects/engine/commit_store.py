"""The files of every commit a run made, kept in the database so that every host serves them.

A host's workspace (``engine.workspace``) lives on its own disk; the database is what every
host reaches. So each ``commit`` event is stored with a snapshot of its commit, in the very
transaction that stores the event (``engine.run_publisher``): a commit the stream announced
is always downloadable, from any host, whatever becomes of the host that made it. A
snapshot is the commit's raw git object and its list of files (path, git mode, SHA-256 of
the content); each distinct content is stored once (``project_blobs``, in chunks of 1 MiB
in ``project_blob_chunks``), however many commits and projects hold it. A screenshot is
stored the same way with its ``screenshot`` event (``project_screenshots``, by project and
work-tree path), so that every host serves it before any commit holds it.

Downloads (``plugins.projects.downloads``) read these tables only. A run that starts on a
host whose workspace does not hold the project's last stored commit (another host ran the
previous run, or this one never ran the project) first rebuilds the workspace from it
(:func:`sync_workspace`): the same files, and HEAD the same commit sha, with no history
before it (a shallow repository).
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime

from sqlalchemy import Connection, delete, insert, select
from sqlalchemy.dialects.postgresql import insert as postgresql_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert

from plugins.projects.engine.workspace import REGULAR_MODE, SYMLINK_MODE, TreeFile, Workspace
from plugins.projects.tables import blob_chunks, blobs, commit_files, commits, screenshots
from runtime.service import Service

log = logging.getLogger("flowsvc.projects.commits")
CHUNK_BYTES = 1024 * 1024
_IN_CHUNK = 500  # values per IN (...) list: far below SQLite's limit on bound parameters


@dataclass(frozen=True)
class StoredFile:
    """A file of a stored commit: path, git mode, content SHA-256 and size."""

    path: str
    mode: int
    blob: str
    size: int


@dataclass(frozen=True)
class Snapshot:
    """What storing a commit needs: its object, its files and the contents the database
    may lack (by SHA-256)."""

    sha: str
    git_object: bytes
    files: list[StoredFile]
    contents: dict[str, bytes]


@dataclass(frozen=True)
class StoredCommit:
    """A commit of a project in the database."""

    id: int
    sha: str
    git_object: bytes
    created_at: datetime


class SnapshotReader:
    """Reads the snapshots of one workspace's commits; remembers which contents it already
    read (by git object id), so that a run's later commits read only the files that changed.
    """

    def __init__(self, workspace: Workspace) -> None:
        self.workspace = workspace
        self._digests: dict[str, str] = {}  # git object id -> SHA-256 of the content

    async def read(self, sha: str) -> Snapshot:
        tree = await self.workspace.tree_files(sha)
        new = sorted({file.oid for file in tree if file.oid not in self._digests})
        contents: dict[str, bytes] = {}
        for oid, content in (await self.workspace.blob_contents(new)).items():
            digest = hashlib.sha256(content).hexdigest()
            self._digests[oid] = digest
            contents[digest] = content
        return Snapshot(sha, await self.workspace.commit_object(sha),
                        [self._stored(file) for file in tree], contents)

    def _stored(self, file: TreeFile) -> StoredFile:
        return StoredFile(file.path, file.mode, self._digests[file.oid], file.size)


def store_snapshot(connection: Connection, project_id: int, run_id: str,
                   snapshot: Snapshot) -> None:
    """Store a commit with its files (nothing when the project has it already); only the
    contents the database lacks are sent."""
    exists = connection.execute(select(commits.c.id).where(
        commits.c.project_id == project_id, commits.c.sha == snapshot.sha)).first()
    if exists is not None:
        return
    store_contents(connection, {file.blob for file in snapshot.files}, snapshot.contents)
    commit_id = connection.execute(insert(commits).values(
        project_id=project_id, sha=snapshot.sha, run_id=run_id,
        git_object=snapshot.git_object, total_bytes=sum(f.size for f in snapshot.files),
        created_at=datetime.now(UTC)).returning(commits.c.id)).scalar_one()
    if snapshot.files:
        connection.execute(insert(commit_files), [
            {"commit_id": commit_id, "path": file.path, "mode": file.mode, "blob": file.blob}
            for file in snapshot.files])


def store_contents(connection: Connection, digests: set[str], contents: dict[str, bytes]
                   ) -> None:
    """Make sure the contents ``digests`` are stored: ``contents`` holds (by SHA-256) at
    least those the database may lack; only the missing ones are sent."""
    ordered = sorted(digests)
    present: set[str] = set()
    for start in range(0, len(ordered), _IN_CHUNK):
        present.update(connection.execute(select(blobs.c.sha256).where(
            blobs.c.sha256.in_(ordered[start:start + _IN_CHUNK]))).scalars())
    dialect_insert = postgresql_insert if connection.dialect.name == "postgresql" \
        else sqlite_insert
    for digest in ordered:
        if digest not in present:
            content = contents[digest]
            # Another project's run may store the same content at the same time: the one
            # whose row lands stores the chunks too.
            added = connection.execute(dialect_insert(blobs).values(
                sha256=digest, size=len(content))
                .on_conflict_do_nothing(index_elements=["sha256"])
                .returning(blobs.c.sha256)).first()
            if added is not None and content:
                connection.execute(insert(blob_chunks), [
                    {"sha256": digest, "seq": seq,
                     "content": content[seq * CHUNK_BYTES:(seq + 1) * CHUNK_BYTES]}
                    for seq in range((len(content) + CHUNK_BYTES - 1) // CHUNK_BYTES)])


def store_screenshot(connection: Connection, project_id: int, run_id: str, path: str,
                     content: bytes) -> None:
    """Store a screenshot a run just took, at its work-tree ``path``, before any commit
    holds it; a later screenshot at the same path replaces it."""
    digest = hashlib.sha256(content).hexdigest()
    store_contents(connection, {digest}, {digest: content})
    connection.execute(delete(screenshots).where(screenshots.c.project_id == project_id,
                                                 screenshots.c.path == path))
    connection.execute(insert(screenshots).values(
        project_id=project_id, path=path, blob=digest, run_id=run_id,
        created_at=datetime.now(UTC)))


def find_screenshot(connection: Connection, project_id: int, path: str) -> StoredFile | None:
    """The stored screenshot of the project at ``path``, or None."""
    row = connection.execute(
        select(screenshots.c.blob, blobs.c.size)
        .join(blobs, blobs.c.sha256 == screenshots.c.blob)
        .where(screenshots.c.project_id == project_id, screenshots.c.path == path)).first()
    return None if row is None else StoredFile(path, REGULAR_MODE, row.blob, int(row.size))


def find_commit(connection: Connection, project_id: int, ref: str | None) -> StoredCommit | None:
    """The project's commit ``ref`` (a full or abbreviated sha; None: its last stored
    commit), or None when there is no such commit or the abbreviation is ambiguous."""
    query = select(commits.c.id, commits.c.sha, commits.c.git_object, commits.c.created_at) \
        .where(commits.c.project_id == project_id)
    if ref is None:
        rows = connection.execute(query.order_by(commits.c.id.desc()).limit(1)).all()
    else:
        rows = connection.execute(query.where(commits.c.sha.startswith(ref, autoescape=True))
                                  .limit(2)).all()
    if len(rows) != 1:
        return None
    row = rows[0]
    return StoredCommit(int(row.id), row.sha, bytes(row.git_object), row.created_at)


def files_of(connection: Connection, commit_id: int, path: str | None = None
             ) -> list[StoredFile]:
    """The files of a stored commit, sorted by path (only ``path``, when given)."""
    query = select(commit_files.c.path, commit_files.c.mode, commit_files.c.blob, blobs.c.size) \
        .join(blobs, blobs.c.sha256 == commit_files.c.blob) \
        .where(commit_files.c.commit_id == commit_id).order_by(commit_files.c.path)
    if path is not None:
        query = query.where(commit_files.c.path == path)
    return [StoredFile(row.path, int(row.mode), row.blob, int(row.size))
            for row in connection.execute(query)]


def read_content(connection: Connection, digest: str, seq: int | None = None) -> bytes:
    """Chunk ``seq`` of a stored content (all of it, when None)."""
    query = select(blob_chunks.c.content).where(blob_chunks.c.sha256 == digest)
    if seq is not None:
        query = query.where(blob_chunks.c.seq == seq)
    return b"".join(bytes(chunk) for chunk in
                    connection.execute(query.order_by(blob_chunks.c.seq)).scalars())


async def content_chunks(service: Service, file: StoredFile) -> AsyncIterator[bytes]:
    """A stored file's content, read from the database a chunk (``CHUNK_BYTES``) at a time."""
    for seq in range((file.size + CHUNK_BYTES - 1) // CHUNK_BYTES):
        yield await service.db.read(read_content, file.blob, seq)


async def sync_workspace(service: Service, workspace: Workspace, project_id: int,
                         run_id: str | None) -> None:
    """Make sure the workspace holds the project's last stored commit, before a run starts
    in it (``run_id``) or a preview is served from it (None).

    A workspace that holds that commit (HEAD or an ancestor of it) is left as it is, with
    whatever the last run on this host left uncommitted. Otherwise it is rebuilt from the
    database: the commit's files, HEAD that very commit. When the project has no stored
    commit but the workspace has one (made before commits were stored), a run stores it.
    """
    last = await service.db.read(find_commit, project_id, None)
    async with workspace.exclusive():  # a rebuild at a time, across this host's workers
        if last is None:
            head = await workspace.head()
            if run_id is not None and head is not None:
                snapshot = await SnapshotReader(workspace).read(head)
                await service.db.write(store_snapshot, project_id, run_id, snapshot)
            return
        if await workspace.descends_from(last.sha):
            return
        log.info("project %d: rebuilding the workspace from commit %s", project_id, last.sha)
        await workspace.clear()
        stored = await service.db.read(files_of, last.id)
        # Symlinks last: a file is never written through a link the rebuild made.
        for file in sorted(stored, key=lambda file: file.mode == SYMLINK_MODE):
            content = b"".join([chunk async for chunk in content_chunks(service, file)])
            await workspace.put_file(file.path, file.mode, content)
        head = await workspace.adopt_commit(last.sha, last.git_object)
        if head != last.sha:
            log.warning("project %d: the rebuilt workspace's HEAD is %s, not %s (its tree "
                        "held a nested repository)", project_id, head, last.sha)
