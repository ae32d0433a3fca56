"""The API-key path against the bare hello-world, with in-process and Redis meters.

Measures, in one run: the hello-world baseline; flowsvc's ``GET /healthz`` without a key
(the pipeline's own cost, for reference); the same GET with ``x-api-key`` on the embedded
backend (SQLite, in-process meters); and with Redis meters. Every key request goes through
the whole key path: authentication from the in-process cache, the key's window, the owner's
bucket and the spend meter, the headers and the usage log. The key's cap (100000 per
minute) and the owner's bucket (raised to 10^9) never refuse, so every request does all
the work and none is a cheap 429. The headline is CPU per request against the
hello-world's (``harness.Measured``); goals: >= 0.92 without a key, >= 0.80 in process,
>= 0.65 with Redis. Then the key path on Redis with two processes behind one port
(``--workers 2``) against one, in the same run: goal >= 1.6x the requests per second.

Then the cap's accuracy under load: a key capped at ``--cap`` requests per minute is loaded
by wrk for a few seconds (16 connections), on one process in memory and on two processes
sharing Redis (one wrk each, at the same time); the requests admitted should equal the cap.

Run ``python -m bench.bench_keys`` (``--help`` for the knobs); it writes
``bench/results/keys.json``. Redis must answer at ``--redis-url``.
"""

import argparse
import concurrent.futures
import contextlib
import datetime
import os
import secrets
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence

import httpx

from bench.harness import (
    Measured,
    RunningServer,
    free_port,
    goal_row,
    hello_server,
    measure_pair,
    measure_servers,
    new_key,
    python_module_argv,
    report_measured,
    run_wrk,
    running_server,
    write_json,
    wrk_found,
)


def _env(var_dir: str, redis_url: str, prefix: str) -> dict[str, str]:
    return {
        "FLOWSVC_SERVICE_VAR_DIR": var_dir,
        "FLOWSVC_DATABASE_URL": f"sqlite:///{var_dir}/flowsvc.db",
        "FLOWSVC_REDIS_URL": redis_url,
        "FLOWSVC_REDIS_PREFIX": prefix,
        "FLOWSVC_SERVICE_LOG_LEVEL": "warning",
        "FLOWSVC_SERVICE_COOKIE_SECURE": "false",
        "FLOWSVC_LIMITS_AUTHENTICATED_RPM": "1000000000",
        "FLOWSVC_PLUGINS_ENABLED": '["auth", "keys"]',
        # Outside the embedded default the two processes must share their secrets.
        "FLOWSVC_JWT_SECRET": "bench-jwt-secret-" + "j" * 32 + prefix,
        "FLOWSVC_INTERNAL_TOKEN": "bench-internal-token-" + "i" * 32 + prefix,
    }


@contextlib.contextmanager
def _flowsvc(env: dict[str, str]) -> Iterator[RunningServer]:
    port = free_port()
    argv = python_module_argv("runtime.cli", "serve", "--bind", f"127.0.0.1:{port}")
    with running_server(argv, base_url=f"http://127.0.0.1:{port}", ready_path="/healthz",
                        env=env, ready_timeout_s=60) as server:
        yield server


def _logged_admissions(servers: Sequence[RunningServer], key_id: str, cookie: str) -> int:
    """Admitted requests of a key by its usage log, once every server's log is written."""
    for server in servers:
        while httpx.get(server.url("/readyz"), timeout=30).json()[
                "checks"]["keys.usage"]["buffered"]:
            time.sleep(0.2)
    time.sleep(1.0)  # the batch being written when the buffer emptied
    with httpx.Client(base_url=servers[0].base_url, cookies={"svc_session": cookie},
                      timeout=30) as http:
        usage = http.get(f"/me/api-keys/{key_id}/usage").json()["usage"]
    return int(usage["requests"] - usage["errors"])


def _accuracy(servers: Sequence[RunningServer], cap: int, duration_s: int) -> dict[str, int]:
    """Load one key capped at ``cap`` on every server at once; how many were admitted."""
    raw, key_id, cookie = new_key(servers[0].base_url, cap)
    with concurrent.futures.ThreadPoolExecutor(len(servers)) as pool:
        runs = list(pool.map(lambda server: run_wrk(
            server.url("/healthz"), duration_s=duration_s, connections=16, threads=1,
            headers={"x-api-key": raw}), servers))
    dropped = 0
    for server in servers:
        checks = httpx.get(server.url("/readyz"), timeout=30).json()["checks"]
        dropped += checks["keys.usage"]["dropped_overflow"]
    return {"cap": cap, "admitted": _logged_admissions(servers, key_id, cookie),
            "refused": sum(run.non_2xx for run in runs), "log_dropped": dropped,
            "processes": len(servers)}


@contextlib.contextmanager
def _workers(env: dict[str, str], workers: int) -> Iterator[RunningServer]:
    """``flowsvc serve --workers N``: N processes sharing one listening socket."""
    port = free_port()
    argv = python_module_argv("runtime.cli", "serve", "--bind", f"127.0.0.1:{port}",
                              "--workers", str(workers))
    with running_server(argv, base_url=f"http://127.0.0.1:{port}", ready_path="/healthz",
                        env=env, ready_timeout_s=90) as server:
        yield server


