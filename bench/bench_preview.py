"""``GET /projects/<slug>/preview/`` against the file download of the same file, in one run.

A real ``flowsvc serve`` process (auth, chain and projects plugins, SQLite, one process) holds
one public project whose work tree has an ``index.html`` of ``--page-bytes`` bytes. wrk loads
the file download ``GET /projects/<slug>/files/index.html`` (the baseline: what serving a
workspace file cost before previews) and the preview of the same file ``GET
/projects/<slug>/preview/`` (a folder resolved to its ``index.html``), interleaved, anonymous.
The goal is a CPU-per-request ratio of at least 0.9: a preview is a file download with other
headers and one more ``stat``.

Then, server mode: a run (``backend = "openai"`` against a scripted model in a thread of this
process, whose second turn never comes) calls ``start_preview`` with ``python3 -m http.server``
serving a page of the same size, and the preview of that run's server is loaded against the
same file download. Its CPU figure is the service process's only (the sandboxed server and
socat, which forks per connection, are other processes): the rps ratio is the cost to read.

Run it with ``python -m bench.bench_preview`` (``--help`` lists the knobs). It prints the
table and writes ``bench/results/preview.json``.
"""

import argparse
import contextlib
import datetime
import json
import os
import queue
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import httpx
import trio

from bench.harness import (
    Measured,
    PairResult,
    RunningServer,
    WrkResult,
    _median_result,
    cpu_seconds,
    flowsvc_server,
    goal_row,
    report_measured,
    run_wrk,
    signed_in,
    write_json,
    wrk_found,
)
from tests.support.fake_openai import FakeOpenAI, Stall, StreamedTurn

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


SERVER_PORT = 8080
SERVER_MARK = b"<!--served-->"


@contextlib.contextmanager
def scripted_model() -> Iterator[str]:
    """A model whose first turn starts the preview server and whose second never comes, in a
    daemon thread (gone with this process); its base URL."""
    arguments = {"command": f"exec python3 -m http.server {SERVER_PORT} --bind 127.0.0.1 "
                            "--directory served", "port": SERVER_PORT}
    model = FakeOpenAI([StreamedTurn("", [("start_preview", json.dumps(arguments))]),
                        Stall(3600)])
    found: queue.Queue[str] = queue.Queue()

    async def serve() -> None:
        async with trio.open_nursery() as nursery:
            found.put(await nursery.start(model.serve))

    threading.Thread(target=trio.run, args=(serve,), daemon=True).start()
    yield found.get(timeout=30)


def public_project(base_url: str, var_dir: Path, page: bytes, *, served: bool = False) -> str:
    """A public project of a fresh owner with ``index.html`` = ``page``; its slug. With
    ``served``, also ``served/index.html`` (as long, marked), and a run is started whose
    preview server serves it; returns once the preview shows it."""
    with httpx.Client(base_url=base_url, timeout=30) as owner, \
            httpx.Client(base_url=base_url, timeout=30) as internal:
        signed_in(owner)
        address = owner.get("/me").json()["user"]["address"]
        name = "served" if served else "bench"
        internal.put(f"/internal/tokens/{name}", headers={
            "Authorization": f"Bearer {INTERNAL_TOKEN}"}, json={
            "ownerAddress": address, "template": "dpnm", "chainId": 56,
            "instance": "0x" + ("bf" if served else "be") * 20}).raise_for_status()
        created = owner.post("/projects", json={
            "tokenSlug": name, "title": name.title(), "brief": "A page to serve.",
            "agentTemplate": "fullstack-builder"})
        created.raise_for_status()
        project = created.json()
        root = var_dir / "workspaces" / project["id"]
        (root / "served").mkdir(parents=True, exist_ok=True)
        (root / "index.html").write_bytes(page)
        (root / "served" / "index.html").write_bytes(SERVER_MARK + page[len(SERVER_MARK):])
        if served:
            owner.post(f"/projects/{project['slug']}/start").raise_for_status()
            deadline = time.monotonic() + 60
            while SERVER_MARK not in owner.get(f"/projects/{project['slug']}/preview/").content:
                if time.monotonic() > deadline:
                    raise SystemExit("the run's preview server did not answer within 60 s")
                time.sleep(0.2)
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
    if not wrk_found():
        return 2

    page = (b"<!doctype html><title>bench</title><script>document.title='ran'</script>"
            + b"x" * args.page_bytes)[:args.page_bytes]
    with tempfile.TemporaryDirectory(prefix="flowsvc-bench-preview-") as scratch, \
            scripted_model() as model_url:
        Path(scratch).chmod(0o711)  # the sandbox uid reaches the work trees by path
        var_dir = Path(scratch) / "var"
        env = {**service_env(args), "FLOWSVC_PLUGINS_PROJECTS_BACKEND": "openai",
               "FLOWSVC_PLUGINS_PROJECTS_MODEL_BASE_URL": model_url,
               "FLOWSVC_PLUGINS_PROJECTS_MODEL": "bench",
               "FLOWSVC_PLUGINS_PROJECTS_MODEL_TIMEOUT_SECONDS": "3600"}
        with flowsvc_server(env, var_dir) as service:
            slug = public_project(service.base_url, var_dir, page)
            measured = measure_two_paths(
                service, f"/projects/{slug}/files/index.html", f"/projects/{slug}/preview/",
                rounds=args.rounds, duration_s=args.duration, connections=args.connections)
            served = public_project(service.base_url, var_dir, page, served=True)
            server_mode = measure_two_paths(
                service, f"/projects/{served}/files/index.html", f"/projects/{served}/preview/",
                rounds=args.rounds, duration_s=args.duration, connections=args.connections)

    report_measured(
        f"GET /projects/<slug>/preview/ vs GET /projects/<slug>/files/index.html "
        f"({args.page_bytes}-byte page, SQLite): {args.rounds} rounds of {args.duration} s, "
        f"{args.connections} connections, median of each (goal: CPU ratio >= 0.9)",
        measured, "file download", "preview")
    report_measured(
        "server mode: GET /projects/<slug>/preview/ proxied to a run's python3 -m http.server "
        "vs the file download (service process CPU only)", server_mode, "file download",
        "preview (server)")
    path = write_json(args.json, {
        "command": " ".join(
            ["python -m bench.bench_preview", *(sys.argv[1:] if argv is None else argv)]),
        "measured_at": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "cpu_count": os.cpu_count(),
        "measured": measured,
        "ratios": measured.ratios(),
        "server_mode": server_mode,
        "server_mode_ratios": server_mode.ratios(),
        "load_average": Path("/proc/loadavg").read_text(encoding="ascii").split()[:3],
        "summary": [goal_row("preview vs file download CPU ratio", measured.cpu_ratio, 0.9),
                    {"figure": "preview of a run's server vs file download, rps ratio",
                     "value": server_mode.ratios()["rps_ratio"], "goal": "", "met": None}],
    })
    print(f"results written to {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
