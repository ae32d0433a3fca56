"""A build's files from any host: two services ("host A" and "host B"), each with its own
workspace root, share one database (SQLite and PostgreSQL) and nothing else.

A run on A commits a page, takes a screenshot of it (which no commit holds) and then fails
(its model answers an error). B, which never ran the project, serves that failed run's last
commit (file and zip) and its screenshot from the database; then a
run on B starts from A's files (its workspace rebuilt, HEAD A's very commit) and commits,
and A serves B's commit, and its preview (A's workspace rebuilt at B's commit).
Contents are stored once, in chunks, and zipped with their modes.
"""

from __future__ import annotations

import io
import json
import zipfile
from contextlib import AbstractAsyncContextManager
from pathlib import Path

import trio
from sqlalchemy import Connection, func, select

from plugins.projects.engine.commit_store import SnapshotReader, store_snapshot
from plugins.projects.engine.workspace import Workspace
from plugins.projects.tables import blob_chunks
from runtime.server import Running
from tests.support.fake_openai import FakeOpenAI, HttpFailure, StreamedTurn
from tests.support.projects import new_project, serve_projects, token_owner
from tests.support.sandbox import git
from tests.support.server import client
from tests.support.sse import open_sse

PAGE = "<h1>Luigi's</h1>\n"


def host(tmp_path: Path, name: str, database_url: str, model_url: str
         ) -> AbstractAsyncContextManager[Running]:
    """One host: its own var directory (so its own workspace root), the shared database."""
    return serve_projects(tmp_path / name, database_url, backend="openai",
                          model_base_url=model_url, model="fake-model")


def workspace_of(running: Running, project_id: str) -> Path:
    return running.service.settings.service.var_dir / "workspaces" / project_id


def calls(*pairs: tuple[str, dict[str, str]]) -> list[tuple[str, str]]:
    return [(name, json.dumps(args)) for name, args in pairs]


async def test_a_build_made_on_one_host_is_served_and_continued_on_another(
        tmp_path: Path, database_url: str, nursery: trio.Nursery) -> None:
    model = FakeOpenAI([
        StreamedTurn("Writing the page", calls(
            ("write_file", {"path": "index.html", "content": PAGE}),
            ("write_file", {"path": "docs/notes.md", "content": "# Notes\n"}),
            ("git_commit", {"message": "Add the home page"}),
            ("take_screenshot", {"path": "index.html"}))),
        HttpFailure(401, "the model refuses"),  # the run on A fails after its commit
        StreamedTurn("Adding a page", calls(
            ("read_file", {"path": "index.html"}),
            ("write_file", {"path": "about.html", "content": "<p>About</p>"}),
            ("git_commit", {"message": "Add the about page"}))),
        StreamedTurn("Done."),
    ])
    model_url: str = await nursery.start(model.serve)
    async with host(tmp_path, "a", database_url, model_url) as host_a, \
            host(tmp_path, "b", database_url, model_url) as host_b, \
            token_owner(host_a, "luigi") as on_a, client(host_b) as anonymous_b:
        project = await new_project(on_a, "luigi")
        slug = project["slug"]
        async with open_sse(host_a.base_url, f"/projects/{slug}/stream") as stream:
            assert (await on_a.post(f"/projects/{slug}/start")).status_code == 201
            events = await stream.until("done")
        assert events[-1].json()["finalStatus"] == "failed"
        [commit_a] = [event.json() for event in events if event.event == "commit"]
        sha_a = commit_a["sha"]
        assert not workspace_of(host_b, project["id"]).exists()

        # B serves the screenshot, which only A's work tree holds (no commit does).
        [shot] = [event.json() for event in events if event.event == "screenshot"]
        assert set(shot) == {"url", "caption"}  # the spec's event: no work-tree path
        picture_path = "screenshots/index-1.png"
        assert shot["url"].endswith(f"/projects/{slug}/files/{picture_path}")
        picture = (workspace_of(host_a, project["id"]) / picture_path).read_bytes()
        served = await anonymous_b.get(f"/projects/{slug}/files/{picture_path}")
        assert served.status_code == 200, served.text
        assert served.content == picture and picture.startswith(b"\x89PNG")
        assert served.headers["content-type"] == "image/png"
        at_commit = await anonymous_b.get(f"/projects/{slug}/files/{picture_path}",
                                          params={"ref": sha_a})
        assert at_commit.status_code == 404  # the commit does not hold it

        # B serves the failed run's last commit: files and the zip, at HEAD and at its sha.
        for params in ({}, {"ref": sha_a}, {"ref": sha_a[:7]}):
            page = await anonymous_b.get(f"/projects/{slug}/files/index.html", params=params)
            assert page.status_code == 200, page.text
            assert page.text == PAGE and page.headers["content-security-policy"] == "sandbox"
            artifact = await anonymous_b.get(f"/projects/{slug}/artifact", params=params)
            assert artifact.status_code == 200, artifact.text
            archive = zipfile.ZipFile(io.BytesIO(artifact.content))
            assert archive.namelist() == ["docs/notes.md", "index.html"]
            assert archive.read("index.html").decode() == PAGE
            assert archive.testzip() is None
        missing = await anonymous_b.get(f"/projects/{slug}/artifact", params={"ref": "0" * 40})
        assert missing.status_code == 404
        absent = await anonymous_b.get(f"/projects/{slug}/files/nope.html")
        assert absent.status_code == 404
        assert not workspace_of(host_b, project["id"]).exists()

        # The next run, on B, starts from A's files, its HEAD A's very commit.
        on_b = client(host_b, cookies=on_a.cookies)
        async with on_b, open_sse(host_b.base_url, f"/projects/{slug}/stream") as stream:
            replayed = await stream.until("done")  # the run on A
            started = await on_b.post(f"/projects/{slug}/start")
            assert started.status_code == 201, started.text
            events = (await stream.until("done"))[len(replayed):]
        assert events[-1].json()["finalStatus"] == "completed", [e.data for e in events]
        [read] = [event.json() for event in events if event.event == "tool_result"
                  and isinstance(event.json()["result"], dict)
                  and "content" in event.json()["result"]]
        assert read["result"]["content"] == PAGE
        [commit_b] = [event.json() for event in events if event.event == "commit"]
        workspace_b = workspace_of(host_b, project["id"])
        log = (await git(workspace_b, "log", "--format=%H")).split()
        assert log == [commit_b["sha"], sha_a]

        # And A serves B's commit, which it never made.
        async with client(host_a) as anonymous_a:
            artifact = await anonymous_a.get(f"/projects/{slug}/artifact")
            names = zipfile.ZipFile(io.BytesIO(artifact.content)).namelist()
            assert names == ["about.html", "docs/notes.md", "index.html"]
            first = await anonymous_a.get(f"/projects/{slug}/artifact", params={"ref": sha_a})
            assert "about.html" not in zipfile.ZipFile(io.BytesIO(first.content)).namelist()
            # A's preview: its workspace, behind B's commit, is rebuilt at that commit.
            preview = await anonymous_a.get(f"/projects/{slug}/preview/about.html")
            assert preview.status_code == 200 and preview.text == "<p>About</p>"
        log = (await git(workspace_of(host_a, project["id"]), "log", "--format=%H")).split()
        assert log == [commit_b["sha"]]


