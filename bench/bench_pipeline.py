"""What flowsvc's request pipeline costs, counted in instructions: deterministic on a busy machine.

Two views, both under ``valgrind --tool=callgrind`` with instrumentation off until the app
is warm; the harness turns it on around ``--requests`` requests only
(``callgrind_control``), so start-up is not counted, and reads the instructions of that
window:

- **served** (the headline): a real server process (``bench.hello_app`` or ``flowsvc
  serve`` on the embedded default, and on Redis for the key path) answering sequential
  keep-alive requests from this process, which is not counted: the whole request, HTTP
  parsing and the socket included, as a client sees it;
- **in process**: the app alone through ``bench.asgi_driver`` (no socket, no HTTP parser),
  which shows the pipeline's own share best.

Scenarios: hello-world, ``/healthz`` (the pipeline alone), ``/me`` with a session, an
``x-api-key`` request (in-process meter; ``key-redis``: Redis meter, served only). The
count does not move with the machine's load (the same binary, inputs and hash seed give the
same count within a fraction of a percent), so a change of a few percent in the pipeline
shows where CPU-time figures of a shared machine cannot. The headline is the ratio
hello-world / scenario: 1.0 means the scenario costs what the bare framework costs, 0.5
twice as much.

Run it with ``python -m bench.bench_pipeline`` (``--help`` for the knobs). It needs
valgrind (Debian package). It prints a table and writes ``bench/results/pipeline.json``.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

import httpx

from bench.asgi_driver import SCENARIOS
from bench.harness import (
    REPO_ROOT,
    free_port,
    goal_row,
    new_key,
    python_module_argv,
    running_server,
    session_cookie,
    write_json,
)

_TOTALS = re.compile(r"^summary:\s+(\d+)", re.MULTILINE)


def _callgrind(argv: Sequence[str], out: Path) -> list[str]:
    """``argv`` under callgrind, counting nothing until told (``callgrind_control -i on``)."""
    return ["valgrind", "--tool=callgrind", "--instr-atstart=no",
            f"--callgrind-out-file={out}", *argv]


def _control(pid: int, *args: str) -> None:
    subprocess.run(["callgrind_control", *args, str(pid)], check=True, capture_output=True)


def _summary(out: Path, what: str) -> int:
    """The instructions of the first dump (``callgrind_control --dump``) next to ``out``."""
    dumps = sorted(out.parent.glob(out.name + ".*"))
    found = _TOTALS.search(dumps[0].read_text()) if dumps else None
    if found is None:
        raise RuntimeError(f"{what}: callgrind wrote no summary")
    return int(found.group(1))


def in_process_instructions(scenario: str, requests: int, warmup: int) -> float:
    """Instructions per request of ``scenario`` through ``bench.asgi_driver``."""
    with tempfile.TemporaryDirectory(prefix="flowsvc-callgrind-") as folder:
        out = Path(folder) / "callgrind.out"
        argv = [sys.executable, "-m", "bench.asgi_driver", scenario, "--requests",
                str(requests), "--warmup", str(warmup), "--wait"]
        with subprocess.Popen(_callgrind(argv, out), cwd=REPO_ROOT,
                              env={**os.environ, "PYTHONHASHSEED": "0"},
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              stderr=subprocess.DEVNULL, text=True) as driver:
            assert driver.stdin is not None and driver.stdout is not None

            def step(word: str) -> None:
                line = driver.stdout.readline().strip()  # type: ignore[union-attr]
                if line != word:
                    raise RuntimeError(f"{scenario}: the driver said {line!r}, not {word!r}")

            step("warm")
            _control(driver.pid, "--instr=on")
            driver.stdin.write("go\n")
            driver.stdin.flush()
            step("done")
            _control(driver.pid, "--dump")
            _control(driver.pid, "--instr=off")
            driver.stdin.write("go\n")
            driver.stdin.flush()
            driver.wait(timeout=600)
        return _summary(out, scenario) / requests


def _flowsvc_env(var_dir: Path, redis_url: str) -> dict[str, str]:
    """flowsvc with auth and keys, logging its access lines (as served) to its log file.

    Work done on a timer rather than per request is kept out of the counted window: the
    safety-net polls of the session view and the key directory, and the batched writes of
    the key's usage rows and spend. They run every second or so whatever the load, and
    callgrind's fifty-fold slowdown would put dozens of them, each nearly empty, inside a
    window that takes a fraction of a second at full speed. (Their cost per request, in
    full batches, is in the CPU figures of ``bench.bench_keys``.)
    """
    return {"FLOWSVC_SERVICE_VAR_DIR": str(var_dir), "FLOWSVC_SERVICE_LOG_LEVEL": "info",
            "FLOWSVC_SERVICE_COOKIE_SECURE": "false", "FLOWSVC_DATABASE_URL": "",
            "FLOWSVC_REDIS_URL": redis_url, "FLOWSVC_REDIS_PREFIX": f"bench-{os.getpid()}:",
            "FLOWSVC_PLUGINS_ENABLED": '["auth", "keys"]',
            "FLOWSVC_JWT_SECRET": "bench-jwt-secret-" + "j" * 32,
            "FLOWSVC_INTERNAL_TOKEN": "bench-internal-token-" + "i" * 32,
            "FLOWSVC_LIMITS_ANONYMOUS_RPM": str(10**9),
            "FLOWSVC_LIMITS_AUTHENTICATED_RPM": str(10**9),
            "FLOWSVC_PLUGINS_AUTH_REVOCATION_POLL_SECONDS": "3600",
            "FLOWSVC_PLUGINS_KEYS_INVALIDATION_POLL_SECONDS": "3600",
            "FLOWSVC_PLUGINS_KEYS_SPEND_FLUSH_SECONDS": "3600",
            "FLOWSVC_PLUGINS_KEYS_USAGE_FLUSH_SECONDS": "3600"}


def _request_of(scenario: str, base_url: str) -> tuple[str, dict[str, str]]:
    """The path and headers of one request of ``scenario`` (signing in first if needed)."""
    if scenario == "hello":
        return "/hello", {}
    if scenario == "healthz":
        return "/healthz", {}
    if scenario == "me":
        return "/me", {"cookie": f"svc_session={session_cookie(base_url)}"}
    return "/healthz", {"x-api-key": new_key(base_url, 100_000)[0]}


def _send(base_url: str, path: str, headers: dict[str, str], count: int,
          connections: int) -> None:
    """``count`` requests over ``connections`` keep-alive connections at once."""

    def one_connection(share: int) -> None:
        with httpx.Client(base_url=base_url, headers=headers, timeout=300) as http:
            for _ in range(share):
                http.get(path).raise_for_status()

    shares = [count // connections + (index < count % connections)
              for index in range(connections)]
    with concurrent.futures.ThreadPoolExecutor(connections) as pool:
        list(pool.map(one_connection, shares))


def served_instructions(scenario: str, requests: int, warmup: int, redis_url: str,
                        connections: int = 1) -> float:
    """Instructions per request of a real server under callgrind answering ``scenario`` on
    ``connections`` connections at once (more than one lets the Redis meter batch)."""
    with tempfile.TemporaryDirectory(prefix="flowsvc-callgrind-") as folder:
        out = Path(folder) / "callgrind.out"
        bind = f"127.0.0.1:{free_port()}"
        if scenario == "hello":
            argv, env = python_module_argv("bench.hello_app", "--bind", bind), {}
        else:
            argv = python_module_argv("runtime.cli", "--config", os.devnull, "serve",
                                      "--bind", bind)
            env = _flowsvc_env(Path(folder) / "var",
                               redis_url if scenario == "key-redis" else "")
        with running_server(_callgrind(argv, out), base_url=f"http://{bind}",
                            ready_path="/hello" if scenario == "hello" else "/healthz",
                            env={**env, "PYTHONHASHSEED": "0"}, ready_timeout_s=600,
                            stop_grace_s=60) as server:
            path, headers = _request_of(scenario, server.base_url)
            _send(server.base_url, path, headers, warmup, connections)
            _control(server.process.pid, "--instr=on")
            _send(server.base_url, path, headers, requests, connections)
            _control(server.process.pid, "--dump")
            _control(server.process.pid, "--instr=off")
        return _summary(out, scenario) / requests


def _table(title: str, counts: dict[str, float]) -> None:
    hello = counts["hello"]
    print(f"== {title}; ratio = hello-world / scenario ==")
    print(f"{'scenario':<10} {'instructions':>14} {'ratio':>7}")
    for scenario, count in counts.items():
        print(f"{scenario:<10} {count:>14,.0f} {hello / count:>7.3f}")


SERVED = ("hello", "healthz", "me", "key", "key-redis")
# The CPU-per-request goals of issue 13, held against the instruction counts too.
INSTRUCTION_GOALS = {"healthz": 0.92, "me": 0.85, "key": 0.80, "key-redis": 0.65}


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=300, help="counted requests each")
    parser.add_argument("--warmup", type=int, default=200, help="uncounted requests first")
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/0",
                        help="the Redis of the key-redis scenario")
    parser.add_argument("--connections", type=int, default=1,
                        help="served: connections at once (1: sequential and deterministic)")
    parser.add_argument("--no-served", dest="served", action="store_false",
                        help="skip the served scenarios")
    parser.add_argument("--no-in-process", dest="in_process", action="store_false",
                        help="skip the in-process scenarios")
    parser.add_argument("--json", default="pipeline.json", help="file under bench/results/")
    args = parser.parse_args(argv)
    results: dict[str, dict[str, float]] = {}
    if args.served:
        results["served"] = {scenario: served_instructions(
            scenario, args.requests, args.warmup, args.redis_url, args.connections)
            for scenario in SERVED}
        _table(f"instructions per request, served ({args.requests} counted after "
               f"{args.warmup}, {args.connections} keep-alive connection(s))",
               results["served"])
    if args.in_process:
        results["in_process"] = {scenario: in_process_instructions(scenario, args.requests,
                                                                   args.warmup)
                                 for scenario in SCENARIOS}
        _table(f"instructions per request, in process ({args.requests} counted after "
               f"{args.warmup})", results["in_process"])
    ratios = {view: {s: counts["hello"] / c for s, c in counts.items()}
              for view, counts in results.items()}
    write_json(args.json, {"requests": args.requests, "warmup": args.warmup,
                           "instructions_per_request": results, "ratio_to_hello": ratios,
                           "summary": [goal_row(f"{scenario} instructions ratio ({view})",
                                                ratios[view][scenario], goal)
                                       for view in ratios
                                       for scenario, goal in INSTRUCTION_GOALS.items()
                                       if scenario in ratios[view]]})


if __name__ == "__main__":
    main()
