"""The console's projects pages in headless Chromium: a project created on the caller's
token, a run started from the page and watched to ``done``, with its steps, commits,
screenshot and preview (in a sandboxed frame); a reload replays the run without duplicates."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import trio

from runtime.server import Running
from tests.support.chromium import chromium
from tests.support.console import fill, foreign_requests, reset_connections_to
from tests.support.projects import BRIEF, GrantedFeatures, projects_env
from tests.support.server import client, make_settings, running_server
from tests.support.tokens import add_token
from tests.support.wallet import sign_in

OFFLINE = "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1"
STEPS_DONE = ("[...document.querySelectorAll('#steps li[data-state]')]"
              ".map(step => step.dataset.state)")


@pytest.fixture
async def server(tmp_path: Path, backend: tuple[str, str]) -> AsyncIterator[Running]:
    # A stream's retry hint of 0.3 s (3 s by default): the page's EventSource reconnects
    # that soon after the network comes back.
    env = projects_env(tmp_path / "var", database_url=backend[0], redis_url=backend[1],
                       retry_ms="300")
    env["FLOWSVC_PLUGINS_ENABLED"] = '["auth", "chain", "projects", "console"]'
    async with running_server(make_settings(env), env) as running:
        yield running


async def test_a_build_is_watched_from_start_to_done(server: Running, tmp_path: Path
                                                     ) -> None:
    base = server.base_url
    async with client(server) as http:
        wallet, _ = await sign_in(http)
        assert (await add_token(base, "moon", wallet.address.lower())).status_code == 201
        session = http.cookies["svc_session"]
    async with chromium(tmp_path / "profile", OFFLINE) as browser:
        await browser.call("Network.setCookie", {"name": "svc_session", "value": session,
                                                 "url": base})
        await browser.navigate(f"{base}/console/projects")
        await browser.load_by(fill("#create-project", {
            "tokenSlug": "moon", "title": "Moon landing", "brief": BRIEF,
            "agentTemplate": "fullstack-builder"}))
        path = await browser.evaluate("location.pathname")
        assert path.startswith("/console/projects/")
        await browser.load_by("document.getElementById('start-run').click()")
        await browser.wait_for("document.getElementById('project-status').textContent"
                               " === 'completed'", seconds=60)
        assert await browser.evaluate(STEPS_DONE) == ["done", "done", "done"]
        assert await browser.evaluate("document.querySelectorAll('#commits li').length") == 3
        await browser.wait_for("document.querySelector('#screenshots img')?.complete && "
                               "document.querySelector('#screenshots img').naturalWidth > 0")
        frame = await browser.evaluate(
            "(() => { const f = document.getElementById('preview'); "
            "return [f.hidden, f.getAttribute('sandbox'), f.getAttribute('src')]; })()")
        assert frame[0] is False and frame[1] == "allow-scripts"
        assert frame[2].endswith("/preview/") and frame[2].startswith("/projects/")
        ids = await browser.evaluate(
            "[...document.querySelectorAll('#events li')].map(li => li.dataset.id)")
        assert ids and len(ids) == len(set(ids))
        last = await browser.evaluate(
            "[...document.querySelectorAll('#events li')].at(-1).textContent")
        assert last.split(" ")[1] == "done"

        await browser.navigate(f"{base}{path}")  # the stream replays the run, once
        await browser.wait_for(f"JSON.stringify({STEPS_DONE}) === "
                               "'[\"done\",\"done\",\"done\"]'")
        again = await browser.evaluate(
            "[...document.querySelectorAll('#events li')].map(li => li.dataset.id)")
        assert again == ids

        # The connection drops; a second run happens meanwhile; EventSource reconnects
        # with Last-Event-ID and the page gets the second run's events, each once.
        await browser.call("Network.emulateNetworkConditions", {
            "offline": True, "latency": 0, "downloadThroughput": -1, "uploadThroughput": -1})
        assert await trio.to_thread.run_sync(reset_connections_to,
                                               int(base.rsplit(":", 1)[1])) >= 1
        await browser.wait_for("document.getElementById('build-status').textContent"
                               " === 'Reconnecting…'")
        slug = path.rsplit("/", 1)[1]
        async with client(server, cookies={"svc_session": session}) as owner:
            assert (await owner.post(f"/projects/{slug}/start")).status_code == 201
            for _ in range(600):
                if (await owner.get(f"/projects/{slug}")).json()["status"] == "completed":
                    break
                await trio.sleep(0.1)
        await browser.call("Network.emulateNetworkConditions", {
            "offline": False, "latency": 0, "downloadThroughput": -1, "uploadThroughput": -1})
        await browser.wait_for("[...document.querySelectorAll('#events li')]"
                               ".filter(li => li.textContent.split(' ')[1] === 'done')"
                               ".length === 2", seconds=30)
        resumed = await browser.evaluate(
            "[...document.querySelectorAll('#events li')].map(li => Number(li.dataset.id))")
        assert resumed == sorted(set(resumed)) and resumed[:len(ids)] == [int(i) for i in ids]
        assert await browser.evaluate(STEPS_DONE) == ["done", "done", "done"]
    assert foreign_requests(browser, base) == []


async def test_a_project_on_a_token_the_caller_does_not_own_is_refused(server: Running
                                                                       ) -> None:
    async with client(server) as owner, client(server) as other:
        wallet, _ = await sign_in(owner)
        assert (await add_token(server.base_url, "sun", wallet.address.lower())
                ).status_code == 201
        await sign_in(other)
        form = (await other.get("/console/projects")).text
        token = form.split('name="csrf" value="', 1)[1].split('"', 1)[0]
        refused = await other.post("/console/projects", data={
            "csrf": token, "tokenSlug": "sun", "title": "Not mine", "brief": BRIEF,
            "agentTemplate": "fullstack-builder"})
        assert refused.status_code == 403 and "token_no_match" in refused.text
        assert "Not mine" in refused.text  # the form keeps what was typed


async def test_a_private_project_is_its_owners_only(server: Running) -> None:
    async with client(server) as owner, client(server) as other:
        wallet, user = await sign_in(owner)
        server.service.pm.register(GrantedFeatures({int(str(user["id"])):
                                                    {"privateProjects": True}}))
        assert (await add_token(server.base_url, "star", wallet.address.lower())
                ).status_code == 201
        form = (await owner.get("/console/projects")).text
        token = form.split('name="csrf" value="', 1)[1].split('"', 1)[0]
        created = await owner.post("/console/projects", data={
            "csrf": token, "tokenSlug": "star", "title": "Secret plans", "brief": BRIEF,
            "agentTemplate": "fullstack-builder", "private": "on"})
        assert created.status_code == 303, created.text
        page = created.headers["location"]
        mine = await owner.get(page)
        assert mine.status_code == 200 and "Secret plans" in mine.text and "private" in mine.text
        await sign_in(other)
        refused = await other.get(page)
        assert refused.status_code == 403 and "private_forbidden" in refused.text
        assert "Secret plans" not in refused.text and "data-stream" not in refused.text


async def test_the_projects_page_lists_the_callers_projects_with_links(server: Running
                                                                       ) -> None:
    async with client(server) as owner, client(server) as other:
        wallet, _ = await sign_in(owner)
        slugs = []
        for token in ("one", "two", "three"):
            assert (await add_token(server.base_url, token, wallet.address.lower())
                    ).status_code == 201
            created = await owner.post("/projects", json={
                "tokenSlug": token, "title": f"Project {token}", "brief": BRIEF,
                "agentTemplate": "fullstack-builder"})
            assert created.status_code == 201, created.text
            slugs.append(created.json()["slug"])

        def linked(html: str) -> list[str]:
            return re.findall(r'<tr data-slug="[^"]+"><td><a href="/console/projects/([^"]+)"',
                              html)

        listing = (await owner.get("/console/projects")).text
        assert linked(listing) == slugs[::-1] and "Project three" in listing
        first = (await owner.get("/console/projects", params={"limit": "2"})).text
        assert linked(first) == slugs[:0:-1]
        older = re.search(r'id="older-projects" href="([^"]+)"', first)
        assert older is not None
        rest = (await owner.get(older.group(1).replace("&amp;", "&"))).text
        assert linked(rest) == [slugs[0]] and 'id="older-projects"' not in rest
        opened = await owner.get(f"/console/projects/{slugs[0]}")
        assert opened.status_code == 200 and "Project one" in opened.text
        await sign_in(other)
        theirs = (await other.get("/console/projects")).text
        assert linked(theirs) == [] and "You have no projects yet." in theirs
