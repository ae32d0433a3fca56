"""Preview requests have their own anonymous bucket (``preview_rpm``), larger than the
API's: a page's files do not use up a viewer's API budget, and nothing but a preview's
answer is counted in it (in-process and Redis buckets)."""

from __future__ import annotations

from pathlib import Path

from plugins.projects.state import PROJECTS_STATE
from tests.support.projects import new_project, projects_env, token_owner
from tests.support.server import client, make_settings, running_server


async def test_previews_count_in_their_own_bucket(tmp_path: Path, database_url: str,
                                                  redis_url: str) -> None:
    env = projects_env(tmp_path / "var", database_url=database_url, redis_url=redis_url,
                       extra_env={}, preview_rpm="8")
    env.update({"FLOWSVC_LIMITS_ANONYMOUS_RPM": "3", "FLOWSVC_LIMITS_AUTHENTICATED_RPM": "0",
                "FLOWSVC_SERVICE_TRUSTED_PROXIES": '["127.0.0.1"]'})
    async with running_server(make_settings(env), env) as running, \
            token_owner(running, "luigi") as owner, client(running) as anonymous:
        # The viewer has an address of its own (the owner's sign-in used the loopback's).
        anonymous.headers["X-Forwarded-For"] = "198.51.100.7"
        project = await new_project(owner, "luigi")
        root = running.service.state(PROJECTS_STATE).project_workspace(int(project["id"]))
        root.mkdir(parents=True, exist_ok=True)
        (root / "index.html").write_text("<h1>home</h1>")
        preview = f"/projects/{project['slug']}/preview/"
        # Eight preview requests (more than the API's three) pass; the ninth is refused.
        statuses = [(await anonymous.get(preview + path)).status_code
                    for path in ["", "index.html", "missing.js"] * 3]
        assert statuses == [200, 200, 404] * 2 + [200, 200, 429]
        refused = await anonymous.get(preview)
        assert refused.json()["error"]["code"] == "rate_limited"
        assert "8 anonymous preview requests per IP" in refused.json()["error"]["message"]
        # The API's anonymous bucket is untouched by them: three API requests pass.
        api = [(await anonymous.get(f"/projects/{project['slug']}")).status_code
               for _ in range(4)]
        assert api == [200, 200, 200, 429]
        # A write to a preview path is not a preview: it is counted with the API (full).
        assert (await anonymous.post(preview)).status_code == 429


async def test_a_preview_hosts_requests_count_in_the_preview_bucket(tmp_path: Path) -> None:
    env = projects_env(tmp_path / "var", database_url=f"sqlite:///{tmp_path / 'db.sqlite'}",
                       preview_rpm="5", preview_base_url="http://preview.test:8443")
    env.update({"FLOWSVC_LIMITS_ANONYMOUS_RPM": "2", "FLOWSVC_LIMITS_AUTHENTICATED_RPM": "0",
                "FLOWSVC_SERVICE_TRUSTED_PROXIES": '["127.0.0.1"]'})
    async with running_server(make_settings(env), env) as running, \
            token_owner(running, "luigi") as owner, client(running) as anonymous:
        anonymous.headers["X-Forwarded-For"] = "198.51.100.8"
        project = await new_project(owner, "luigi")
        root = running.service.state(PROJECTS_STATE).project_workspace(int(project["id"]))
        root.mkdir(parents=True, exist_ok=True)
        (root / "index.html").write_text("<h1>home</h1>")
        moved = await owner.get(f"/projects/{project['slug']}/preview/")
        host = moved.headers["location"].split("/")[2]
        # Any path on a preview host is a preview, /healthz too (no probe there, and counted):
        # five pass (the API's bucket holds two).
        statuses = [(await anonymous.get(path, headers={"Host": host})).status_code
                    for path in ("/", "/me", "/", "/healthz", "/", "/")]
        assert statuses == [200, 404, 200, 404, 200, 429]
        # A write there is not claimed: it goes to the API's bucket, which still has room.
        assert (await anonymous.post("/", headers={"Host": host})).status_code == 405
