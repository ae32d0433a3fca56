"""The ``fetch_url`` tool against a real web site on loopback, and against every SSRF form.

The site (tests/support/fake_web.py) is on 127.0.0.1, which the guard refuses like any
loopback address; the tests that must reach it allow that one host, the way the webhook tests
do (``fetch_allowed_hosts = ["127.0.0.1"]``). Refusal tests use the default settings, and a
scripted resolver where DNS must answer something specific.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import trio

from plugins.projects.engine.fetch_tool import TEXT_LIMIT, fetch_url_tool
from plugins.projects.settings import ProjectsSettings
from runtime.agents import ToolContext, ToolResult
from tests.support.fake_web import FakeWeb, running_web
from tests.support.marketplace import marketplace_server, new_agent, signed_in
from tests.support.scripted_dns import ScriptedResolver

LOOPBACK_ALLOWED = ProjectsSettings(fetch_allowed_hosts=["127.0.0.1"])


@pytest.fixture
async def web() -> AsyncIterator[FakeWeb]:
    async with running_web() as site:
        yield site


async def fetch(url: Any, settings: ProjectsSettings = LOOPBACK_ALLOWED) -> ToolResult:
    context = ToolContext(workspace=Path("/nonexistent"))
    return await fetch_url_tool(settings).run(context, {"url": url})


async def test_a_page_comes_back_as_its_visible_text(web: FakeWeb) -> None:
    result = await fetch(web.url("/page.html"))
    assert result.error is None
    assert result.result == {
        "url": web.url("/page.html"), "status": 200, "contentType": "text/html; charset=utf-8",
        "text": "Moon facts\n\nThe Moon\nIt orbits the Earth.\nIt has no air & no water.",
        "truncated": False}
    notes = await fetch(web.url("/notes.txt"))
    assert notes.result["text"] == "Café crème"  # decoded with its declared charset
    missing = await fetch(web.url("/nothing"))
    assert missing.result["status"] == 404 and missing.result["text"] == "no such page"


async def test_redirects_are_followed_up_to_five(web: FakeWeb) -> None:
    five = await fetch(web.url("/hops/5"))
    assert five.error is None and five.result["url"] == web.url("/hops/0")
    assert five.result["text"].startswith("Moon facts")
    six = await fetch(web.url("/hops/6"))
    assert six.error == "fetch failed: more than 5 redirects" and six.result is None
    assert web.paths.count("/hops/0") == 1  # the sixth redirect was not followed


async def test_the_size_cap_truncates_and_the_time_cap_gives_up(web: FakeWeb) -> None:
    capped = ProjectsSettings(fetch_allowed_hosts=["127.0.0.1"], fetch_max_bytes=4096,
                              fetch_timeout_seconds=1)
    big = await fetch(web.url("/big?size=5000000"), capped)
    assert big.result["truncated"] is True and big.result["text"] == "x" * 4096
    longer_than_the_model_gets = await fetch(web.url(f"/big?size={TEXT_LIMIT + 10}"))
    assert longer_than_the_model_gets.result["truncated"] is True
    assert len(longer_than_the_model_gets.result["text"]) == TEXT_LIMIT

    started = trio.current_time()
    stalled = await fetch(web.url("/stall"), capped)
    assert stalled.error == "fetch failed: no answer within 1 s"
    assert trio.current_time() - started < 20  # a wide margin over the 1 s cap


async def test_what_is_not_text_is_refused(web: FakeWeb) -> None:
    image = await fetch(web.url("/image.png"))
    assert image.error == "fetch failed: the page is image/png, not text"
    zipped = await fetch(web.url("/gzip"))
    assert zipped.error == ("fetch failed: the server sent a gzip-encoded body although none "
                            "was asked")
    for bad in (None, 42, "", ["http://example.com"]):
        refused = await fetch(bad)
        assert refused.error == "argument 'url' is required and must be a string"


BLOCKED = [
    "http://127.0.0.1:{port}/page.html",  # loopback (the live site, not allowed here)
    "http://localhost:{port}/page.html",  # a name for loopback
    "http://10.0.0.1/", "http://172.16.5.4/", "http://192.168.1.1/",  # private
    "http://169.254.169.254/latest/meta-data/",  # link-local: cloud metadata
    "http://100.64.0.1/",  # CGNAT
    "http://[::1]/", "http://[fd00::1]/", "http://[fe80::1]/",  # IPv6 loopback, ULA, link-local
    "http://[::ffff:127.0.0.1]/", "http://[::ffff:7f00:1]/",  # IPv4-mapped
    "http://[64:ff9b::a00:1]/",  # NAT64 of 10.0.0.1
    "http://0.0.0.0/",
]
ODD_FORMS = ["http://2130706433/", "http://0177.0.0.1/", "http://127.1/",
             "http://0x7f.0.0.1/", "http://017700000001/"]


@pytest.mark.parametrize("url", BLOCKED)
async def test_non_public_addresses_are_refused(web: FakeWeb, url: str) -> None:
    refused = await fetch(url.format(port=web.port), ProjectsSettings())
    assert refused.error is not None and refused.error.startswith("url refused: ")
    assert "fetch_url must target public addresses" in refused.error
    assert web.paths == []


@pytest.mark.parametrize("url", ODD_FORMS)
async def test_numeric_look_alikes_are_refused(url: str) -> None:
    refused = await fetch(url, ProjectsSettings())
    assert refused.error is not None and "non-canonical IPv4 form" in refused.error


async def test_other_schemes_and_userinfo_are_refused() -> None:
    for url, why in [("file:///etc/passwd", "URL scheme must be https or http"),
                     ("gopher://example.com/", "URL scheme must be https or http"),
                     ("http://user:pw@example.com/", "user name or password"),
                     ("http://metadata.google.internal/", "names an internal service")]:
        refused = await fetch(url, ProjectsSettings())
        assert refused.error is not None and why in refused.error, (url, refused.error)
    https_only = await fetch("http://example.com/", ProjectsSettings(fetch_allow_http=False))
    assert https_only.error == "url refused: URL scheme must be https"


async def test_names_resolving_to_private_addresses_are_refused(dns: ScriptedResolver) -> None:
    dns.answers["inside.example"] = ["10.1.2.3"]
    dns.answers["mixed.example"] = ["93.184.216.34", "127.0.0.1"]  # one bad answer is enough
    for host in ("inside.example", "mixed.example"):
        refused = await fetch(f"http://{host}/", ProjectsSettings())
        assert refused.error is not None and "resolves to" in refused.error, refused.error
    unknown = await fetch("http://nowhere.example/", ProjectsSettings())
    assert unknown.error is not None and unknown.error.startswith("url refused: host ")


async def test_redirects_to_non_public_addresses_are_refused(web: FakeWeb,
                                                             dns: ScriptedResolver) -> None:
    dns.answers["inside.example"] = ["192.168.0.10"]
    for target in ("http://10.0.0.1/", "http://169.254.169.254/", "http://[::ffff:10.0.0.1]/",
                   "http://inside.example/", "http://2130706433/", "file:///etc/passwd",
                   f"http://localhost:{web.port}/page.html"):
        refused = await fetch(web.url(f"/redirect?to={target}"))
        assert refused.error is not None and refused.error.startswith("url refused: "), \
            (target, refused.error)
    broken = await fetch(web.url("/redirect?to=http://[::1"))
    assert broken.error == ("fetch failed: network error: Invalid URL in location header: "
                            "Invalid port: ':1'.")
    for target in ("http://a b/", "http://:99999/"):
        refused = await fetch(web.url(f"/redirect?to={target}"))
        assert refused.error is not None and refused.error.startswith("url refused: "), target
    # The first hop was served; no refused target was ever requested.
    assert all(path.startswith("/redirect") for path in web.paths)


async def test_the_connection_goes_to_the_checked_address(web: FakeWeb,
                                                          dns: ScriptedResolver) -> None:
    """A name is resolved once: the connection goes to the vetted address whatever DNS says
    afterwards (no rebinding), and ``Host`` keeps the name."""
    dns.answers["site.example"] = ["127.0.0.1"]
    settings = ProjectsSettings(fetch_allowed_hosts=["site.example"])
    result = await fetch(f"http://site.example:{web.port}/page.html", settings)
    assert result.error is None and result.result["status"] == 200


async def test_fetch_url_is_in_the_tool_list_and_priceable(tmp_path: Path,
                                                           database_url: str) -> None:
    async with marketplace_server(tmp_path / "var", database_url) as running, \
            signed_in(running) as (owner, _):
        assert "fetch_url" in running.service.tools
        slug = (await new_agent(owner))["slug"]
        priced = await owner.post(f"/agents/{slug}/tool-prices",
                                  json=[{"tool": "fetch_url", "perCallFlow": "0.0005"}])
        assert priced.status_code == 200, priced.text
        assert priced.json() == {"toolPrices": [{"tool": "fetch_url",
                                                 "perCallFlow": "0.000500"}]}
