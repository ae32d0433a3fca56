"""One project's git workspace: safe file access, real commits, and commits rebuilt from
their stored files (``engine.commit_store``).

Every project owns one work tree with its own git repository. The git directory lies
outside the work tree (``<work tree>.git``), so the sandboxed commands, which see only
the work tree, can never write hooks or config that the service's git would run; a
``.git`` an agent creates in its work tree is never the one used. Agent tools reach files
only through :class:`Workspace`, which refuses any path that could land outside the work
tree, and git always runs as a subprocess through ``trio.run_process`` so the trio
thread never blocks.
"""

from __future__ import annotations

import codecs
import fcntl
import os
import shutil
import subprocess
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path, PurePosixPath

import trio

from runtime.agents import CommitInfo

GIT_USER_NAME = "flowsvc agent"
GIT_USER_EMAIL = "agent@flowsvc.invalid"
# A commit's files are stored in the database (``engine.commit_store``) and its artifact is
# built from there: one commit holds at most this many bytes of files.
MAX_COMMIT_BYTES = 256 * 1024 * 1024
MAX_PATH_BYTES = 1024  # a stored file's path is a key of the database's index
REGULAR_MODE, EXECUTABLE_MODE, SYMLINK_MODE = 0o100644, 0o100755, 0o120000

# Agent-written content must never execute on commit, and a host's global or system
# git config (signing, hooks, templates, attributes) must not change what a commit does.
_GIT_ENV_OVERRIDES = {
    "GIT_CONFIG_GLOBAL": os.devnull,
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_ATTR_NOSYSTEM": "1",
    "GIT_TERMINAL_PROMPT": "0",
    "LC_ALL": "C",
}
_GIT_SAFETY_OPTIONS = ("-c", f"core.hooksPath={os.devnull}", "-c", "commit.gpgsign=false",
                       "-c", "core.fsmonitor=false", "-c", f"core.attributesFile={os.devnull}")
# The whole config of a repository moved out of an old in-tree ``.git``: whatever an
# earlier unsandboxed command wrote there (filters, fsmonitor) is dropped.
_FRESH_CONFIG = ("[core]\n\trepositoryformatversion = 0\n\tfilemode = true\n\tbare = false\n"
                 f"[user]\n\tname = {GIT_USER_NAME}\n\temail = {GIT_USER_EMAIL}\n")


def git_dir_of(work_tree: Path) -> Path:
    """Where the git directory of ``work_tree`` lives: beside it, never inside it."""
    return work_tree.with_name(work_tree.name + ".git")


@dataclass(frozen=True)
class TreeFile:
    """One file of a commit: its git mode (regular, executable or symlink), git object id,
    size and path."""

    mode: int
    oid: str
    size: int
    path: str


class WorkspaceError(Exception):
    """Raised when a workspace operation is refused or fails.

    The message is meant to be shown to the model and to the project owner: it names
    the offending path or the git failure, never anything outside the workspace.
    """


