"""README.md's "Try it" runs as written: from ``make serve`` to a finished build's events.

The lines are read from README.md itself, so they cannot drift from what is tested. The
first one, ``make serve &``, is what this test does itself (``flowsvc serve`` with the
repository's config.toml, as the Makefile runs it, on the embedded default); every other
line runs unchanged in bash, in the repository, with two environment variables that put
the service's ``var/`` in a temporary directory and its port on a free one (the lines read
both from the service's configuration, through ``flowsvc dev-wallet``).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from tests.support.server import ROOT, free_port

SERVE_LINE = "make serve &"


def try_it_lines() -> list[str]:
    """The lines of the first ``sh`` block of the README's "Try it" section."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme.split("\n## Try it\n", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```sh\n(.*?)\n```", section, re.DOTALL)
    assert block is not None, "the Try it section has no sh block"
    return block.group(1).splitlines()


def test_the_try_it_lines_build_a_project_and_print_its_events(tmp_path: Path) -> None:
    first, *rest = try_it_lines()
    assert first.split("#")[0].strip() == SERVE_LINE
    port = free_port()
    env = {**os.environ, "FLOWSVC_SERVICE_VAR_DIR": str(tmp_path / "var"),
           "FLOWSVC_SERVICE_BIND": f"127.0.0.1:{port}", "FLOWSVC_SERVICE_LOG_LEVEL": "warning"}
    for inherited in ("FLOWSVC_DATABASE_URL", "FLOWSVC_REDIS_URL"):
        env.pop(inherited, None)  # the embedded default, whatever the caller's shell sets
    server = subprocess.Popen([sys.executable, "-m", "runtime.cli", "serve"], cwd=ROOT, env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        result = subprocess.run(["bash", "-c", "\n".join(rest)], cwd=ROOT, env=env,
                                capture_output=True, text=True, timeout=170, check=False)
    finally:
        server.terminate()
        server.wait(timeout=30)
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"signed in at http://127.0.0.1:{port}" in result.stderr
    printed = [line.split(" ", 2) for line in result.stdout.splitlines()]
    assert [int(event_id) for event_id, _, _ in printed] == list(range(1, len(printed) + 1))
    names = [name for _, name, _ in printed]
    assert names[0] == "plan" and "commit" in names and names.count("done") == 1
    assert names[-1] == "done" and "'finalStatus': 'completed'" in printed[-1][2]
    assert (tmp_path / "var" / "dev-wallet.key").stat().st_mode & 0o077 == 0
