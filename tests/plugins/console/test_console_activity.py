"""The console's usage and requests pages: a call made with a key shows in the live tail
within a second, in headless Chromium; the log filters; the bars count outcomes; a rotation
from the keys page shows the new key once and keeps the old one working."""

from __future__ import annotations

import re
from pathlib import Path

import trio

from runtime.server import Running
from tests.support.chromium import chromium
from tests.support.console import foreign_requests
from tests.support.keys import create_key, wait_for_calls
from tests.support.server import client
from tests.support.wallet import sign_in

OFFLINE = "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1"


async def test_the_live_tail_shows_a_call_within_a_second(server: Running, tmp_path: Path
                                                          ) -> None:
    async with client(server) as http:
        await sign_in(http)
        key = await create_key(http, rate_limit_rpm=0)
        session = http.cookies["svc_session"]
    base = server.base_url
    async with chromium(tmp_path / "profile", OFFLINE) as browser:
        await browser.call("Network.setCookie", {"name": "svc_session", "value": session,
                                                 "url": base})
        await browser.navigate(f"{base}/console/requests")
        await browser.wait_for("document.getElementById('tail-status').textContent"
                               ".startsWith('Live')")
        async with client(server, headers={"x-api-key": key["raw_key"]}) as caller:
            answered = await caller.get("/me/api-keys")
            assert answered.status_code == 200
        called = trio.current_time()
        shown = await browser.wait_for("document.querySelector('#tail li')?.textContent",
                                       seconds=10)
        assert trio.current_time() - called < 1.0
        assert "/me/api-keys" in shown and f"key {key['id']}" in shown
        assert answered.headers["x-request-id"] in shown
    assert foreign_requests(browser, base) == []


async def test_the_log_filters_and_the_bars_count_outcomes(server: Running) -> None:
    async with client(server) as http:
        await sign_in(http)
        first = await create_key(http, name="first", rate_limit_rpm=0)
        second = await create_key(http, name="second", rate_limit_rpm=0)
        async with client(server, headers={"x-api-key": first["raw_key"]}) as caller:
            await caller.get("/me")
            await caller.get("/no-such-route")
        async with client(server, headers={"x-api-key": second["raw_key"]}) as caller:
            await caller.get("/me/api-keys")
        await wait_for_calls(http, first["id"], 2)
        await wait_for_calls(http, second["id"], 1)
        everything = (await http.get("/console/requests")).text
        assert everything.count("<tr><td>") == 3
        only_404 = (await http.get("/console/requests", params={"status": "404"})).text
        assert only_404.count("<tr><td>") == 1 and "<td>404</td>" in only_404
        by_key = (await http.get("/console/requests", params={"key_id": second["id"]})).text
        assert by_key.count("<tr><td>") == 1 and "/me/api-keys" in by_key
        request_id = re.search(r'href="/console/requests\?request_id=([^"]+)"', by_key)
        assert request_id is not None
        by_request = (await http.get("/console/requests",
                                     params={"request_id": request_id.group(1)})).text
        assert by_request.count("<tr><td>") == 1 and "/me/api-keys" in by_request
        assert f'name="request_id" maxlength="128" value="{request_id.group(1)}"' in by_request
        usage = (await http.get("/console/usage", params={"window": "hour"})).text
        first_bar = re.search(rf'id="bar-{first["id"]}".*?</tr>', usage, re.S)
        assert first_bar is not None and 'aria-label="ok 1, 4xx 1"' in first_bar.group(0)
        over_time = (await http.get("/console/usage", params={"window": "hour",
                                                              "key_id": first["id"]})).text
        assert 'aria-label="2 requests in 12 buckets"' in over_time
        by_model = (await http.get("/console/usage", params={
            "window": "hour", "key_id": first["id"], "by": "model"})).text
        assert 'aria-label="2 calls in 12 buckets"' in by_model
        assert '<option value="model" selected>' in by_model
        drawn = re.findall(r"<title>[^<]*: (route:[a-z_]+) (\d+)</title></rect>", by_model)
        totals: dict[str, int] = {}
        for model, count in drawn:
            totals[model] = totals.get(model, 0) + int(count)
        assert totals == {"route:auth": 1, "route:unmatched": 1}


async def test_rotating_from_the_keys_page_shows_the_new_key_once(server: Running) -> None:
    async with client(server) as http:
        await sign_in(http)
        key = await create_key(http, name="rotate me")
        page = await http.get("/console/keys")
        token = re.search(r'name="csrf" value="([^"]+)"', page.text)
        assert token is not None
        rotated = await http.post(f"/console/keys/{key['id']}/rotate",
                                  data={"csrf": token.group(1), "overlap_seconds": "3600"})
        assert rotated.status_code == 201 and rotated.headers["cache-control"] == "no-store"
        raw = re.search(r'<code id="raw-key">([^<]+)</code>', rotated.text)
        assert raw is not None and 'id="previous-key"' in rotated.text
        for raw_key in (raw.group(1), key["raw_key"]):
            assert (await http.get("/me", headers={"x-api-key": raw_key})).status_code == 200
        assert raw.group(1) not in (await http.get("/console/keys")).text