def _scaling(redis_env: dict[str, str], args: argparse.Namespace) -> dict[str, float]:
    """Requests per second of the key path on one process and on two behind one port, both
    on Redis, interleaved in the same run."""
    with _workers(redis_env, 1) as one, _workers(redis_env, 2) as two:
        raw = new_key(one.base_url, 100_000)[0]
        pair = measure_pair(one.url("/healthz"), two.url("/healthz"), rounds=args.rounds,
                            duration_s=args.duration, connections=args.connections * 2,
                            threads=2, headers={"x-api-key": raw})
    return {"one_process_rps": pair.baseline.rps, "two_processes_rps": pair.candidate.rps,
            "scaling": pair.candidate.rps / pair.baseline.rps}


def main(argv: Sequence[str] | None = None) -> int:
    """Measure the key path, print the report; return the exit status."""
    parser = argparse.ArgumentParser(description="Measure the API-key path.")
    parser.add_argument("--duration", type=int, default=3, help="seconds per wrk run")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds per side")
    parser.add_argument("--connections", type=int, default=16, help="wrk connections")
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/0")
    parser.add_argument("--cap", type=int, default=500, help="key cap for the accuracy run")
    parser.add_argument("--json", default="keys.json", help="file under bench/results/")
    args = parser.parse_args(argv)
    if not wrk_found():
        return 2
    prefix = f"flowsvc-bench:{secrets.token_hex(4)}:"
    knobs = {"rounds": args.rounds, "duration_s": args.duration,
             "connections": args.connections}
    measured: dict[str, Measured] = {}
    accuracy = []
    with tempfile.TemporaryDirectory() as memory_dir, tempfile.TemporaryDirectory() as redis_dir:
        memory_env = _env(memory_dir, "", prefix)
        redis_env = _env(redis_dir, args.redis_url, prefix)
        with hello_server() as hello, _flowsvc(memory_env) as embedded:
            raw = new_key(embedded.base_url, 100_000)[0]
            measured["no key"] = measure_servers(hello, "/hello", embedded, "/healthz", **knobs)
            measured["key, in process"] = measure_servers(
                hello, "/hello", embedded, "/healthz", headers={"x-api-key": raw}, **knobs)
            accuracy.append({"backend": "memory", **_accuracy([embedded], args.cap, 3)})
        with hello_server() as hello, _flowsvc(redis_env) as first, _flowsvc(redis_env) as second:
            raw = new_key(first.base_url, 100_000)[0]
            measured["key, Redis"] = measure_servers(hello, "/hello", first, "/healthz",
                                                     headers={"x-api-key": raw}, **knobs)
            accuracy.append({"backend": "redis", **_accuracy([first, second], args.cap, 3)})
        scaling = _scaling(redis_env, args)
    goals = {"no key": 0.92, "key, in process": 0.80, "key, Redis": 0.65}
    for name, result in measured.items():
        report_measured(f"x-api-key GET /healthz, {name} (goal: CPU ratio >= {goals[name]}): "
                        f"{args.rounds} rounds of {args.duration} s, {args.connections} "
                        f"connections", result, "hello-world", f"flowsvc {name}")
    for entry in accuracy:
        print(f"cap accuracy ({entry['backend']}, {entry['processes']} process(es)): "
              f"{entry['admitted']} admitted for a cap of {entry['cap']} "
              f"({entry['refused']} refused, {entry['log_dropped']} log entries dropped)")
    print(f"two processes on Redis behind one port: {scaling['two_processes_rps']:.0f} rps, "
          f"one: {scaling['one_process_rps']:.0f} rps, x{scaling['scaling']:.2f} "
          f"(goal: >= 1.6)")
    path = write_json(args.json, {
        "command": " ".join(["python -m bench.bench_keys",
                             *(sys.argv[1:] if argv is None else argv)]),
        "measured_at": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "cpu_count": os.cpu_count(),
        "measured": measured,
        "ratios": {name: result.ratios() for name, result in measured.items()},
        "accuracy": accuracy,
        "scaling": scaling,
        "summary": [goal_row(f"x-api-key /healthz, {name}: CPU ratio", result.cpu_ratio,
                             goals[name]) for name, result in measured.items()]
        + [goal_row("two processes on Redis / one (rps)", scaling["scaling"], 1.6)],
    })
    _forget_redis_keys(args.redis_url, prefix)
    print(f"results written to {path}")
    return 0


def _forget_redis_keys(redis_url: str, prefix: str) -> None:
    import redis

    connection = redis.Redis.from_url(redis_url)
    try:
        names = list(connection.scan_iter(match=f"{prefix}*"))
        if names:
            connection.delete(*names)
    finally:
        connection.close()


if __name__ == "__main__":
    sys.exit(main())
