"""Run every benchmark module ``bench/bench_*.py`` in turn and print one summary table
(``make bench``).

A benchmark takes part in the table by putting a ``summary`` list in the JSON it writes under
``bench/results/`` (rows made by ``harness.goal_row``: a figure, its value, its goal, met or
not); one that does not gets a row pointing at its own output. ``ARGUMENTS`` holds the
arguments a module runs with here, chosen so the whole run stays under 15 minutes on the
2-core machine; ``TIMEOUT_S`` stops a module that hangs; the modules of ``BESIDE_THE_OTHERS``
run concurrently with the rest. The table, with the machine's load before and after, is also
written to ``bench/results/summary.md``.
"""

from __future__ import annotations

import datetime
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench.harness import RESULTS_DIR

ARGUMENTS: dict[str, list[str]] = {
    "bench.bench_artifacts": ["--files", "100", "--megabytes", "16", "--rounds", "2"],
    "bench.bench_baseline": ["--duration", "3", "--rounds", "3"],
    "bench.bench_cluster": ["--duration", "2", "--rounds", "2"],
    "bench.bench_db_threads": ["--duration", "3", "--rounds", "2"],
    "bench.bench_hosts": ["--duration", "3", "--rounds", "2", "--counts", "300,1500,3000"],
    "bench.bench_keys": ["--duration", "2", "--rounds", "2"],
    "bench.bench_marketplace": ["--agents", "20000", "--deep", "18000", "--duration", "2"],
    "bench.bench_onchain": ["--rounds", "2", "--duration", "3"],
    "bench.bench_pipeline": ["--requests", "200", "--warmup", "100", "--no-in-process"],
    "bench.bench_preview": ["--duration", "3", "--rounds", "3"],
    "bench.bench_sandbox": ["--commands", "40", "--shots", "3"],
    "bench.bench_session": ["--duration", "3", "--rounds", "3"],
    # The bare endpoint holds about 1,000 readers (it spent four minutes missing 3,000 and
    # 5,000); one Redis process holds the 1,000 one in memory holds.
    "bench.bench_sse": ["--counts", "1000,3000,5000", "--baseline-counts", "1000",
                        "--redis-counts", "3000,5000", "--seconds", "3",
                        "--servers", "baseline,flowsvc,redis-1,redis-2"],
    # Loading 10 million rows takes about 15 minutes alone: one million here (the 10 M run's
    # command and figures are in docs/performance.md).
    "bench.bench_usage_rollup": ["--large", "1000000", "--requests", "50"],
    "bench.bench_webhooks": ["--events", "1000", "--seconds", "6"],
}
# Counted in instructions, which do not move with the machine's load: run beside the others
# from the start (its valgrind servers take minutes) instead of adding minutes at the end.
# Each with the JSON file it writes, which is then nobody else's.
BESIDE_THE_OTHERS = {"bench.bench_pipeline": "pipeline.json"}
TIMEOUT_S = 600


def load_average() -> str:
    return " ".join(Path("/proc/loadavg").read_text(encoding="ascii").split()[:3])


def summary_rows(module: str, since: float, status: str) -> list[dict[str, Any]]:
    """The ``summary`` rows of the JSON files ``module`` wrote after ``since``."""
    own = BESIDE_THE_OTHERS.get(module)
    rows: list[dict[str, Any]] = []
    for path in sorted(RESULTS_DIR.glob("*.json")):
        if own is not None and path.name != own or own is None and (
                path.name in BESIDE_THE_OTHERS.values()):
            continue
        if path.stat().st_mtime >= since:
            rows += json.loads(path.read_text(encoding="utf-8")).get("summary", [])
    return [{"module": module, **row} for row in rows] or [
        {"module": module, "figure": f"{status}: see its output above", "value": None,
         "goal": "", "met": None}]


def format_summary(rows: list[dict[str, Any]]) -> str:
    """A Markdown table of the summary rows."""
    lines = ["| benchmark | figure | value | goal | met |", "|---|---|---|---|---|"]
    for row in rows:
        value = "" if row["value"] is None else f"{row['value']:.3g}"
        met = {True: "yes", False: "**no**", None: ""}[row["met"]]
        lines.append(f"| {row['module'].removeprefix('bench.')} | {row['figure']} | {value} "
                     f"| {row['goal']} | {met} |")
    return "\n".join(lines)


def start(module: str) -> tuple[subprocess.Popen[bytes], float]:
    arguments = ARGUMENTS.get(module, [])
    print(f"\n=== {module} {' '.join(arguments)}", flush=True)
    return subprocess.Popen([sys.executable, "-m", module, *arguments]), time.time()


def finish(module: str, process: subprocess.Popen[bytes], started: float, deadline: float
           ) -> tuple[str, list[dict[str, Any]]]:
    """Wait for ``module`` until ``deadline`` (monotonic); its status and summary rows."""
    try:
        code = process.wait(timeout=max(0.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        process.terminate()
        process.wait()
        code = -1
    status = "ok" if code == 0 else ("timed out" if code == -1 else f"exit {code}")
    print(f"=== {module}: {status} after {time.time() - started:.0f} s", flush=True)
    return status, summary_rows(module, started, status)


def main() -> int:
    failed: list[str] = []
    rows: list[dict[str, Any]] = []
    began = time.monotonic()
    load_before = load_average()
    modules = [f"bench.{path.stem}" for path in sorted(Path(__file__).parent.glob("bench_*.py"))]
    beside = {module: (*start(module), time.monotonic() + TIMEOUT_S)
              for module in modules if module in BESIDE_THE_OTHERS}
    for module in modules:
        if module in beside:
            continue
        process, started = start(module)
        status, found = finish(module, process, started, time.monotonic() + TIMEOUT_S)
        failed += [module] if status != "ok" else []
        rows += found
    for module, (process, started, deadline) in beside.items():
        status, found = finish(module, process, started, deadline)
        failed += [module] if status != "ok" else []
        rows += found
    table = format_summary(rows)
    minutes = (time.monotonic() - began) / 60
    header = (f"`make bench` at {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC, "
              f"{minutes:.1f} min; load average {load_before} before, {load_average()} after")
    print(f"\n{header}\n\n{table}")
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    (RESULTS_DIR / "summary.md").write_text(f"{header}\n\n{table}\n", encoding="utf-8")
    if failed:
        print(f"\nfailed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
