"""README.md's "Try it" runs as written: from ``make serve`` to a finished build's events.

The lines are read from README.md itself, so they cannot drift from what is tested. The
first one, ``make serve &``, is what this test does itself: it serves the repository's
config.toml (what ``make serve`` runs, on the embedded default) in this process, which
saves a Python start on a loaded machine. Every other line runs unchanged in bash, in the
repository, with two environment variables: the service's ``var/`` in a temporary
directory and its ``public_url`` on the port it got (the lines read both from the
service's configuration, through ``flowsvc dev-wallet``).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import trio

from runtime.config import load_settings
from tests.support.server import ROOT, running_server

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
    assert (tmp_path / "var" / "dev-wallet.key").stat().st_mode & 0o077 == 0
