"""The API-key path against the bare hello-world, with in-process and Redis meters.

Measures, in one run: the hello-world baseline; flowsvc's ``GET /healthz`` without a key
(the pipeline's own cost, for reference); the same GET with ``x-api-key`` on the embedded
backend (SQLite, in-process meters); and with Redis meters. Every key request goes through
the whole key path: authentication from the in-process cache, the key's window, the owner's
bucket and the spend meter, the headers and the usage log. The key's cap (100000 per
minute) and the owner's bucket (raised to 10^9) never refuse, so every request does all
the work and none is a cheap 429. Goals: rps ratio >= 0.75 in process, >= 0.55 with Redis.

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
from eth_account import Account
from eth_account.messages import encode_defunct

from bench.harness import (
    RunningServer,
    WrkMissingError,
    WrkResult,
    compare,
    free_port,
    hello_server,
    measure_pair,
    print_report,
    python_module_argv,
    require_wrk,
    run_wrk,
    running_server,
    write_json,
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


def _new_key(base_url: str, rate_limit_rpm: int) -> tuple[str, str, str]:
    """Sign in with a fresh wallet and create a key: (raw key, key id, session cookie)."""
    wallet = Account.create()
    address = wallet.address.lower()
    with httpx.Client(base_url=base_url, timeout=30) as http:
        message = http.post("/auth/nonce", json={"address": address}).json()["message"]
        signature = wallet.sign_message(encode_defunct(text=message)).signature.hex()
        verified = http.post("/auth/verify", json={
            "address": address, "message": message,
            "signature": "0x" + signature.removeprefix("0x")})
        verified.raise_for_status()
        created = http.post("/me/api-keys", json={"name": "bench",
                                                  "rate_limit_rpm": rate_limit_rpm})
        created.raise_for_status()
        key = created.json()["key"]
        return key["raw_key"], key["id"], http.cookies["svc_session"]


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
    raw, key_id, cookie = _new_key(servers[0].base_url, cap)
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
    try:
        require_wrk()
    except WrkMissingError as error:
        print(error, file=sys.stderr)
        return 2
    prefix = f"flowsvc-bench:{secrets.token_hex(4)}:"
    measure = dict(rounds=args.rounds, duration_s=args.duration, connections=args.connections)
    rows: list[tuple[str, WrkResult]] = []
    pairs = {}
    accuracy = []
    with tempfile.TemporaryDirectory() as memory_dir, tempfile.TemporaryDirectory() as redis_dir:
        memory_env = _env(memory_dir, "", prefix)
        redis_env = _env(redis_dir, args.redis_url, prefix)
        with hello_server() as hello, _flowsvc(memory_env) as embedded:
            raw = _new_key(embedded.base_url, 100_000)[0]
            pairs["no key"] = measure_pair(hello.url("/hello"), embedded.url("/healthz"),
                                           **measure)
            pairs["key, in process"] = measure_pair(
                hello.url("/hello"), embedded.url("/healthz"), headers={"x-api-key": raw},
                **measure)
            accuracy.append({"backend": "memory", **_accuracy([embedded], args.cap, 3)})
        with hello_server() as hello, _flowsvc(redis_env) as first, _flowsvc(redis_env) as second:
            raw = _new_key(first.base_url, 100_000)[0]
            pairs["key, Redis"] = measure_pair(hello.url("/hello"), first.url("/healthz"),
                                               headers={"x-api-key": raw}, **measure)
            accuracy.append({"backend": "redis", **_accuracy([first, second], args.cap, 3)})
    rows.append(("hello-world (baseline)", pairs["no key"].baseline))
    for name, pair in pairs.items():
        ratios = compare(pair.baseline, pair.candidate)
        rows.append((f"flowsvc {name} (rps x{ratios['rps_ratio']:.3f} of its own baseline)",
                     pair.candidate))
    print_report(f"x-api-key GET /healthz: {args.rounds} rounds of {args.duration} s, "
                 f"{args.connections} connections; ratios in the names are against the "
                 f"baseline measured in the same pair", rows)
    for entry in accuracy:
        print(f"cap accuracy ({entry['backend']}, {entry['processes']} process(es)): "
              f"{entry['admitted']} admitted for a cap of {entry['cap']} "
              f"({entry['refused']} refused, {entry['log_dropped']} log entries dropped)")
    path = write_json(args.json, {
        "command": " ".join(["python -m bench.bench_keys",
                             *(sys.argv[1:] if argv is None else argv)]),
        "measured_at": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "cpu_count": os.cpu_count(),
        "pairs": pairs,
        "ratios": {name: compare(pair.baseline, pair.candidate) for name, pair in pairs.items()},
        "accuracy": accuracy,
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