async def test_stored_contents_are_chunked_shared_and_zipped_with_their_modes(
        tmp_path: Path, database_url: str) -> None:
    big = "".join(f"{line:09d}\n" for line in range(250_000)).encode()  # 2.5 MB: 3 chunks
    workspace = Workspace(tmp_path / "elsewhere")
    await workspace.write_file("big.txt", big)
    await workspace.write_file("run.sh", "#!/bin/sh\n")
    (workspace.root / "run.sh").chmod(0o755)
    (workspace.root / "link").symlink_to("big.txt")
    first = await workspace.commit("Big")
    await workspace.write_file("copy.txt", big)  # the same content under another name
    second = await workspace.commit("Copy")
    async with serve_projects(tmp_path / "var", database_url) as running, \
            token_owner(running, "luigi") as http:
        project = await new_project(http, "luigi")
        reader = SnapshotReader(workspace)
        for sha in (first.sha, second.sha):
            await running.service.db.write(store_snapshot, int(project["id"]), "run-1",
                                           await reader.read(sha))

        def chunks(connection: Connection) -> int:
            return int(connection.execute(select(func.count()).select_from(blob_chunks))
                       .scalar_one())

        # big.txt's (copy.txt's too), run.sh's and the link's (its target)
        assert await running.service.db.read(chunks) == 3 + 1 + 1
        slug = project["slug"]
        for path in ("big.txt", "copy.txt"):
            served = await http.get(f"/projects/{slug}/files/{path}")
            assert served.status_code == 200 and served.content == big
        assert (await http.get(f"/projects/{slug}/files/link")).status_code == 404
        artifact = await http.get(f"/projects/{slug}/artifact", params={"ref": first.sha})
        archive = zipfile.ZipFile(io.BytesIO(artifact.content))
        assert archive.namelist() == ["big.txt", "link", "run.sh"]
        assert archive.read("big.txt") == big and archive.read("link") == b"big.txt"
        modes = {entry.filename: entry.external_attr >> 16 for entry in archive.infolist()}
        assert modes == {"big.txt": 0o100644, "link": 0o120777, "run.sh": 0o100755}
