"""``/docs`` in a real browser: headless Chromium (Debian's ``chromium``, which ``make test``
installs) loads the page with every host but the service unresolvable, runs Swagger UI,
and the rendered DOM shows every operation of ``/openapi.json`` under its plugin's tag."""

from __future__ import annotations

import re
import shutil
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import trio

from runtime.server import Running
from tests.support.server import client, make_settings, running_server, settings_env

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
# Swagger UI renders each operation as a block with its method and path.
_OPERATION = re.compile(
    r'class="opblock-summary-method">([A-Z]+)</span>.*?data-path="([^"]+)"', re.S)


@pytest.fixture
async def docs_server(tmp_path: Path) -> AsyncIterator[Running]:
    env = settings_env(tmp_path / "var", database_url=f"sqlite:///{tmp_path / 'flowsvc.db'}",
                       plugins=["auth", "keys", "webhooks"])
    async with running_server(make_settings(env), env) as running:
        yield running


async def _rendered_dom(url: str, profile: Path) -> str:
    assert CHROMIUM is not None, "chromium not found: install the Debian package chromium"
    argv = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
            f"--user-data-dir={profile}",
            # Offline: no host resolves but the service's own address.
            "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1",
            "--virtual-time-budget=20000", "--dump-dom", url]
    with trio.fail_after(90):
        done = await trio.run_process(argv, capture_stdout=True, capture_stderr=True)
    return done.stdout.decode()


async def test_docs_render_every_operation_offline(docs_server: Running, tmp_path: Path
                                                   ) -> None:
    async with client(docs_server) as http:
        document = (await http.get("/openapi.json")).json()
        page = (await http.get("/docs")).text
    assert "https://" not in page and "http://" not in page  # every asset is the service's
    dom = await _rendered_dom(f"{docs_server.base_url}/docs", tmp_path / "profile")
    rendered = {(method.lower(), path) for method, path in _OPERATION.findall(dom)}
    declared = {(method, path) for path, operations in document["paths"].items()
                for method in operations}
    assert declared and rendered == declared
    tags = set(re.findall(r'data-tag="([^"]+)"', dom))
    assert tags == {"auth", "keys", "webhooks", "service"}
