"""Events published while Redis is down still reach a reader on another service process."""

from __future__ import annotations

from pathlib import Path

import trio

from tests.support.fake_openai import FakeOpenAI, Stall, StreamedTurn
from tests.support.private_servers import private_redis
from tests.support.projects import assert_well_formed, new_project, projects_env, token_owner
from tests.support.server import make_settings, running_server
from tests.support.sse import open_sse


async def test_events_published_during_a_redis_outage_reach_the_other_process(
        tmp_path: Path, nursery: trio.Nursery) -> None:
    # The run's second model call stalls until it times out: the run then fails, and its
    # last events (error, done) are published while Redis is down.
    model = FakeOpenAI([StreamedTurn("Plan:\n1. Look\n2. Wait", [("list_files", "{}")]),
                        Stall(60)])
    model_url = await nursery.start(model.serve)
    database_url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    with private_redis() as redis:
        def env(name: str) -> dict[str, str]:
            return projects_env(tmp_path / name, database_url=database_url,
                                redis_url=redis.url, prefix="outage:", backend="openai",
                                model_base_url=model_url, model="fake",
                                model_timeout_seconds="3", heartbeat_seconds="1")

        async with running_server(make_settings(env("a")), env("a")) as on_a, \
                running_server(make_settings(env("b")), env("b")) as on_b, \
                token_owner(on_a, "outage") as http:
            slug = (await new_project(http, "outage"))["slug"]
            path = f"/projects/{slug}/stream"
            async with open_sse(on_b.base_url, path) as remote, \
                    open_sse(on_a.base_url, path) as local:
                assert (await http.post(f"/projects/{slug}/start")).status_code == 201
                before = [await remote.next_event() for _ in range(4)]
                assert [event.event for event in before] == [
                    "plan", "message", "tool_call", "tool_result"]
                redis.stop()
                seen_on_b = await remote.until("done", timeout=30)
                seen_on_a = await local.until("done", timeout=30)
    assert seen_on_b == seen_on_a
    assert_well_formed(seen_on_b)
    assert [event.event for event in seen_on_b[4:]] == ["error", "done"]
    assert seen_on_b[-1].json()["finalStatus"] == "failed"
