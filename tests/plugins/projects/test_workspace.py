"""Workspace: safe paths, real git commits, and commits rebuilt from their files."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import trio

from plugins.projects.engine.workspace import (
    EXECUTABLE_MODE,
    GIT_USER_EMAIL,
    GIT_USER_NAME,
    REGULAR_MODE,
    SYMLINK_MODE,
    Workspace,
    WorkspaceError,
    git_dir_of,
)
from tests.support.sandbox import git


@pytest.fixture
def workspace(tmp_path: Path) -> Workspace:
    return Workspace(tmp_path / "project")


async def test_commits_work_without_any_git_config(
    workspace: Workspace, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    empty_home = tmp_path / "home"
    empty_home.mkdir()
    monkeypatch.setenv("HOME", str(empty_home))
    for variable in ("GIT_AUTHOR_NAME", "GIT_AUTHOR_EMAIL", "EMAIL"):
        monkeypatch.delenv(variable, raising=False)

    await workspace.write_file("index.html", "<h1>hi</h1>")
    await workspace.write_file("src/app.js", "console.log(1)")
    commit = await workspace.commit("First build")

    assert commit.sha == (await git(workspace.root, "rev-parse", "HEAD")).strip()
    assert commit.files == ["index.html", "src/app.js"]
    assert commit.message == "First build"
    author = (await git(workspace.root, "log", "-1", "--format=%an <%ae>")).strip()
    assert author == f"{GIT_USER_NAME} <{GIT_USER_EMAIL}>"


async def test_a_commit_lists_only_the_files_it_changed(workspace: Workspace) -> None:
    await workspace.write_file("a.txt", "one")
    await workspace.write_file("b.txt", "one")
    first = await workspace.commit("Add a and b")
    await workspace.write_file("b.txt", "two")
    second = await workspace.commit("Change b")

    assert second.files == ["b.txt"]
    assert second.sha != first.sha
    log = (await git(workspace.root, "log", "--format=%H %s")).splitlines()
    assert log == [f"{second.sha} Change b", f"{first.sha} Add a and b"]


async def test_nothing_to_commit_is_an_error(workspace: Workspace) -> None:
    await workspace.write_file("a.txt", "one")
    await workspace.commit("Add a")
    with pytest.raises(WorkspaceError, match="nothing to commit"):
        await workspace.commit("Again")
    with pytest.raises(WorkspaceError, match="empty"):
        await workspace.commit("   ")


@pytest.mark.parametrize("path", [
    "../outside.txt", "a/../../outside.txt", "/etc/passwd", "", ".git/hooks/pre-commit",
    "sub/.git/config", ".", "bad\0name",
])
async def test_unsafe_paths_are_refused(workspace: Workspace, tmp_path: Path, path: str) -> None:
    with pytest.raises(WorkspaceError):
        await workspace.write_file(path, "#!/bin/sh\necho pwned\n")
    assert not (tmp_path / "outside.txt").exists()
    assert not (workspace.root / ".git" / "hooks" / "pre-commit").exists()


async def test_symlinks_that_leave_the_workspace_are_refused(
    workspace: Workspace, tmp_path: Path
) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("secret")
    await workspace.ensure_repository()
    (workspace.root / "linked-dir").symlink_to(outside)
    (workspace.root / "linked-file").symlink_to(outside / "secret.txt")
    (workspace.root / "dangling").symlink_to(outside / "new.txt")

    for path in ("linked-dir/secret.txt", "linked-file"):
        with pytest.raises(WorkspaceError, match="outside the workspace"):
            await workspace.read_file(path)
    for path in ("linked-dir/planted.txt", "dangling", "linked-file"):
        with pytest.raises(WorkspaceError, match="outside the workspace"):
            await workspace.write_file(path, "planted")
    assert sorted(entry.name for entry in outside.iterdir()) == ["secret.txt"]
    assert (outside / "secret.txt").read_text() == "secret"


async def test_a_symlink_inside_the_workspace_is_followed(workspace: Workspace) -> None:
    await workspace.write_file("docs/real.md", "real")
    (workspace.root / "alias").symlink_to(workspace.root / "docs")
    assert await workspace.read_file("alias/real.md") == ("real", False)


async def test_read_file_truncates_and_rejects_binary(workspace: Workspace) -> None:
    await workspace.write_file("long.txt", "é" * 10)
    assert await workspace.read_file("long.txt", max_bytes=5) == ("éé", True)
    (workspace.root / "blob.bin").write_bytes(b"\xff\xfe\x00")
    with pytest.raises(WorkspaceError, match="not UTF-8"):
        await workspace.read_file("blob.bin")
    with pytest.raises(WorkspaceError, match="does not exist"):
        await workspace.read_file("missing.txt")


async def test_list_files_excludes_git(workspace: Workspace) -> None:
    await workspace.write_file("b.txt", "b")
    await workspace.write_file("dir/a.txt", "a")
    await workspace.commit("Add files")
    assert await workspace.list_files() == ["b.txt", "dir/a.txt"]


async def test_head_is_the_last_commit(workspace: Workspace) -> None:
    assert await workspace.head() is None
    assert not await workspace.descends_from("0" * 40)
    await workspace.write_file("a.txt", "one")
    first = await workspace.commit("First")
    await workspace.write_file("b.txt", "two")
    second = await workspace.commit("Second")
    assert await workspace.head() == second.sha
    assert await workspace.descends_from(first.sha) and await workspace.descends_from(second.sha)
    assert not await workspace.descends_from("0" * 40)


async def test_a_commit_rebuilt_from_its_files_has_its_sha(workspace: Workspace,
                                                           tmp_path: Path) -> None:
    await workspace.write_file("index.html", "<h1>hi</h1>")
    await workspace.commit("First")
    await workspace.write_file("run.sh", "#!/bin/sh\necho hi\n")
    (workspace.root / "run.sh").chmod(0o755)
    (workspace.root / "home.html").symlink_to("index.html")
    second = await workspace.commit("Second")
    await workspace.write_file("draft.txt", "uncommitted")
    files = await workspace.tree_files(second.sha)
    assert [(file.path, file.mode, file.size) for file in files] == [
        ("home.html", SYMLINK_MODE, 10), ("index.html", REGULAR_MODE, 11),
        ("run.sh", EXECUTABLE_MODE, 18)]
    contents = await workspace.blob_contents([file.oid for file in files])

    rebuilt = Workspace(tmp_path / "elsewhere" / "project")
    await rebuilt.clear()
    for file in files:
        await rebuilt.put_file(file.path, file.mode, contents[file.oid])
    git_object = await workspace.commit_object(second.sha)
    assert await rebuilt.adopt_commit(second.sha, git_object) == second.sha
    assert await rebuilt.head() == second.sha
    assert os.readlink(rebuilt.root / "home.html") == "index.html"
    assert os.access(rebuilt.root / "run.sh", os.X_OK)
    assert await rebuilt.list_files() == ["home.html", "index.html", "run.sh"]
    await rebuilt.write_file("b.txt", "two")
    third = await rebuilt.commit("Third")
    log = (await git(rebuilt.root, "log", "--format=%H")).split()
    assert log == [third.sha, second.sha]  # the history before the rebuilt commit is absent


async def test_a_path_too_long_to_store_is_refused(workspace: Workspace) -> None:
    deep = "/".join(["d" * 200] * 6) + "/file.txt"
    await workspace.write_file(deep, "deep")
    with pytest.raises(WorkspaceError, match="over 1024 bytes long"):
        await workspace.commit("Too deep")
    assert await workspace.head() is None
    assert (await git(workspace.root, "diff", "--cached", "--name-only")).strip() == ""


async def test_the_git_directory_lies_outside_the_work_tree(workspace: Workspace,
                                                           tmp_path: Path) -> None:
    """A .git the agent makes in its work tree (hooks, fsmonitor, a clean filter) is never
    the one the service's git uses, so none of it runs at a commit."""
    await workspace.ensure_repository()
    assert workspace.git_dir == tmp_path / "project.git" and workspace.git_dir.is_dir()
    planted = workspace.root / ".git"
    (planted / "hooks").mkdir(parents=True)
    marker = tmp_path / "ran"
    (planted / "hooks" / "pre-commit").write_text(f"#!/bin/sh\ntouch {marker}\n")
    (planted / "hooks" / "pre-commit").chmod(0o755)
    (planted / "config").write_text(f"[core]\n\tfsmonitor = touch {marker}\n"
                                     f"[filter \"x\"]\n\tclean = touch {marker}\n")
    (workspace.root / ".gitattributes").write_text("* filter=x\n")
    await workspace.write_file("a.txt", "a")
    commit = await workspace.commit("Add a")
    assert not marker.exists()
    assert sorted(commit.files) == [".gitattributes", "a.txt"]
    assert (await git(workspace.root, "rev-parse", "HEAD")).strip() == commit.sha


async def test_an_in_tree_repository_moves_out_with_a_fresh_config(tmp_path: Path) -> None:
    root = tmp_path / "old"
    root.mkdir()
    marker = tmp_path / "ran"
    for arguments in (["init", "--quiet", "--initial-branch=main"],
                      ["-c", "user.name=a", "-c", "user.email=a@b", "commit", "--quiet",
                       "--allow-empty", "-m", "Old"],
                      ["config", "filter.x.clean", f"touch {marker}"]):
        await trio.run_process(["git", *arguments], cwd=root)
    old_head = (await trio.run_process(["git", "rev-parse", "HEAD"], cwd=root,
                                       capture_stdout=True)).stdout.decode().strip()
    (root / ".gitattributes").write_text("* filter=x\n")
    workspace = Workspace(root)
    await workspace.ensure_repository()
    assert not (root / ".git").exists() and git_dir_of(root).is_dir()
    assert await workspace.head() == old_head
    await workspace.write_file("b.txt", "b")
    await workspace.commit("New")
    assert not marker.exists()
    assert "filter" not in (git_dir_of(root) / "config").read_text()
