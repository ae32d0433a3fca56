"""``GET /projects/<slug>/preview/`` against the file download of the same file, in one run.

A real ``flowsvc serve`` process (auth, chain and projects plugins, SQLite, one process) holds
one public project whose work tree has an ``index.html`` of ``--page-bytes`` bytes. wrk loads
the file download ``GET /projects/<slug>/files/index.html`` (the baseline: what serving a
workspace file cost before previews) and the preview of the same file ``GET
/projects/<slug>/preview/`` (a folder resolved to its ``index.html``), interleaved, anonymous.
The goal is a CPU-per-request ratio of at least 0.9: a preview is a file download with other
headers and one more ``stat``.

Run it with ``python -m bench.bench_preview`` (``--help`` lists the knobs). It prints the
table and writes ``bench/results/preview.json``.
"""

import argparse
import datetime
import os
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

import httpx

from bench.harness import (
    Measured,
    PairResult,
    RunningServer,
    WrkMissingError,
    WrkResult,
    _median_result,
    cpu_seconds,
    flowsvc_server,
    goal_row,
    report_measured,
    require_wrk,
    run_wrk,
    signed_in,
    write_json,
)

INTERNAL_TOKEN = "bench-internal-token-" + "i" * 32


def service_env(args: argparse.Namespace) -> dict[str, str]:
    return {
        "FLOWSVC_JWT_SECRET": "bench-jwt-secret-" + "x" * 32,
        "FLOWSVC_INTERNAL_TOKEN": INTERNAL_TOKEN,
        "FLOWSVC_PLUGINS_ENABLED": '["auth", "chain", "projects"]',
        "FLOWSVC_SERVICE_LOG_LEVEL": args.log_level,
        # One client hammering two routes must measure them, not a rate bucket.
        "FLOWSVC_LIMITS_ANONYMOUS_RPM": "0",
        "FLOWSVC_PLUGINS_PROJECTS_PREVIEW_RPM": "0",
    }


def public_project(base_url: str, var_dir: Path, page: bytes) -> str:
    """A public project of a fresh owner with ``index.html`` = ``page``; its slug."""
    with httpx.Client(base_url=base_url, timeout=30) as owner, \
            httpx.Client(base_url=base_url, timeout=30) as internal:
        signed_in(owner)
        address = owner.get("/me").json()["user"]["address"]
        internal.put("/internal/tokens/bench", headers={
            "Authorization": f"Bearer {INTERNAL_TOKEN}"}, json={
            "ownerAddress": address, "template": "dpnm", "chainId": 56,
            "instance": "0x" + "be" * 20}).raise_for_status()
        created = owner.post("/projects", json={
            "tokenSlug": "bench", "title": "Bench", "brief": "A page to serve.",
            "agentTemplate": "fullstack-builder"})
        created.raise_for_status()
        project = created.json()
    root = var_dir / "workspaces" / project["id"]
    root.mkdir(parents=True, exist_ok=True)
    (root / "index.html").write_bytes(page)
    return str(project["slug"])


def measure_two_paths(server: RunningServer, baseline_path: str, candidate_path: str, *,
                      rounds: int, duration_s: int, connections: int) -> Measured:
    """``measure_servers`` for two paths of one server: the process's CPU is read around
    each wrk run (B C, C B, ...), since one process cannot be split by path otherwise."""
    runs: dict[str, list[WrkResult]] = {baseline_path: [], candidate_path: []}
    cpu = dict.fromkeys(runs, 0.0)
    for path in runs:  # one unrecorded second of warm-up each
        run_wrk(server.url(path), duration_s=1, connections=connections, threads=1)
    for round_index in range(rounds):
        order = (baseline_path, candidate_path) if round_index % 2 == 0 else \
            (candidate_path, baseline_path)
        for path in order:
            before = cpu_seconds(server.process.pid)
            runs[path].append(run_wrk(server.url(path), duration_s=duration_s,
                                      connections=connections, threads=1))
            cpu[path] += cpu_seconds(server.process.pid) - before
    served = {path: sum(run.rps for run in results) * duration_s
              for path, results in runs.items()}
    pair = PairResult(_median_result(runs[baseline_path]), _median_result(runs[candidate_path]),
                      runs[baseline_path], runs[candidate_path])
    return Measured(pair, cpu[baseline_path] / served[baseline_path] * 1e6,
                    cpu[candidate_path] / served[candidate_path] * 1e6)


def main(argv: Sequence[str] | None = None) -> int:
    """Measure the preview against the file download; print the report; the exit status."""
    parser = argparse.ArgumentParser(description="Preview vs file download of the same file.")
    parser.add_argument("--duration", type=int, default=3, help="seconds per wrk run")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds per side")
    parser.add_argument("--connections", type=int, default=16, help="wrk connections")
    parser.add_argument("--page-bytes", type=int, default=4096, help="size of index.html")
    parser.add_argument("--log-level", default="warning",
                        choices=["debug", "info", "warning", "error"])
    parser.add_argument("--json", default="preview.json", help="file under bench/results/")
    args = parser.parse_args(argv)
    try:
        require_wrk()
    except WrkMissingError as error:
        print(error, file=sys.stderr)
        return 2

    page = (b"<!doctype html><title>bench</title><script>document.title='ran'</script>"
            + b"x" * args.page_bytes)[:args.page_bytes]
    with tempfile.TemporaryDirectory(prefix="flowsvc-bench-preview-") as scratch:
        var_dir = Path(scratch) / "var"
        with flowsvc_server(service_env(args), var_dir) as service:
            slug = public_project(service.base_url, var_dir, page)
            measured = measure_two_paths(
                service, f"/projects/{slug}/files/index.html", f"/projects/{slug}/preview/",
                rounds=args.rounds, duration_s=args.duration, connections=args.connections)

    report_measured(
        f"GET /projects/<slug>/preview/ vs GET /projects/<slug>/files/index.html "
        f"({args.page_bytes}-byte page, SQLite): {args.rounds} rounds of {args.duration} s, "
        f"{args.connections} connections, median of each (goal: CPU ratio >= 0.9)",
        measured, "file download", "preview")
    path = write_json(args.json, {
        "command": " ".join(
            ["python -m bench.bench_preview", *(sys.argv[1:] if argv is None else argv)]),
        "measured_at": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "cpu_count": os.cpu_count(),
        "measured": measured,
        "ratios": measured.ratios(),
        "summary": [goal_row("preview vs file download CPU ratio", measured.cpu_ratio, 0.9)],
    })
    print(f"results written to {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
