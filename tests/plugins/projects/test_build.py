"""A full build over real HTTP and SSE with the offline backend (SQLite and PostgreSQL)."""

from __future__ import annotations

import io
import zipfile
from pathlib import Path

from plugins.projects.engine.ending import PROJECT_COMPLETED
from runtime.server import Running
from tests.support.projects import (
    EventRecorder,
    assert_well_formed,
    new_project,
    serve_projects,
    token_owner,
)
from tests.support.sandbox import git as git_output
from tests.support.sandbox import read_png
from tests.support.server import client
from tests.support.sse import open_sse


async def git(workspace: Path, *arguments: str) -> list[str]:
    return (await git_output(workspace, *arguments)).splitlines()


def workspace_of(running: Running, project_id: str) -> Path:
    return running.service.settings.service.var_dir / "workspaces" / project_id


async def test_a_full_offline_build(tmp_path: Path, database_url: str) -> None:
    async with serve_projects(tmp_path / "var", database_url) as running:
        recorder = EventRecorder()
        running.service.pm.register(recorder, name="recorder")
        async with token_owner(running, "luigi") as http:
            project = await new_project(http, "luigi")
            assert project["slug"] == "luigi-s-pizza" and project["status"] == "idle"
            assert project["tokenSlug"] == "luigi" and project["id"].isdigit()
            assert project["createdAt"].endswith("Z")
            slug = project["slug"]
            async with open_sse(running.base_url, f"/projects/{slug}/stream") as stream:
                assert stream.status == 200
                assert stream.headers["content-type"] == "text/event-stream"
                assert stream.headers["x-accel-buffering"] == "no"
                assert stream.headers["cache-control"] == "no-cache"
                started = await http.post(f"/projects/{slug}/start")
                assert started.status_code == 201, started.text
                run_id = started.json()["runId"]
                events = await stream.until("done")
            assert stream.retry == 3000
            assert_well_formed(events)
            preview = f"{running.service.settings.service.public_url}/projects/{slug}/preview/"
            assert events[0].event == "plan" and events[-1].json() == {
                "runId": run_id, "finalStatus": "completed", "previewUrl": preview}

            workspace = workspace_of(running, project["id"])
            commits = [event.json() for event in events if event.event == "commit"]
            assert len(commits) == 3
            log = await git(workspace, "log", "--format=%H %s")
            assert log == [f"{c['sha']} {c['message']}" for c in reversed(commits)]
            for commit in commits:
                shown = await git(workspace, "show", "--name-only", "--format=", commit["sha"])
                assert sorted(commit["files"]) == sorted(shown)

            view = (await http.get(f"/projects/{slug}")).json()
            assert view["status"] == "completed"
            assert view["lastRun"]["runId"] == run_id
            assert view["lastRun"]["sha"] == commits[-1]["sha"]
            last_sha = commits[-1]["sha"]
            assert view["artifactUrl"].endswith(f"/projects/{slug}/artifact?ref={last_sha}")

            [completed] = [e for e in recorder.events if e.name == PROJECT_COMPLETED]
            assert completed.data["slug"] == slug and completed.data["run_id"] == run_id
            assert completed.data["artifact_url"] == view["artifactUrl"]
            assert completed.data["preview_url"] == preview
            assert str(completed.user_id) == view["ownerId"]

            async with client(running) as anonymous:
                artifact = await anonymous.get(f"/projects/{slug}/artifact",
                                               params={"ref": commits[-1]["sha"]})
                assert artifact.status_code == 200
                assert artifact.headers["content-type"] == "application/zip"
                names = zipfile.ZipFile(io.BytesIO(artifact.content)).namelist()
                assert {"index.html", "app.js", "server.py", "README.md"} <= set(names)
                first = await anonymous.get(f"/projects/{slug}/artifact",
                                            params={"ref": commits[0]["sha"]})
                assert "server.py" not in zipfile.ZipFile(io.BytesIO(first.content)).namelist()
                [shot] = [event.json() for event in events if event.event == "screenshot"]
                picture = await anonymous.get(shot["url"].split("127.0.0.1:8000", 1)[1])
                assert picture.status_code == 200
                assert picture.headers["content-type"] == "image/png"
                assert picture.headers["content-security-policy"] == "sandbox"
                assert picture.headers["x-content-type-options"] == "nosniff"
                assert read_png(picture.content).width == 1280
                for path in ("../../secrets.json", ".git/config", "nope.txt"):
                    refused = await anonymous.get(f"/projects/{slug}/files/{path}")
                    assert refused.status_code == 404, path

            again = await http.post(f"/projects/{slug}/start")
            assert again.status_code == 201
            async with open_sse(running.base_url, f"/projects/{slug}/stream") as stream:
                second_run = await stream.until("done")
            assert second_run[0].id == str(len(events) + 1)
            assert second_run[-1].json()["runId"] == again.json()["runId"]
