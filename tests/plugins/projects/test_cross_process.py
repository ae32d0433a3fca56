"""Two service processes sharing PostgreSQL and Redis: a reader on process B follows, and
cancels, runs that execute on process A; B's preview of a run's server on A is the files."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
import trio

from tests.support.backends import POSTGRES_URL, REDIS_URL, postgres_schema, redis_prefix
from tests.support.fake_openai import FakeOpenAI, Stall, StreamedTurn
from tests.support.projects import assert_well_formed, eventually, projects_env
from tests.support.server import free_port
from tests.support.sse import open_sse
from tests.support.tokens import add_token
from tests.support.wallet import sign_in
from tests.support.webhooks import migrate_schema, service_processes


@pytest.mark.postgres
@pytest.mark.redis
async def test_a_reader_on_process_b_follows_a_run_on_process_a(
        tmp_path: Path, nursery: trio.Nursery) -> None:
    assert POSTGRES_URL and REDIS_URL, (
        "this test needs FLOWSVC_TEST_POSTGRES_URL and FLOWSVC_TEST_REDIS_URL (deselect it "
        "with -m 'not redis' where they are not available)")
    model = FakeOpenAI([StreamedTurn("Plan:\n1. Look\n2. Report", [("list_files", "{}")] * 5),
                        StreamedTurn("All done."), Stall(30)])
    model_url = await nursery.start(model.serve)
    with postgres_schema() as database_url:
        env = projects_env(tmp_path / "var", database_url=database_url, redis_url=REDIS_URL,
                           prefix=redis_prefix(), backend="openai", model_base_url=model_url,
                           model="fake")
        port_a, port_b = free_port(), free_port()
        # The schema migrated first, both processes start at once on it.
        await migrate_schema(env)
        env["FLOWSVC_DATABASE_MIGRATE_ON_START"] = "false"
        async with service_processes(env, [port_a, port_b]):
            url_a, url_b = f"http://127.0.0.1:{port_a}", f"http://127.0.0.1:{port_b}"
            async with httpx.AsyncClient(base_url=url_a, timeout=30) as on_a:
                wallet, _ = await sign_in(on_a)
                assert (await add_token(url_a, "twin", wallet.address.lower())).status_code == 201
                created = await on_a.post("/projects", json={
                    "tokenSlug": "twin", "title": "Twin", "agentTemplate": "research-agent",
                    "brief": "Compare the two processes."})
                slug = created.json()["slug"]
                path = f"/projects/{slug}/stream"
                async with open_sse(url_b, path) as on_b, open_sse(url_a, path) as local:
                    started = await on_a.post(f"/projects/{slug}/start")
                    assert started.status_code == 201
                    seen_on_b = await on_b.until("done")
                    seen_on_a = await local.until("done")
                assert seen_on_b == seen_on_a
                assert_well_formed(seen_on_b)
                assert len(seen_on_b) == 2 + 10 + 2
                done = seen_on_b[-1].json()
                assert done.pop("previewUrl").endswith(f"/projects/{slug}/preview/")
                assert done == {"runId": started.json()["runId"], "finalStatus": "completed"}

                async with httpx.AsyncClient(base_url=url_b, timeout=30,
                                             cookies=on_a.cookies) as on_b_http:
                    async with open_sse(url_b, path, {"Last-Event-ID": "14"}) as on_b:
                        assert (await on_a.post(f"/projects/{slug}/start")).status_code == 201

                        async def model_asked() -> bool:
                            return len(model.requests) == 3

                        await eventually(model_asked)
                        cancelled = await on_b_http.post(f"/projects/{slug}/cancel")
                        assert cancelled.json()["status"] == "cancelled"
                        assert [event.event for event in await on_b.until("done")] == ["done"]


@pytest.mark.postgres
@pytest.mark.redis
async def test_a_preview_server_is_seen_on_its_runs_process_only(
        tmp_path: Path, nursery: trio.Nursery) -> None:
    assert POSTGRES_URL and REDIS_URL, "this test needs PostgreSQL and Redis"
    start = {"command": "mkdir -p live && echo '<h1>server</h1>' > live/index.html && exec "
                        "python3 -m http.server 8110 --bind 127.0.0.1 --directory live",
             "port": 8110}
    model = FakeOpenAI([StreamedTurn("", [
        ("write_file", json.dumps({"path": "index.html", "content": "<h1>files</h1>"})),
        ("start_preview", json.dumps(start))]), Stall(60)])
    model_url = await nursery.start(model.serve)
    with postgres_schema() as database_url:
        env = projects_env(tmp_path / "var", database_url=database_url, redis_url=REDIS_URL,
                           prefix=redis_prefix(), backend="openai", model_base_url=model_url,
                           model="fake")
        port_a, port_b = free_port(), free_port()
        # The schema migrated first, both processes start at once on it.
        await migrate_schema(env)
        env["FLOWSVC_DATABASE_MIGRATE_ON_START"] = "false"
        async with service_processes(env, [port_a, port_b]):
            url_a, url_b = f"http://127.0.0.1:{port_a}", f"http://127.0.0.1:{port_b}"
            async with httpx.AsyncClient(base_url=url_a, timeout=30) as on_a, \
                    httpx.AsyncClient(base_url=url_b, timeout=30) as on_b:
                wallet, _ = await sign_in(on_a)
                assert (await add_token(url_a, "twin", wallet.address.lower())).status_code == 201
                created = await on_a.post("/projects", json={
                    "tokenSlug": "twin", "title": "Twin", "agentTemplate": "fullstack-builder",
                    "brief": "Serve a page."})
                preview = f"/projects/{created.json()['slug']}/preview/"
                assert (await on_a.post(f"/projects/{created.json()['slug']}/start")
                        ).status_code == 201

                async def served_on_a() -> bool:
                    return "<h1>server</h1>" in (await on_a.get(preview)).text

                await eventually(served_on_a, timeout=60)
                # B shares the database and the work tree, not A's socket: it serves the files.
                assert (await on_b.get(preview)).text == "<h1>files</h1>"
