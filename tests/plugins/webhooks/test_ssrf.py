"""SSRF through the service: unsafe URLs refused at creation (400) and again at each delivery,
vetted addresses pinned for the connection, redirects never followed.

Where DNS must answer something specific (a rebinding attack, a name that stops resolving),
the test installs a resolver through trio's own ``set_custom_hostname_resolver`` hook; the
in-process service resolves through it unchanged.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import trio

from tests.support.events import emit_now
from tests.support.server import client, make_settings, running_server
from tests.support.wallet import sign_in
from tests.support.webhook_receiver import Reply, running_receiver
from tests.support.webhooks import signed_in, subscribe, wait_until_settled, webhook_env

REFUSED_AT_CREATION = [
    # (url, reason): one of every class the guard refuses
    ("http://93.184.215.14/hook", "scheme_not_allowed"),
    ("ftp://93.184.215.14/hook", "scheme_not_allowed"),
    ("https://user:pw@93.184.215.14/hook", "userinfo_not_allowed"),
    ("https://127.0.0.1/hook", "blocked_address"),
    ("https://[::1]/hook", "blocked_address"),
    ("https://[::ffff:127.0.0.1]/hook", "blocked_address"),
    ("https://10.1.2.3/hook", "blocked_address"),
    ("https://192.168.0.10/hook", "blocked_address"),
    ("https://169.254.169.254/latest/meta-data", "blocked_address"),
    ("https://[fe80::1]/hook", "blocked_address"),
    ("https://224.0.0.1/hook", "blocked_address"),
    ("https://0.0.0.0/hook", "blocked_address"),
    ("https://metadata.google.internal/computeMetadata/v1", "blocked_hostname"),
    ("https://printer.local/hook", "blocked_hostname"),
    ("https://localhost/hook", "blocked_address"),
    ("https://2130706433/hook", "ambiguous_ip_literal"),
    ("https://0x7f.0.0.1/hook", "ambiguous_ip_literal"),
    ("https://exa mple.com/hook", "invalid_url"),
    ("https://no-such-host.invalid/hook", "unresolvable_host"),
]


class ScriptedResolver(trio.abc.HostnameResolver):
    """Answers from the test: each name has a list of answers, one per lookup (the last one
    repeats); an empty answer is NXDOMAIN. Counts lookups per name."""

    def __init__(self) -> None:
        self.answers: dict[str, list[Sequence[str]]] = {}
        self.lookups: dict[str, int] = {}

    async def getaddrinfo(self, host: bytes | None, port: bytes | str | int | None,
                          family: int = 0, type: int = 0, proto: int = 0, flags: int = 0
                          ) -> list[tuple[Any, ...]]:
        assert host is not None and isinstance(port, int)
        name = host.decode()
        count = self.lookups.get(name, 0)
        self.lookups[name] = count + 1
        script = self.answers.get(name, [[]])
        addresses = script[min(count, len(script) - 1)]
        if not addresses:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return [(socket.AF_INET if ipaddress.ip_address(address).version == 4
                 else socket.AF_INET6, type, 6, "", (address, port)) for address in addresses]

    async def getnameinfo(self, sockaddr: tuple[Any, ...], flags: int) -> tuple[str, str]:
        raise NotImplementedError


@pytest.fixture
async def dns() -> AsyncIterator[ScriptedResolver]:
    resolver = ScriptedResolver()
    previous = trio.socket.set_custom_hostname_resolver(resolver)
    yield resolver
    trio.socket.set_custom_hostname_resolver(previous)


async def test_every_unsafe_url_is_refused_at_creation_with_a_clear_400(
        tmp_path: Path, database_url: str) -> None:
    env = webhook_env(tmp_path / "var", database_url, allow_http="false", allowed_hosts=[])
    async with running_server(make_settings(env), env) as running, client(running) as http:
        await sign_in(http)
        answers = [(url, reason, await http.post("/me/webhooks", json={"url": url, "events": []}))
                   for url, reason in REFUSED_AT_CREATION]
        listed = (await http.get("/me/webhooks")).json()["webhooks"]

    for url, reason, answer in answers:
        assert answer.status_code == 400, url
        error = answer.json()["error"]
        assert error["code"] == "url_refused", url
        [detail] = error["details"]
        assert detail["field"] == "url" and detail["reason"] == reason, (url, detail)
        assert detail["message"] and detail["message"] in error["message"]
    assert listed == []


async def test_dns_rebound_to_loopback_after_creation_is_refused_at_delivery(
        tmp_path: Path, database_url: str, dns: ScriptedResolver) -> None:
    env = webhook_env(tmp_path / "var", database_url, allowed_hosts=[])
    async with running_receiver() as receiver, \
            running_server(make_settings(env), env) as running, client(running) as http:
        user_id = await signed_in(http)
        host = "hooks.example.com"
        dns.answers[host] = [["93.184.215.14"], ["127.0.0.1"]]  # public, then rebound
        webhook = await subscribe(http, f"http://{host}:{receiver.port}/hook")
        await emit_now(running.service, user_id=user_id, name="payout.sent",
                             data={})
        [delivery] = await wait_until_settled(http, webhook["id"], 1)
        [listed] = (await http.get("/me/webhooks")).json()["webhooks"]

    assert receiver.received == []
    assert delivery["state"] == "failed"
    [attempt] = delivery["attempts"]  # refused for good: no retry
    assert attempt["outcome"] == "failed" and attempt["status_code"] is None
    assert attempt["error"].startswith("refused: host 'hooks.example.com' resolves to 127.0.0.1")
    assert listed["last_error"].startswith("refused:")


async def test_an_allowed_host_that_is_no_longer_allowed_is_refused_at_delivery(
        tmp_path: Path, database_url: str) -> None:
    allowed = webhook_env(tmp_path / "var", database_url)
    not_any_more = webhook_env(tmp_path / "var", database_url, allowed_hosts=[])
    async with running_receiver() as receiver:
        async with running_server(make_settings(allowed), allowed) as running, \
                client(running) as http:
            user_id = await signed_in(http)
            webhook = await subscribe(http, receiver.url())
            cookies = http.cookies
        async with running_server(make_settings(not_any_more), not_any_more) as running, \
                client(running, cookies=cookies) as http:
            await emit_now(running.service, user_id=user_id,
                                 name="payout.sent", data={})
            [delivery] = await wait_until_settled(http, webhook["id"], 1)

    assert receiver.received == []
    assert [a["error"] for a in delivery["attempts"]] == [
        "refused: address 127.0.0.1 is loopback; webhooks must target public addresses"]


async def test_the_connection_goes_to_the_vetted_address_without_a_second_lookup(
        tmp_path: Path, database_url: str, dns: ScriptedResolver) -> None:
    env = webhook_env(tmp_path / "var", database_url, allowed_hosts=[],
                      allowed_networks=["127.0.0.0/8"])
    async with running_receiver() as receiver, \
            running_server(make_settings(env), env) as running, client(running) as http:
        user_id = await signed_in(http)
        host = "pinned.example.com"
        # A second lookup would answer 127.0.0.2, where nothing listens.
        dns.answers[host] = [["127.0.0.1"], ["127.0.0.1"], ["127.0.0.2"]]
        webhook = await subscribe(http, f"http://{host}:{receiver.port}/hook")
        await emit_now(running.service, user_id=user_id, name="payout.sent",
                             data={})
        [delivery] = await wait_until_settled(http, webhook["id"], 1)

    assert delivery["state"] == "delivered" and len(delivery["attempts"]) == 1
    assert dns.lookups[host] == 2  # one at creation, one before the attempt
    [request] = receiver.received
    assert request.headers["host"] == f"{host}:{receiver.port}"


async def test_redirects_are_not_followed_and_timeouts_and_lost_names_are_retried(
        tmp_path: Path, database_url: str, dns: ScriptedResolver) -> None:
    env = webhook_env(tmp_path / "var", database_url, max_retries=1, timeout_seconds=0.5,
                      allowed_networks=["127.0.0.0/8"])
    async with running_receiver() as target, \
            running_receiver(lambda request: Reply(302, {"location": target.url()})) \
            as redirecting, \
            running_receiver(lambda request: Reply(204, delay=5.0)) as slow, \
            running_server(make_settings(env), env) as running, client(running) as http:
        user_id = await signed_in(http)
        dns.answers["gone.example.com"] = [["127.0.0.1"], []]
        hooks = [await subscribe(http, redirecting.url()), await subscribe(http, slow.url()),
                 await subscribe(http, f"http://gone.example.com:{target.port}/hook")]
        await emit_now(running.service, user_id=user_id, name="payout.sent",
                             data={})
        redirected, timed_out, lost = [
            (await wait_until_settled(http, hook["id"], 1))[0] for hook in hooks]

    assert target.received == []  # neither the redirect nor the lost name reached it
    assert len(redirecting.received) == 2 and len(slow.received) == 2
    assert [a["error"] for a in redirected["attempts"]] == \
        ["HTTP 302 (redirects are not followed)"] * 2
    assert [a["status_code"] for a in redirected["attempts"]] == [302, 302]
    assert [a["error"] for a in timed_out["attempts"]] == ["timeout after 0.5 s"] * 2
    assert all(400 <= a["duration_ms"] < 3000 for a in timed_out["attempts"])
    assert [a["outcome"] for a in lost["attempts"]] == ["retry", "failed"]
    assert all("does not resolve" in a["error"] for a in lost["attempts"])
