"""Every console page, filled with data, passes axe-core (vendored for the tests only) with
no serious or critical violation, in headless Chromium. The run also takes the screenshots of
``docs/console.md``: into ``FLOWSVC_TEST_SCREENSHOTS`` (a folder) when it is set."""

from __future__ import annotations

import base64
import json
import os
import shutil
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from runtime.server import Running
from tests.support.chromium import Browser, chromium
from tests.support.console import foreign_requests
from tests.support.keys import create_key, wait_for_calls
from tests.support.projects import BRIEF, projects_env
from tests.support.server import client, make_settings, running_server
from tests.support.tokens import add_token
from tests.support.wallet import sign_in

AXE = Path(__file__).resolve().parents[2] / "support" / "vendor" / "axe-core-4.14.1.min.js"
OFFLINE = "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1"
PLUGINS = ["auth", "keys", "chain", "projects", "webhooks", "billing", "console"]


@pytest.fixture
async def server(tmp_path: Path) -> AsyncIterator[Running]:
    env = projects_env(tmp_path / "var", database_url=f"sqlite:///{tmp_path / 'db.sqlite'}",
                       extra_env={"FLOWSVC_PLUGINS_WEBHOOKS_ALLOW_HTTP": "true",
                                  "FLOWSVC_PLUGINS_WEBHOOKS_ALLOWED_HOSTS": '["127.0.0.1"]'})
    env["FLOWSVC_PLUGINS_ENABLED"] = json.dumps(PLUGINS)
    async with running_server(make_settings(env), env) as running:
        yield running


async def _violations(browser: Browser) -> list[dict[str, Any]]:
    """axe's serious and critical violations of the loaded page (the script is evaluated
    through DevTools, which the page's CSP does not govern)."""
    if not await browser.evaluate("typeof window.axe === 'object'"):
        await browser.evaluate(AXE.read_text(encoding="utf-8"))
    found: list[dict[str, Any]] = await browser.evaluate(
        "axe.run(document, {resultTypes: ['violations']}).then(r => r.violations"
        ".filter(v => v.impact === 'serious' || v.impact === 'critical')"
        ".map(v => ({id: v.id, impact: v.impact, nodes: v.nodes.map(n => n.html)})))")
    return found


async def _screenshot(browser: Browser, folder: Path, name: str) -> None:
    await browser.call("Emulation.setDeviceMetricsOverride", {
        "width": 1280, "height": 900, "deviceScaleFactor": 1, "mobile": False})
    shot = await browser.call("Page.captureScreenshot", {"format": "png"})
    (folder / f"{name}.png").write_bytes(base64.b64decode(shot["data"]))


async def test_every_page_passes_axe_and_is_pictured(server: Running, tmp_path: Path) -> None:
    base = server.base_url
    async with client(server) as http:
        wallet, _ = await sign_in(http)
        assert (await add_token(base, "moon", wallet.address.lower())).status_code == 201
        key = await create_key(http, name="ci deploys", rate_limit_rpm=0)
        async with client(server, headers={"x-api-key": key["raw_key"]}) as caller:
            for path in ("/me", "/me/api-keys", "/no-such-route"):
                await caller.get(path)
        await wait_for_calls(http, key["id"], 3)
        hook = await http.post("/me/webhooks", json={"url": "http://127.0.0.1:9/hook",
                                                     "events": []})
        hook_id = hook.json()["webhook"]["id"]
        await http.post(f"/me/webhooks/{hook_id}/test")
        project = await http.post("/projects", json={
            "tokenSlug": "moon", "title": "Moon landing", "brief": BRIEF,
            "agentTemplate": "fullstack-builder"})
        slug = project.json()["slug"]
        await http.post(f"/projects/{slug}/start")
        session = http.cookies["svc_session"]
    pages = {"sign-in": "/console/sign-in", "keys": "/console/keys",
             "usage": "/console/usage", "requests": "/console/requests",
             "webhooks": "/console/webhooks", "webhook": f"/console/webhooks/{hook_id}",
             "projects": "/console/projects", "project": f"/console/projects/{slug}",
             "account": "/console/account"}
    shots = tmp_path / "screenshots"
    shots.mkdir()
    problems = {}
    async with chromium(tmp_path / "profile", OFFLINE) as browser:
        await browser.navigate(f"{base}{pages['sign-in']}")
        problems["sign-in"] = await _violations(browser)
        await _screenshot(browser, shots, "sign-in")
        await browser.call("Network.setCookie", {"name": "svc_session", "value": session,
                                                 "url": base})
        for name, path in pages.items():
            if name == "sign-in":
                continue
            await browser.navigate(f"{base}{path}")
            if name == "project":
                await browser.wait_for("document.getElementById('project-status')"
                                       ".textContent === 'completed' && document.querySelector"
                                       "('#screenshots img')?.naturalWidth > 0", seconds=60)
            problems[name] = await _violations(browser)
            await _screenshot(browser, shots, name)
    assert foreign_requests(browser, base) == []
    assert {name: found for name, found in problems.items() if found} == {}
    target = os.environ.get("FLOWSVC_TEST_SCREENSHOTS")
    if target:
        _publish(shots, Path(target))


def _publish(shots: Path, target: Path) -> None:
    target.mkdir(parents=True, exist_ok=True)
    for picture in shots.iterdir():
        shutil.copy(picture, target / f"console-{picture.name}")
