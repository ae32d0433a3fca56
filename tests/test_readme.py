"""README.md's "Try it" runs as written: from ``make serve`` to a finished build's events.

The lines are read from README.md itself, so they cannot drift from what is tested. The
first one, ``make serve &``, is what this test does itself: it serves the repository's
config.toml (what ``make serve`` runs, on the embedded default) in this process, which
saves a Python start on a loaded machine. Every other line runs unchanged in bash, in the
repository, with two environment variables: the service's ``var/`` in a temporary
directory and its ``public_url`` on the port it got (the lines read both from the
service's configuration, through ``flowsvc dev-wallet``).

The build's screenshot is a real PNG (the sandbox's Chromium), and its preview URL serves
the page, whose script runs in headless Chromium: ``make test`` installs bubblewrap and
chromium, and without them this test fails rather than skips.
"""

from __future__ import annotations

import ast
import os
import re
from pathlib import Path

import trio

from runtime.config import load_settings
from runtime.server import Running
from tests.support.chromium import chromium
from tests.support.sandbox import read_png
from tests.support.server import ROOT, client, running_server

SERVE_LINE = "make serve &"


def try_it_lines() -> list[str]:
    """The lines of the first ``sh`` block of the README's "Try it" section."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme.split("\n## Try it\n", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```sh\n(.*?)\n```", section, re.DOTALL)
    assert block is not None, "the Try it section has no sh block"
    return block.group(1).splitlines()


async def test_the_try_it_lines_build_a_project_and_print_its_events(tmp_path: Path) -> None:
    first, *rest = try_it_lines()
    assert first.split("#")[0].strip() == SERVE_LINE
    env = {name: value for name, value in os.environ.items()
           if name not in ("FLOWSVC_DATABASE_URL", "FLOWSVC_REDIS_URL")}  # embedded default
    env.update(FLOWSVC_SERVICE_VAR_DIR=str(tmp_path / "var"), FLOWSVC_SERVICE_LOG_LEVEL="warning")
    settings = load_settings(ROOT / "config.toml", env)
    assert settings.embedded
    async with running_server(settings, env) as running:
        env["FLOWSVC_SERVICE_PUBLIC_URL"] = running.base_url
        with trio.fail_after(170):
            result = await trio.run_process(["bash", "-c", "\n".join(rest)], cwd=ROOT, env=env,
                                            capture_stdout=True, capture_stderr=True,
                                            check=False)
        stdout, stderr = result.stdout.decode(), result.stderr.decode()
        assert result.returncode == 0, stderr[-3000:]
        assert f"signed in at {running.base_url}" in stderr
        printed = [line.split(" ", 2) for line in stdout.splitlines()]
        assert [int(event_id) for event_id, _, _ in printed] == list(range(1, len(printed) + 1))
        names = [name for _, name, _ in printed]
        assert names[0] == "plan" and "commit" in names and names.count("done") == 1
        assert names[-1] == "done" and "'finalStatus': 'completed'" in printed[-1][2]
        # The build's own check ran in the sandbox and passed.
        assert any("check passed" in data for _, name, data in printed if name == "tool_result")
        events = {name: ast.literal_eval(data) for _, name, data in printed}
        await check_the_build_is_seen(running, events, tmp_path)
    assert (tmp_path / "var" / "dev-wallet.key").stat().st_mode & 0o077 == 0


async def check_the_build_is_seen(running: Running, events: dict[str, dict[str, object]],
                                  tmp_path: Path) -> None:
    """The screenshot event's url serves a real PNG; the done event's previewUrl serves the
    page, and its script runs in a browser."""
    # The service names its public_url (make serve's own); this one listens on another port.
    public = running.service.settings.service.public_url
    shot_url, preview_url = str(events["screenshot"]["url"]), str(events["done"]["previewUrl"])
    assert shot_url.startswith(public) and preview_url.startswith(public)
    shot_path, preview_path = shot_url.removeprefix(public), preview_url.removeprefix(public)
    async with client(running) as http:
        picture = await http.get(shot_path)
        page = await http.get(preview_path)
    assert picture.headers["content-type"] == "image/png"
    assert read_png(picture.content).width == 1280
    assert page.status_code == 200 and '<script src="app.js">' in page.text
    async with chromium(tmp_path / "profile") as browser:
        await browser.navigate(running.base_url + preview_path)
        status = await browser.wait_for(  # app.js replaces the text once it asked the API
            "document.getElementById('status').textContent !== 'checking the API...' && "
            "document.getElementById('status').textContent")
    assert status.startswith("API ")
    assert (tmp_path / "var" / "dev-wallet.key").stat().st_mode & 0o077 == 0
