"""A model run that writes an app, runs its test in the sandbox, fixes a failure, takes a
screenshot and starts a preview server; the preview shows that server's answer in headless
Chromium while the run lives, and the files once it has ended (embedded default, and
PostgreSQL with Redis).

The model is a scripted OpenAI-compatible server on loopback; its last turn waits for the
test to have looked at the live preview, so the run (and its server) is alive meanwhile.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio

from plugins.projects.preview import PREVIEW_HEADERS
from tests.support.backends import POSTGRES_URL, REDIS_URL, postgres_schema
from tests.support.chromium import chromium
from tests.support.fake_openai import FakeOpenAI, Gated, StreamedTurn
from tests.support.projects import (
    assert_well_formed,
    eventually,
    new_project,
    serve_projects,
    token_owner,
)
from tests.support.sandbox import read_png
from tests.support.server import client
from tests.support.sse import open_sse

OFFLINE = "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1"
SERVER = """import html, http.server, sys

def render(path):
    return ("<!doctype html><title>Live</title><h1 id=who>server</h1><p id=path>"
            + html.escape(path) + "</p><script>"
            "document.getElementById('who').textContent = 'live ' + (6 * 7);</script>")

class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = render(self.path).encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Set-Cookie", "planted=1")
        self.end_headers()
        self.wfile.write(body)

if __name__ == "__main__":
    http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), Handler).serve_forever()
"""
BROKEN_SERVER = SERVER.replace("'live ' + (6 * 7)", "'dead'")
TEST = "from server import render\nassert 'live' in render('/'), 'no live script'\nprint('ok')\n"
STATIC = "<!doctype html><title>Static</title><h1 id=who>static</h1>"


@pytest.fixture(params=["embedded"] + (["postgresql+redis"] if POSTGRES_URL and REDIS_URL else []))
def stores(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, str]]:
    if request.param == "embedded":
        yield f"sqlite:///{tmp_path / 'flowsvc.db'}", ""
        return
    with postgres_schema() as url:
        yield url, REDIS_URL


def turn(text: str, *calls: tuple[str, dict[str, Any]]) -> StreamedTurn:
    return StreamedTurn(text, [(name, json.dumps(args)) for name, args in calls])


def script(gate: trio.Event) -> FakeOpenAI:
    return FakeOpenAI([
        turn("Plan:\n1. Write the app\n2. Test it\n3. Show it",
             ("write_file", {"path": "server.py", "content": BROKEN_SERVER}),
             ("write_file", {"path": "test_app.py", "content": TEST}),
             ("write_file", {"path": "index.html", "content": STATIC})),
        turn("", ("run_command", {"command": "python3 test_app.py"})),
        turn("The test failed: fixing the page script.",
             ("write_file", {"path": "server.py", "content": SERVER}),
             ("run_command", {"command": "python3 test_app.py"})),
        turn("", ("take_screenshot", {"path": "index.html"}),
             ("git_commit", {"message": "A live page"})),
        turn("", ("start_preview", {"command": "python3 server.py 8080", "port": 8080})),
        Gated(gate, turn("The app is live.")),
    ])


async def test_a_run_builds_tests_fixes_shoots_and_previews_its_server(
        tmp_path: Path, stores: tuple[str, str], nursery: trio.Nursery) -> None:
    database_url, redis_url = stores
    gate = trio.Event()
    model = script(gate)
    base_url = await nursery.start(model.serve)
    async with serve_projects(tmp_path / "var", database_url, redis_url, backend="openai",
                              model_base_url=base_url, model="m") as running, \
            token_owner(running, "live") as http, client(running) as anonymous:
        slug = (await new_project(http, "live"))["slug"]
        preview = f"/projects/{slug}/preview/"
        async with open_sse(running.base_url, f"/projects/{slug}/stream") as stream:
            assert (await http.post(f"/projects/{slug}/start")).status_code == 201

            async def serving() -> bool:
                return "id=path" in (await anonymous.get(preview)).text

            await eventually(serving, timeout=60)
            live = await anonymous.get(f"{preview}some/where?x=1", headers={"Cookie": "a=b"})
            assert live.status_code == 200
            assert "<p id=path>/some/where?x=1</p>" in live.text  # path and query passed on
            assert "set-cookie" not in live.headers  # the server's cookie is not passed back
            for name, value in PREVIEW_HEADERS.items():
                assert live.headers[name] == value
            async with chromium(tmp_path / "profile", OFFLINE) as browser:
                await browser.navigate(f"{running.base_url}{preview}")
                shown = await browser.wait_for(
                    "document.getElementById('who').textContent.startsWith('live') && "
                    "document.getElementById('who').textContent")
                gate.set()
                events = await stream.until("done", timeout=60)
                await browser.navigate(f"{running.base_url}{preview}")
                after = await browser.evaluate("document.getElementById('who').textContent")
        assert shown == "live 42"  # the server's page, its script run
        assert after == "static"  # the run ended: its server is gone, the files are served
        assert_well_formed(events)
        assert [event.event for event in events] == [
            "plan", "message",
            "tool_call", "tool_result", "tool_call", "tool_result", "tool_call", "tool_result",
            "tool_call", "tool_result",
            "message", "tool_call", "tool_result", "tool_call", "tool_result",
            "tool_call", "tool_result", "screenshot", "tool_call", "tool_result", "commit",
            "tool_call", "tool_result", "message", "done"]
        results = [event.json() for event in events if event.event == "tool_result"]
        assert results[3]["result"]["exitCode"] == 1
        assert "no live script" in results[3]["result"]["output"]
        assert results[5]["result"]["exitCode"] == 0 and results[5]["result"]["output"] == "ok\n"
        public = running.service.settings.service.public_url
        assert results[8] == {"callId": "call-9", "result": {
            "url": f"{public}{preview}", "port": 8080, "command": "python3 server.py 8080"}}
        [shot] = [event.json() for event in events if event.event == "screenshot"]
        picture = await anonymous.get(shot["url"].removeprefix(public))
        assert picture.headers["content-type"] == "image/png"
        assert read_png(picture.content).width == 1280
        assert events[-1].json()["finalStatus"] == "completed"
        assert events[-1].json()["previewUrl"] == f"{public}{preview}"
        assert STATIC in (await anonymous.get(preview)).text
        offered = {tool["function"]["name"] for tool in model.requests[0].body["tools"]}
        assert "start_preview" in offered
