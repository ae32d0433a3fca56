"""The live preview over real HTTP: headers, folders, traversal, privacy, preview hosts.

The browser's side (scripts run, credentials stay out) is test_preview_browser.py.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import httpx

from plugins.projects.preview import preview_token
from plugins.projects.records.projects import get_project
from plugins.projects.state import PROJECTS_STATE
from runtime.server import Running
from tests.support.projects import GrantedFeatures, new_project, serve_projects, token_owner
from tests.support.server import client

CSP = "sandbox allow-scripts allow-forms allow-popups; frame-ancestors 'self'"


def workspace(running: Running, project: dict[str, Any]) -> Path:
    root = running.service.state(PROJECTS_STATE).project_workspace(int(project["id"]))
    root.mkdir(parents=True, exist_ok=True)
    return root


def build_site(root: Path) -> None:
    (root / "index.html").write_text("<h1>home</h1><script src='app.js'></script>")
    (root / "app.js").write_text("document.title = 'ran';")
    (root / "docs").mkdir()
    (root / "docs" / "index.html").write_text("<h1>docs</h1>")
    (root / "empty").mkdir()
    (root / ".git").mkdir(exist_ok=True)
    (root / ".git" / "config").write_text("[core]")


async def raw_get(running: Running, raw_path: bytes) -> httpx.Response:
    """A GET whose path goes out byte for byte (no client-side normalization of ``..``)."""
    async with client(running) as http:
        request = http.build_request("GET", "/")
        request.url = request.url.copy_with(raw_path=raw_path)
        return await http.send(request)


async def private_project(running: Running, http: httpx.AsyncClient, token_slug: str
                          ) -> dict[str, Any]:
    user_id = int((await http.get("/me")).json()["user"]["id"])
    running.service.pm.register(GrantedFeatures({user_id: {"privateProjects": True}}))
    return await new_project(http, token_slug, private=True)


async def test_a_public_preview_serves_the_tree_sandboxed(tmp_path: Path,
                                                          database_url: str) -> None:
    async with serve_projects(tmp_path / "var", database_url) as running, \
            token_owner(running, "luigi") as owner, client(running) as anonymous:
        project = await new_project(owner, "luigi")
        slug = project["slug"]
        empty = await anonymous.get(f"/projects/{slug}/preview/")
        assert empty.status_code == 404 and empty.json()["error"]["code"] == "not_found"
        build_site(workspace(running, project))

        home = await anonymous.get(f"/projects/{slug}/preview/")
        assert home.status_code == 200 and home.text.startswith("<h1>home</h1>")
        assert home.headers["content-type"].startswith("text/html")
        assert home.headers["content-security-policy"] == CSP
        assert "allow-same-origin" not in home.headers["content-security-policy"]
        assert home.headers["x-content-type-options"] == "nosniff"
        assert home.headers["referrer-policy"] == "no-referrer"
        script = await anonymous.get(f"/projects/{slug}/preview/app.js")
        assert script.status_code == 200 and script.headers["content-security-policy"] == CSP
        assert script.headers["content-type"].startswith(("text/javascript",
                                                          "application/javascript"))

        # A folder serves its index.html, after a redirect that adds the slash.
        folder = await anonymous.get(f"/projects/{slug}/preview/docs")
        assert folder.status_code == 301
        assert folder.headers["location"] == f"/projects/{slug}/preview/docs/"
        docs = await anonymous.get(f"/projects/{slug}/preview/docs/")
        assert docs.status_code == 200 and docs.text == "<h1>docs</h1>"
        bare = await anonymous.get(f"/projects/{slug}/preview")
        assert bare.status_code == 308
        assert bare.headers["location"].endswith(f"/projects/{slug}/preview/")
        assert (await anonymous.get(f"/projects/{slug}/preview/empty/")).status_code == 404
        assert (await anonymous.get("/projects/no-such/preview/")).status_code == 404


async def test_traversal_git_and_symlinks_out_are_refused(tmp_path: Path,
                                                          database_url: str) -> None:
    async with serve_projects(tmp_path / "var", database_url) as running, \
            token_owner(running, "luigi") as owner:
        project = await new_project(owner, "luigi")
        slug = project["slug"]
        root = workspace(running, project)
        build_site(root)
        secret = tmp_path / "outside.txt"
        secret.write_text("SECRET")
        os.symlink(secret, root / "link.txt")
        os.symlink(tmp_path, root / "linkdir")
        prefix = f"/projects/{slug}/preview/".encode()
        for path in (b"../../../secrets.json", b"%2e%2e/%2e%2e/%2e%2e/secrets.json",
                     b"..%2f..%2f..%2fsecrets.json", b"docs/../../1/index.html",
                     b".git/config", b"docs/%2e%2e/.git/config", b"link.txt",
                     b"linkdir/outside.txt", b"%00", b"/etc/passwd", b"//etc/passwd"):
            answer = await raw_get(running, prefix + path)
            if answer.status_code == 308:  # "//" merged into "/": still inside the preview
                assert answer.headers["location"].endswith(f"/projects/{slug}/preview/etc/passwd")
                continue
            assert answer.status_code in (400, 404), (path, answer.status_code)
            assert "SECRET" not in answer.text and "[core]" not in answer.text
            assert "jwt_secret" not in answer.text
            assert answer.json()["error"]["code"] in ("not_found", "invalid_request")


async def test_a_private_preview_is_for_its_owner_through_a_capability(
        tmp_path: Path, database_url: str) -> None:
    async with serve_projects(tmp_path / "var", database_url) as running, \
            token_owner(running, "vault") as owner, token_owner(running, "other") as other, \
            client(running) as anonymous:
        project = await private_project(running, owner, "vault")
        slug = project["slug"]
        build_site(workspace(running, project))
        stored = await running.service.db.read(get_project, slug)
        assert stored is not None
        token = preview_token(running.service.settings.jwt.secret, stored)

        for stranger in (anonymous, other):
            refused = await stranger.get(f"/projects/{slug}/preview/docs/")
            assert refused.status_code == 403
            assert refused.json()["error"]["code"] == "private_forbidden"
            assert "docs" not in refused.text and token not in refused.text
        sent = await owner.get(f"/projects/{slug}/preview/docs/?q=1")
        assert sent.status_code == 302
        assert sent.headers["location"] == f"/projects/{slug}/preview/~{token}/docs/?q=1"
        # The capability URL works without any credentials: it is how the page's own
        # requests, which carry no cookie, load its scripts.
        docs = await anonymous.get(sent.headers["location"])
        assert docs.status_code == 200 and docs.text == "<h1>docs</h1>"
        assert docs.headers["content-security-policy"] == CSP
        script = await anonymous.get(f"/projects/{slug}/preview/~{token}/app.js")
        assert script.status_code == 200
        wrong = "a" * 24
        for path in (f"~{wrong}/app.js", f"~{token.upper()}/app.js", f"~{token[:-1]}/app.js"):
            assert (await anonymous.get(f"/projects/{slug}/preview/{path}")).status_code \
                in (403, 404), path
        # Another project's token does not open this one.
        public = await new_project(other, "other")
        stored_public = await running.service.db.read(get_project, public["slug"])
        assert stored_public is not None
        foreign = preview_token(running.service.settings.jwt.secret, stored_public)
        answer = await anonymous.get(f"/projects/{slug}/preview/~{foreign}/app.js")
        assert answer.status_code == 404


PREVIEW_BASE = "http://preview.test:8443"


async def test_preview_hosts_serve_only_previews(tmp_path: Path, database_url: str) -> None:
    async with serve_projects(tmp_path / "var", database_url,
                              preview_base_url=PREVIEW_BASE) as running, \
            token_owner(running, "luigi") as owner, token_owner(running, "vault") as keeper, \
            client(running) as anonymous:
        public = await new_project(owner, "luigi")
        build_site(workspace(running, public))
        private = await private_project(running, keeper, "vault")
        build_site(workspace(running, private))

        moved = await anonymous.get(f"/projects/{public['slug']}/preview/docs/")
        assert moved.status_code == 302
        location = httpx.URL(moved.headers["location"])
        assert location.scheme == "http" and location.port == 8443
        assert location.host.endswith(".preview.test") and location.path == "/docs/"
        label = location.host.split(".")[0]
        assert label.startswith(f"p{public['id']}-")
        refused = await anonymous.get(f"/projects/{private['slug']}/preview/")
        assert refused.status_code == 403
        own = await keeper.get(f"/projects/{private['slug']}/preview/")
        private_host = httpx.URL(own.headers["location"]).host
        assert private_host != location.host and private_host.startswith(f"p{private['id']}-")

        async def on_host(host: str, path: str, method: str = "GET") -> httpx.Response:
            return await anonymous.request(method, path, headers={"Host": f"{host}:8443"})

        docs = await on_host(location.host, "/docs/")
        assert docs.status_code == 200 and docs.text == "<h1>docs</h1>"
        assert docs.headers["content-security-policy"] == CSP
        assert (await on_host(private_host, "/app.js")).status_code == 200
        # The preview host answers nothing but previews: API paths are files of the tree.
        for path in ("/me", "/projects", f"/projects/{public['slug']}", "/healthz"):
            answer = await on_host(location.host, path)
            assert answer.status_code == 404, path
            assert answer.json()["error"]["code"] == "not_found"
        assert (await on_host(location.host, "/", "POST")).status_code == 405
        head = await on_host(location.host, "/docs/", "HEAD")
        assert head.status_code == 200 and head.headers["content-security-policy"] == CSP
        # A made-up or altered host is no preview.
        for host in (f"p{public['id']}-{'a' * 24}.preview.test", "preview.test",
                     f"{label}x.preview.test", f"p{private['id']}-{label.split('-')[1]}"
                     ".preview.test"):
            assert (await on_host(host, "/")).status_code == 404, host
        # The API's own host still serves the API, whatever odd Host it is given.
        assert (await anonymous.get("/healthz")).status_code == 200
        for odd in (f"{location.host}:http", "preview.test:1:2", "[::1"):
            answer = await anonymous.get("/healthz", headers={"Host": odd})
            assert answer.status_code in (200, 400), (odd, answer.status_code)
        # A query goes along to the preview host, percent-encoded.
        moved = await anonymous.get(f"/projects/{public['slug']}/preview/?q=a%20b&x=%E2%9C%93")
        assert moved.headers["location"].endswith("/?q=a%20b&x=%E2%9C%93")


async def test_the_apis_own_host_is_never_taken_for_a_preview(tmp_path: Path) -> None:
    """A preview domain set, by mistake, to the API's parent domain leaves the API alone."""
    async with serve_projects(tmp_path / "var", f"sqlite:///{tmp_path / 'db.sqlite'}",
                              preview_base_url="http://example.test:8443",
                              extra_env={"FLOWSVC_SERVICE_PUBLIC_URL":
                                         "http://api.example.test:8443"}) as running, \
            client(running) as anonymous:
        for host in ("api.example.test:8443", "API.example.test.:8443",
                     f"p1-{'a' * 24}.example.test", f"p1-{'a' * 24}.example.test:80"):
            answer = await anonymous.get("/healthz", headers={"Host": host})
            assert answer.status_code == 200, host
        elsewhere = await anonymous.get("/healthz", headers={"Host": "www.example.test:8443"})
        assert elsewhere.status_code == 404
