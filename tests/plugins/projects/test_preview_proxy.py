"""Server mode of the preview over real HTTP: what goes in and out of the proxy, one server per
work tree, the files again once it stops, and a cancelled run's server killed."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import trio

from plugins.projects.preview import PREVIEW_HEADERS
from plugins.projects.preview_proxy import MAX_BODY_BYTES
from plugins.projects.state import PROJECTS_STATE
from runtime.sandbox import DevServer, LiveServer
from tests.support.fake_openai import FakeOpenAI, Stall, StreamedTurn
from tests.support.projects import eventually, new_project, serve_projects, token_owner
from tests.support.sandbox import left_running
from tests.support.server import client
from tests.support.sse import open_sse

SERVER = """import json, http.server, sys

class Handler(http.server.BaseHTTPRequestHandler):
    def do_HEAD(self):
        self.send_response(200)
        self.send_header("Content-Type", "text/x-head")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def do_GET(self):
        if self.path == "/moved":
            self.send_response(302)
            self.send_header("Location", "/elsewhere?a=1")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        if self.path == "/endless":  # no length: the body runs until the connection closes
            self.send_response(200)
            self.end_headers()
            for _ in range(25 * 16):
                self.wfile.write(b"x" * 65536)
            return
        if self.path == "/huge":
            self.send_response(200)
            self.send_header("Content-Length", str(64 * 1024 * 1024))
            self.end_headers()
            return
        body = json.dumps({"name": sys.argv[2], "path": self.path,
                           "headers": {k.lower(): v for k, v in self.headers.items()}}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Set-Cookie", "planted=1")
        self.send_header("Content-Security-Policy", "default-src *")
        self.end_headers()
        self.wfile.write(body)

http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), Handler).serve_forever()
"""


async def test_the_proxy_passes_little_in_and_out_and_one_server_lives(tmp_path: Path) -> None:
    async with serve_projects(tmp_path / "var", f"sqlite:///{tmp_path / 'db.sqlite'}") \
            as running, token_owner(running, "proxy") as owner, client(running) as anonymous, \
            trio.open_nursery() as nursery:
        project = await new_project(owner, "proxy")
        root = running.service.state(PROJECTS_STATE).project_workspace(int(project["id"]))
        root.mkdir(parents=True, exist_ok=True)
        (root / "index.html").write_text("<h1>files</h1>")
        (root / "server.py").write_text(SERVER)
        sandbox = running.service.sandbox
        preview = f"/projects/{project['slug']}/preview/"
        first: LiveServer = await nursery.start(
            sandbox.serve, root, DevServer("python3 server.py 8101 first", 8101))
        second: LiveServer = await nursery.start(
            sandbox.serve, root, DevServer("python3 server.py 8102 second", 8102))
        assert first.scope.cancel_called  # one server per work tree: the first is stopped
        assert sandbox.live_server(root) is second

        answer = await anonymous.get(f"{preview}a/b?c=d", headers={
            "Cookie": "session=secret", "Authorization": "Bearer secret",
            "Accept": "application/json", "X-Forwarded-For": "203.0.113.9"})
        seen = answer.json()
        assert seen["name"] == "second" and seen["path"] == "/a/b?c=d"
        assert set(seen["headers"]) <= {"host", "accept", "accept-encoding", "connection",
                                        "user-agent"}
        assert seen["headers"]["accept"] == "application/json"
        assert "set-cookie" not in answer.headers
        for name, value in PREVIEW_HEADERS.items():  # the server's own CSP is replaced
            assert answer.headers[name] == value
        moved = await anonymous.get(f"{preview}moved")
        assert moved.status_code == 302
        assert moved.headers["location"] == f"{preview}elsewhere?a=1"  # kept under the root
        huge = await anonymous.get(f"{preview}huge")
        assert huge.status_code == 413 and huge.json()["error"]["code"] == "payload_too_large"
        endless = await anonymous.get(f"{preview}endless")  # cut at the cap, status sent
        assert endless.status_code == 200 and len(endless.content) <= MAX_BODY_BYTES
        assert len(endless.content) >= MAX_BODY_BYTES - 65536
        head = await anonymous.head(preview)
        assert head.status_code == 200 and head.headers["content-type"] == "text/x-head"

        second.scope.cancel()
        await eventually(lambda: _files_again(anonymous, preview))
        assert sandbox.live_server(root) is None

        async def all_gone() -> bool:  # killed with its whole sandbox, a moment later
            return left_running(root, b"server.py") == []

        await eventually(all_gone)


async def _files_again(http: httpx.AsyncClient, preview: str) -> bool:
    return (await http.get(preview)).text == "<h1>files</h1>"


async def test_a_cancelled_runs_server_is_killed(tmp_path: Path, nursery: trio.Nursery) -> None:
    model = FakeOpenAI([
        StreamedTurn("", [("write_file", json.dumps({"path": "server.py", "content": SERVER})),
                          ("start_preview", json.dumps({
                              "command": "python3 server.py 8103 run", "port": 8103}))]),
        Stall(300)])
    base_url = await nursery.start(model.serve)
    async with serve_projects(tmp_path / "var", f"sqlite:///{tmp_path / 'db.sqlite'}",
                              backend="openai", model_base_url=base_url, model="m") as running, \
            token_owner(running, "cancel") as owner:
        project = await new_project(owner, "cancel")
        slug, preview = project["slug"], f"/projects/{project['slug']}/preview/"
        root = running.service.state(PROJECTS_STATE).project_workspace(int(project["id"]))
        async with open_sse(running.base_url, f"/projects/{slug}/stream") as stream:
            assert (await owner.post(f"/projects/{slug}/start")).status_code == 201

            async def serving() -> bool:
                return '"name": "run"' in (await owner.get(preview)).text

            await eventually(serving, timeout=60)
            assert (await owner.post(f"/projects/{slug}/cancel")).status_code == 200
            events = await stream.until("done", timeout=60)
        assert events[-1].json()["finalStatus"] == "cancelled"
        assert running.service.sandbox.live_server(root) is None
        assert left_running(root, b"server.py 8103") == []
        assert (await owner.get(preview)).status_code == 404  # no index.html: files again