class Workspace:
    """A project's git repository rooted at ``root``.

    The directory and its repository are created on first use (``git init`` with a
    fixed local identity, so commits work on a machine without any git config). The
    workspace owns nothing but files under ``root``.
    """

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.git_dir = git_dir_of(self.root)

    async def ensure_repository(self) -> None:
        """Create the work tree and initialise the repository if that has not happened yet.

        A repository of the old layout (``.git`` inside the work tree) is moved out, with
        a fresh config.

        :raises WorkspaceError: when git cannot initialise the repository.
        """
        await trio.Path(self.root).mkdir(parents=True, exist_ok=True)
        if await trio.Path(self.git_dir).is_dir():
            return
        in_tree = trio.Path(self.root / ".git")
        if await in_tree.is_dir() and not await in_tree.is_symlink():
            await in_tree.rename(self.git_dir)
            await trio.Path(self.git_dir / "config").write_text(_FRESH_CONFIG)
            # Other repositories' object stores an unsandboxed command may have linked in.
            await trio.Path(self.git_dir / "objects" / "info" / "alternates").unlink(
                missing_ok=True)
            return
        await self._git("init", "--quiet", "--initial-branch=main")
        await self._git("config", "core.bare", "false")
        await self._git("config", "user.name", GIT_USER_NAME)
        await self._git("config", "user.email", GIT_USER_EMAIL)

    def resolve(self, relative_path: str) -> Path:
        """Return the absolute path of ``relative_path`` inside the workspace.

        :raises WorkspaceError: for an empty or absolute path, a ``..`` component, a
            path inside ``.git``, or a path that resolves outside the workspace
            through a symlink.
        """
        if not relative_path.strip():
            raise WorkspaceError("path is empty")
        if "\0" in relative_path:
            raise WorkspaceError("path contains a NUL character")
        pure = PurePosixPath(relative_path)
        if pure.is_absolute():
            raise WorkspaceError(f"path {relative_path!r} is absolute; use a path relative "
                                 "to the workspace")
        if ".." in pure.parts:
            raise WorkspaceError(f"path {relative_path!r} leaves the workspace ('..' is refused)")
        if ".git" in pure.parts:
            raise WorkspaceError(f"path {relative_path!r} touches .git, which tools may not")
        root = self.root.resolve()
        candidate = (root / pure).resolve()
        if not candidate.is_relative_to(root):
            raise WorkspaceError(f"path {relative_path!r} resolves outside the workspace "
                                 "through a symlink")
        if candidate == root:
            raise WorkspaceError(f"path {relative_path!r} names the workspace itself, not a file")
        return candidate

    async def write_file(self, relative_path: str, content: str | bytes) -> int:
        """Write ``content`` (text as UTF-8) to ``relative_path``, creating parent
        directories.

        :return: the number of bytes written.
        :raises WorkspaceError: when the path is refused or names a directory.
        """
        await self.ensure_repository()
        target = trio.Path(self.resolve(relative_path))
        if await target.is_dir():
            raise WorkspaceError(f"path {relative_path!r} is a directory")
        await target.parent.mkdir(parents=True, exist_ok=True)
        data = content.encode("utf-8") if isinstance(content, str) else content
        await target.write_bytes(data)
        return len(data)

    async def read_file(self, relative_path: str, max_bytes: int = 65536) -> tuple[str, bool]:
        """Read ``relative_path`` as UTF-8 text, at most ``max_bytes`` of it.

        :return: the text and whether it was truncated.
        :raises WorkspaceError: when the path is refused, missing, a directory or not text.
        """
        target = trio.Path(self.resolve(relative_path))
        if not await target.is_file():
            raise WorkspaceError(f"file {relative_path!r} does not exist")
        async with await target.open("rb") as stream:
            data = await stream.read(max_bytes + 1)
        truncated = len(data) > max_bytes
        # A cut can split a multi-byte character: a non-final decode keeps that tail
        # out of the text instead of reporting the file as binary.
        decoder = codecs.getincrementaldecoder("utf-8")()
        try:
            text = decoder.decode(data[:max_bytes], final=not truncated)
        except UnicodeDecodeError as exc:
            raise WorkspaceError(f"file {relative_path!r} is not UTF-8 text") from exc
        return text, truncated

    async def list_files(self) -> list[str]:
        """Return every file under the workspace (not ``.git``) as sorted POSIX paths."""
        await self.ensure_repository()
        return await trio.to_thread.run_sync(self._walk_files)

    def _walk_files(self) -> list[str]:
        found: list[str] = []
        for directory, subdirectories, files in os.walk(self.root, followlinks=False):
            subdirectories[:] = [name for name in subdirectories if name != ".git"]
            base = Path(directory).relative_to(self.root)
            found.extend((base / name).as_posix() for name in files)
        return sorted(found)

    async def commit(self, message: str) -> CommitInfo:
        """Stage every change and commit it with ``message``.

        :return: the new commit's sha, message and the files it changed.
        :raises WorkspaceError: when the message is empty, there is nothing to commit
            or git fails.
        """
        if not message.strip():
            raise WorkspaceError("commit message is empty")
        await self.ensure_repository()
        await self._git("add", "--all")
        staged = await self._git("diff", "--cached", "--name-only", "-z")
        if not staged:
            raise WorkspaceError("nothing to commit: no file changed since the last commit")
        tree = await self.tree_files((await self._git("write-tree")).strip())
        size = sum(file.size for file in tree)
        long_paths = [file.path for file in tree if len(file.path.encode()) > MAX_PATH_BYTES]
        if size > MAX_COMMIT_BYTES or long_paths:
            await self._git("reset", "--quiet")
            raise WorkspaceError(
                f"the commit would hold {size} bytes of files, over the cap of "
                f"{MAX_COMMIT_BYTES}: delete large files or list them in .gitignore"
                if size > MAX_COMMIT_BYTES else f"path {long_paths[0][:80]!r}... is over "
                f"{MAX_PATH_BYTES} bytes long: shorten it")
        await self._git("commit", "--quiet", "--no-verify", "--file=-", stdin=message.encode())
        sha = (await self._git("rev-parse", "HEAD")).strip()
        changed = await self._git("diff-tree", "--no-commit-id", "--name-only", "-r", "-z",
                                  "--root", "HEAD")
        files = [name for name in changed.split("\0") if name]
        return CommitInfo(sha=sha, message=message, files=files)

    async def head(self) -> str | None:
        """The sha of the last commit, or None before the first one (or before ``git init``)."""
        if not await trio.Path(self.git_dir).is_dir() or not await self._has_commits():
            return None
        return (await self._git("rev-parse", "HEAD")).strip()

    async def descends_from(self, sha: str) -> bool:
        """Whether the commit ``sha`` is HEAD or one of its ancestors here."""
        if not await trio.Path(self.git_dir).is_dir():
            return False
        result = await self._run_git("merge-base", "--is-ancestor", sha, "HEAD")
        return result.returncode == 0

    async def commit_object(self, sha: str) -> bytes:
        """The raw git object of commit ``sha`` (``git cat-file commit``)."""
        return await self._git_bytes("cat-file", "commit", sha)

    async def tree_files(self, treeish: str) -> list[TreeFile]:
        """The files of a commit or tree, sorted by path; a nested repository's entry
        (a gitlink) has no content here and is left out."""
        listing = await self._git_bytes("ls-tree", "-r", "-l", "-z", "--full-tree", treeish)
        files = []
        for line in listing.split(b"\0"):
            if not line:
                continue
            meta, _, path = line.partition(b"\t")
            mode, kind, oid, size = meta.split()
            if kind == b"blob":
                files.append(TreeFile(int(mode, 8), oid.decode(), int(size),
                                      path.decode("utf-8", "replace")))
        return files

    async def blob_contents(self, oids: list[str]) -> dict[str, bytes]:
        """The contents of the blobs ``oids``, read by one ``git cat-file --batch``."""
        if not oids:
            return {}
        output = await self._git_bytes("cat-file", "--batch",
                                       stdin="".join(f"{oid}\n" for oid in oids).encode())
        contents: dict[str, bytes] = {}
        position = 0
        for oid in oids:
            end = output.index(b"\n", position)
            header = output[position:end].split()
            if len(header) != 3:
                raise WorkspaceError(f"git cat-file found no blob {oid}")
            size = int(header[2])
            contents[oid] = output[end + 1:end + 1 + size]
            position = end + 1 + size + 1
        return contents

    @asynccontextmanager
    async def exclusive(self) -> AsyncIterator[None]:
        """Held by one task of one process of this host at a time (``flock`` on a file
        beside the work tree; the service's workers share the host's workspaces)."""
        await trio.Path(self.root.parent).mkdir(parents=True, exist_ok=True)
        descriptor = os.open(self.root.with_name(self.root.name + ".lock"),
                             os.O_RDWR | os.O_CREAT, 0o600)
        try:
            while True:
                try:
                    fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    await trio.sleep(0.05)
            yield
        finally:
            os.close(descriptor)  # releases the lock

    async def clear(self) -> None:
        """Delete the work tree and its repository, then start an empty repository."""
        for directory in (self.root, self.git_dir):
            await trio.to_thread.run_sync(partial(shutil.rmtree, directory, ignore_errors=True))
        await self.ensure_repository()

    async def put_file(self, relative_path: str, mode: int, content: bytes) -> None:
        """Write a file of a stored commit with its git ``mode`` (a symlink's content is
        its target)."""
        target = self.resolve(relative_path)
        await trio.Path(target.parent).mkdir(parents=True, exist_ok=True)
        if mode == SYMLINK_MODE:
            await trio.to_thread.run_sync(os.symlink, os.fsdecode(content), target)
            return
        await trio.Path(target).write_bytes(content)
        await trio.Path(target).chmod(0o755 if mode == EXECUTABLE_MODE else 0o644)

    async def adopt_commit(self, sha: str, git_object: bytes) -> str:
        """Make the files :meth:`put_file` wrote the commit ``sha`` again, from its raw
        object: when they form its very tree, HEAD becomes ``sha`` itself, its parents
        marked absent (a shallow repository, as ``git clone --depth 1`` makes); otherwise
        (a tree that held a nested repository) a new commit of those files.

        :return: the sha of HEAD.
        """
        await self._git("add", "--all", "--force")
        tree = (await self._git("write-tree")).strip()
        if git_object.startswith(f"tree {tree}\n".encode()):
            made = (await self._git("hash-object", "-t", "commit", "-w", "--stdin",
                                    stdin=git_object)).strip()
            if made == sha:
                if b"\nparent " in git_object.split(b"\n\n", 1)[0]:
                    await trio.Path(self.git_dir / "shallow").write_text(f"{sha}\n")
                await self._git("update-ref", "HEAD", sha)
                return sha
        await self._git("commit", "--quiet", "--no-verify", "--allow-empty",
                        f"--message=Files of commit {sha}")
        return (await self._git("rev-parse", "HEAD")).strip()

    async def _has_commits(self) -> bool:
        result = await self._run_git("rev-parse", "--verify", "--quiet", "HEAD")
        return result.returncode == 0

    async def _git(self, *arguments: str, stdin: bytes = b"") -> str:
        """Run one git command in the workspace and return its standard output.

        :raises WorkspaceError: when git exits with a non-zero status.
        """
        return (await self._git_bytes(*arguments, stdin=stdin)).decode("utf-8", "replace")

    async def _git_bytes(self, *arguments: str, stdin: bytes = b"") -> bytes:
        """Like :meth:`_git`, the standard output as bytes."""
        result = await self._run_git(*arguments, stdin=stdin)
        if result.returncode != 0:
            detail = result.stderr.decode("utf-8", "replace").strip() or "no output"
            raise WorkspaceError(f"git {arguments[0]} failed: {detail}")
        return result.stdout

    async def _run_git(
        self, *arguments: str, stdin: bytes = b""
    ) -> subprocess.CompletedProcess[bytes]:
        return await trio.run_process(
            ["git", f"--git-dir={self.git_dir}", f"--work-tree={self.root}",
             *_GIT_SAFETY_OPTIONS, *arguments], cwd=self.root, env=_git_environment(),
            stdin=stdin, capture_stdout=True, capture_stderr=True, check=False)


def _git_environment() -> dict[str, str]:
    return {**os.environ, **_GIT_ENV_OVERRIDES}

