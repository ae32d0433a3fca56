"""What the sandbox costs: a sandboxed command against the same command bare, and a screenshot.

Each round runs ``sh -c 'echo x'`` bare (``trio.run_process``) and in the sandbox
(``Sandbox.run``: prlimit, bwrap as the sandbox uid, the work tree handed over), interleaved
so both see the same load, then takes screenshots of a small page. Figures are medians; the
summary row is the overhead per command in milliseconds.

    .venv/bin/python -m bench.bench_sandbox --commands 40 --shots 3
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import trio

from bench.harness import RESULTS_DIR, goal_row, write_json
from runtime.config import SandboxSettings
from runtime.sandbox import Sandbox

PAGE = ("<html><body style='margin:0;background:#204080'><h1 style='color:white'>bench</h1>"
        "<script>document.title = 'ready'</script></body></html>")
OVERHEAD_GOAL_MS = 50.0


def _work_tree(folder: Path) -> Path:
    """A work tree with the page, under a folder the sandbox uid can pass through."""
    folder.chmod(0o711)
    work_tree = folder / "ws"
    work_tree.mkdir()
    (work_tree / "index.html").write_text(PAGE)
    return work_tree


async def measure(commands: int, shots: int) -> dict[str, object]:
    sandbox = Sandbox(SandboxSettings())
    await sandbox.probe()
    if sandbox.reasons:
        raise SystemExit(f"the sandbox is unavailable here: {sandbox.reasons}")
    with tempfile.TemporaryDirectory(prefix="flowsvc-bench-") as folder:
        work_tree = _work_tree(Path(folder))
        bare, boxed = [], []
        for _ in range(commands):
            started = time.perf_counter()
            await trio.run_process(["sh", "-c", "echo x"], capture_stdout=True)
            bare.append((time.perf_counter() - started) * 1000)
            started = time.perf_counter()
            outcome = await sandbox.run(["sh", "-c", "echo x"], work_tree)
            boxed.append((time.perf_counter() - started) * 1000)
            assert outcome.output == b"x\n", outcome
        pictures = []
        for _ in range(shots):
            started = time.perf_counter()
            picture = await sandbox.screenshot(work_tree, "file:///workspace/index.html")
            pictures.append((time.perf_counter() - started) * 1000)
            assert picture.scripts and picture.png.startswith(b"\x89PNG")
    overhead = statistics.median(boxed) - statistics.median(bare)
    return {"bare_ms": statistics.median(bare), "sandboxed_ms": statistics.median(boxed),
            "overhead_ms": overhead, "screenshot_ms": statistics.median(pictures),
            "summary": [goal_row("sandbox overhead per command (ms)", round(overhead, 1),
                                 OVERHEAD_GOAL_MS, at_most=True)]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--commands", type=int, default=40)
    parser.add_argument("--shots", type=int, default=3)
    args = parser.parse_args()
    figures = trio.run(measure, args.commands, args.shots)
    for name in ("bare_ms", "sandboxed_ms", "overhead_ms", "screenshot_ms"):
        print(f"{name:>14}: {figures[name]:8.1f}")
    print(write_json(RESULTS_DIR / "sandbox.json", figures))


if __name__ == "__main__":
    main()
