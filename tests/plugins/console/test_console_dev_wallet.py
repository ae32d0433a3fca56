"""The development wallet in the console: on the embedded default one click signs in with
the key of ``flowsvc dev-wallet`` and another registers a token it owns, after which the
README's "Try it" build starts from the projects page; anywhere else both are 404."""

from __future__ import annotations

import re
from pathlib import Path

from eth_account import Account

from tests.support.backends import REDIS_URL
from tests.support.projects import BRIEF, projects_env
from tests.support.server import client, make_settings, running_server


def _csrf(html: str) -> str:
    match = re.search(r'name="csrf" value="([^"]+)"', html)
    assert match is not None
    return match.group(1)


async def test_the_dev_wallet_signs_in_and_owns_a_token_that_builds(tmp_path: Path) -> None:
    env = projects_env(tmp_path / "var", database_url=f"sqlite:///{tmp_path / 'db.sqlite'}")
    env["FLOWSVC_PLUGINS_ENABLED"] = '["auth", "chain", "projects", "console"]'
    async with running_server(make_settings(env), env) as server, client(server) as http:
        page = await http.get("/console/sign-in")
        assert "dev-wallet-sign-in" in page.text
        signed = await http.post("/console/sign-in/dev-wallet", data={"csrf": _csrf(page.text)})
        assert signed.status_code == 303 and signed.headers["location"] == "/console/projects"
        me = (await http.get("/me")).json()["user"]
        key = (tmp_path / "var" / "dev-wallet.key").read_text().strip()
        assert me["address"] == Account.from_key(key).address.lower()
        assert (tmp_path / "var" / "dev-wallet.key").stat().st_mode & 0o777 == 0o600

        projects = await http.get("/console/projects")
        token = _csrf(projects.text)
        registered = await http.post("/console/projects/dev-token",
                                     data={"csrf": token, "slug": "moon"})
        assert registered.status_code == 303
        created = await http.post("/console/projects", data={
            "csrf": token, "tokenSlug": "moon", "title": "Moon landing", "brief": BRIEF,
            "agentTemplate": "fullstack-builder"})
        assert created.status_code == 303, created.text
        slug = created.headers["location"].rsplit("/", 1)[1]
        started = await http.post(f"/console/projects/{slug}/start", data={"csrf": token})
        assert started.status_code == 303
        assert (await http.get(f"/projects/{slug}")).json()["lastRun"] is not None
        again = await http.post("/console/sign-in/dev-wallet", data={"csrf": token})
        assert again.status_code == 303
        assert (await http.get("/me")).json()["user"]["id"] == me["id"]  # the same wallet


async def test_the_dev_wallet_is_refused_outside_the_embedded_default(tmp_path: Path) -> None:
    env = projects_env(tmp_path / "var", database_url=f"sqlite:///{tmp_path / 'db.sqlite'}",
                       redis_url=REDIS_URL or "redis://127.0.0.1:6379/0")
    env["FLOWSVC_PLUGINS_ENABLED"] = '["auth", "chain", "projects", "console"]'
    async with running_server(make_settings(env), env) as server, client(server) as http:
        page = await http.get("/console/sign-in")
        assert "dev-wallet-sign-in" not in page.text
        refused = await http.post("/console/sign-in/dev-wallet",
                                  data={"csrf": _csrf(page.text)})
        assert refused.status_code == 404
        assert not (tmp_path / "var" / "dev-wallet.key").exists()
