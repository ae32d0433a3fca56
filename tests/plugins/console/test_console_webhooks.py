"""The console's webhooks pages in headless Chromium: an endpoint that fails shows its
attempts with their response codes; once it recovers, a resend and a recovery since a time
deliver; the secret is shown once; another user never reaches the endpoint."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from runtime.server import Running
from tests.support.chromium import Browser, chromium
from tests.support.console import fill, foreign_requests
from tests.support.events import emit_now
from tests.support.server import client, make_settings, running_server
from tests.support.wallet import sign_in
from tests.support.webhook_receiver import Received, Reply, running_receiver
from tests.support.webhooks import signed_in, subscribe, webhook_env

OFFLINE = "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1"


@pytest.fixture
async def server(tmp_path: Path, backend: tuple[str, str]) -> AsyncIterator[Running]:
    env = webhook_env(tmp_path / "var", backend[0], max_retries=0,
                      plugins=["auth", "keys", "webhooks", "console"])
    async with running_server(make_settings(env), env) as running:
        yield running


async def _states(browser: Browser, url: str, wanted: list[str]) -> str:
    """Reload the endpoint page until its deliveries' states are ``wanted``; its HTML."""
    for _ in range(200):
        await browser.navigate(url)
        states = await browser.evaluate(
            "[...document.querySelectorAll('#deliveries tr[data-state]')]"
            ".map(row => row.dataset.state)")
        if states == wanted:
            html: str = await browser.evaluate("document.documentElement.outerHTML")
            return html
    raise AssertionError(f"deliveries never became {wanted}, last {states}")


async def test_a_failing_endpoint_shows_attempts_then_resend_and_recover(
        server: Running, tmp_path: Path) -> None:
    healthy = False

    def respond(_request: Received) -> Reply:
        return Reply(204) if healthy else Reply(503, body=b'{"error": "down for <maintenance>"}')

    async with client(server) as http, running_receiver(respond) as receiver:
        await sign_in(http)
        session = http.cookies["svc_session"]
        base = server.base_url
        async with chromium(tmp_path / "profile", OFFLINE) as browser:
            await browser.call("Network.setCookie", {"name": "svc_session", "value": session,
                                                     "url": base})
            await browser.navigate(f"{base}/console/webhooks")
            await browser.load_by(fill("#create-webhook", {"url": receiver.url()}))
            secret = await browser.evaluate("document.getElementById('secret').textContent")
            assert secret.startswith("whsec_")
            endpoint = await browser.evaluate(
                "document.querySelector('.reveal a').getAttribute('href')")
            page = f"{base}{endpoint}"
            await browser.navigate(page)
            assert secret not in await browser.evaluate("document.documentElement.outerHTML")

            await browser.load_by("document.getElementById('send-test').click()")
            failed = await _states(browser, page, ["failed"])
            assert "503" in failed and "webhook.ping" in failed
            assert "down for &lt;maintenance&gt;" in failed  # the body's start, escaped

            healthy = True
            event_id = await browser.evaluate(
                "document.querySelector('#deliveries tr[data-state]').dataset.eventId")
            await browser.load_by(
                f"document.querySelector('button[aria-label=\"Resend {event_id}\"]').click()")
            await _states(browser, page, ["delivered"])

            healthy = False
            await browser.load_by("document.getElementById('send-test').click()")
            await _states(browser, page, ["failed", "delivered"])
            healthy = True
            since = (datetime.now(UTC) - timedelta(minutes=5)).strftime("%Y-%m-%dT%H:%M:%S")
            await browser.load_by(fill("#recover", {"since": since}))
            await _states(browser, page, ["delivered", "delivered"])

            await browser.navigate(f"{page}?state=failed")
            assert await browser.evaluate(
                "document.querySelectorAll('#deliveries tr[data-state]').length") == 0
        assert foreign_requests(browser, base) == []
        assert len(receiver.received) >= 4

        async with client(server) as other:
            await sign_in(other)
            refused = await other.get(endpoint)
            assert refused.status_code == 404 and receiver.url() not in refused.text
            listing = await other.get("/console/webhooks")
            assert receiver.url() not in listing.text
            token = re.search(r'name="csrf" value="([^"]+)"', listing.text)
            assert token is not None
            for action in ("test", "rotate-secret", "delete"):
                answer = await other.post(f"{endpoint}/{action}",
                                          data={"csrf": token.group(1)})
                assert answer.status_code == 404, action


async def test_deliveries_are_filtered_by_event_type_and_paged_by_the_api(
        tmp_path: Path, backend: tuple[str, str]) -> None:
    env = webhook_env(tmp_path / "var", backend[0],  # billing declares subscription.granted
                      plugins=["auth", "keys", "webhooks", "billing", "chain", "console"])
    async with running_server(make_settings(env), env) as server, client(server) as http, \
            running_receiver() as receiver:
        user_id = await signed_in(http)
        webhook = await subscribe(http, receiver.url())
        granted = await emit_now(server.service, user_id=user_id, name="subscription.granted",
                                 data={"tier": "pro", "amount_flow": "0.000000"})
        pings = [(await http.post(f"/me/webhooks/{webhook['id']}/test")).json()["delivery"]
                 ["event_id"] for _ in range(3)]
        page = f"/console/webhooks/{webhook['id']}"

        def shown(html: str) -> list[str]:
            return re.findall(r'<tr data-event-id="([^"]+)"', html)

        # The only granted delivery is the oldest: a filter over the newest page would miss it.
        only_granted = await http.get(page, params={"event": "subscription.granted",
                                                    "limit": "1"})
        assert shown(only_granted.text) == [granted.id]
        assert 'id="older-deliveries"' not in only_granted.text
        first = await http.get(page, params={"event": "webhook.ping", "limit": "2"})
        assert shown(first.text) == pings[:0:-1]
        older = re.search(r'id="older-deliveries" href="([^"]+)"', first.text)
        assert older is not None and "event=webhook.ping" in older.group(1)
        rest = await http.get(older.group(1).replace("&amp;", "&"))
        assert shown(rest.text) == [pings[0]] and 'id="older-deliveries"' not in rest.text
        nothing = await http.get(page, params={"event": "payout.sent"})
        assert shown(nothing.text) == [] and "No deliveries match." in nothing.text
