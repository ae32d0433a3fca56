"""A key's usage answer at 10 million log rows against 1,000, on PostgreSQL.

The script migrates a fresh schema, starts a real ``flowsvc serve`` (auth + keys), signs a
wallet in and creates two keys through the API. It loads ``--small`` usage rows for the
first key and ``--large`` rows for the second (one ``INSERT ... SELECT generate_series``
each, spread over the last 29 days, with several models and statuses, foreign key checks
off for the load), rolls them up the
way migration keys_0004 does, and ``ANALYZE``s. Then it asks ``GET
/me/api-keys/<id>/usage`` (``since`` all, month and day) and ``GET
/me/api-keys/<id>/series?window=month`` of both keys, interleaved, ``--requests`` times
each, and reports the median and p90 latency of each and the ratio large / small: the
rollups make the answer cost the same however many rows the log holds (goal: the ratio of
medians at most 1.5 on this loaded machine). For scale, it also times once the aggregate
the answer used to compute over the log's rows.

Run it with ``python -m bench.bench_usage_rollup --postgres-url postgresql://...`` (or
``FLOWSVC_TEST_POSTGRES_URL``); it works in a schema of its own, dropped afterwards.
Results go to ``bench/results/usage_rollup.json``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import psycopg
import trio

from bench.harness import (
    free_port,
    goal_row,
    postgres_schema,
    python_module_argv,
    running_server,
    signed_in,
    write_json,
)
from runtime.bootstrap import open_service
from runtime.config import load_settings

SPAN_DAYS = 29
ROLLUP_WIDTHS = (60, 3600, 86400)
GOAL = 1.5


def service_env(database_url: str, var_dir: Path | None = None) -> dict[str, str]:
    return {
        "FLOWSVC_SERVICE_VAR_DIR": str(var_dir or Path(tempfile.gettempdir())),
        "FLOWSVC_SERVICE_LOG_LEVEL": "warning",
        "FLOWSVC_SERVICE_COOKIE_SECURE": "false",
        "FLOWSVC_DATABASE_URL": database_url,
        "FLOWSVC_REDIS_URL": "",
        "FLOWSVC_JWT_SECRET": "bench-jwt-secret-" + "x" * 32,
        "FLOWSVC_INTERNAL_TOKEN": "bench-" + "i" * 32,
        "FLOWSVC_PLUGINS_ENABLED": '["auth", "keys"]',
        "FLOWSVC_LIMITS_AUTHENTICATED_RPM": "0",
    }


def migrate(database_url: str) -> None:
    settings = load_settings(None, environ=service_env(database_url))

    async def upgrade() -> None:
        async with open_service(settings, migrate=True):
            pass

    trio.run(upgrade)


def load_rows(connection: psycopg.Connection[Any], key_id: int, rows: int) -> None:
    """``rows`` usage rows of ``key_id`` over the last ``SPAN_DAYS`` days, and their rollups
    (the statements of migration keys_0004)."""
    # A bulk load: the foreign key's per-row checks off (every row names the key just made).
    connection.execute("SET session_replication_role = replica")
    connection.execute(
        "INSERT INTO api_key_usage (key_id, at, kind, method, route, status, cost, model, "
        "latency_us, request_id) "
        "SELECT %(key)s, now() - make_interval(secs => n * %(step)s), "
        "CASE WHEN mod(n, 10) = 0 THEN 'charge' ELSE 'request' END, "
        "CASE WHEN mod(n, 10) = 0 THEN NULL ELSE 'GET' END, "
        "CASE WHEN mod(n, 10) = 0 THEN NULL ELSE '/me' END, "
        "CASE WHEN mod(n, 10) = 0 THEN NULL WHEN mod(n, 7) = 0 THEN 429 "
        "WHEN mod(n, 11) = 0 THEN 500 ELSE 200 END, 1000 + mod(n, 100), 'model-' || (mod(n, 5)), "
        "CASE WHEN mod(n, 10) = 0 THEN NULL ELSE 100 + mod(n, 900) END, NULL "
        "FROM generate_series(1, %(rows)s) AS n",
        {"key": key_id, "rows": rows, "step": SPAN_DAYS * 86400 / rows})
    outcome = ("CASE WHEN status IS NULL THEN 'none' WHEN status < 400 THEN 'ok' "
               "WHEN status = 402 THEN '402' WHEN status = 429 THEN '429' "
               "WHEN status < 500 THEN '4xx' ELSE '5xx' END")
    for seconds in ROLLUP_WIDTHS:
        connection.execute(
            "INSERT INTO api_key_usage_rollups (key_id, bucket_seconds, bucket_start, kind, "
            "model, outcome, calls, cost, latency_us) "
            f"SELECT key_id, {seconds}, "
            f"to_timestamp(floor(extract(epoch FROM at) / {seconds}) * {seconds}), kind, "
            f"COALESCE(model, 'unknown'), {outcome}, count(*), sum(cost), "
            "COALESCE(sum(latency_us), 0) FROM api_key_usage WHERE key_id = %(key)s "
            "GROUP BY 1, 3, 4, 5, 6", {"key": key_id})


def raw_aggregate_seconds(connection: psycopg.Connection[Any], key_id: int) -> float:
    """The time of the aggregate the usage answer computed over the log before rollups."""
    started = time.perf_counter()
    connection.execute(
        "SELECT model, kind, count(*), sum(cost), sum(CASE WHEN status >= 400 THEN 1 ELSE 0 "
        "END), sum(latency_us) FROM api_key_usage WHERE key_id = %s GROUP BY model, kind",
        (key_id,)).fetchall()
    return time.perf_counter() - started


def timed(http: httpx.Client, path: str, params: dict[str, str]) -> float:
    started = time.perf_counter()
    response = http.get(path, params=params)
    elapsed = time.perf_counter() - started
    response.raise_for_status()
    return elapsed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--postgres-url", default=os.environ.get("FLOWSVC_TEST_POSTGRES_URL"))
    parser.add_argument("--small", type=int, default=1_000)
    parser.add_argument("--large", type=int, default=10_000_000)
    parser.add_argument("--requests", type=int, default=100)
    args = parser.parse_args(argv)
    if not args.postgres_url:
        print("bench_usage_rollup needs --postgres-url or FLOWSVC_TEST_POSTGRES_URL",
              file=sys.stderr)
        return 2
    load = " ".join(open("/proc/loadavg", encoding="ascii").read().split()[:3])
    with postgres_schema(args.postgres_url) as url:
        migrate(url)
        results = measure(url, args, load)
    write_json("usage_rollup.json", results)
    return 0


def measure(url: str, args: argparse.Namespace, load: str) -> dict[str, Any]:
    """Load the rows, ask for both keys' usage, report and return the figures."""
    port = free_port()
    argv = python_module_argv("runtime.cli", "--config", os.devnull, "serve",
                              "--bind", f"127.0.0.1:{port}")
    # A loaded machine can take more than the default 20 s to start a server.
    with tempfile.TemporaryDirectory(prefix="flowsvc-bench-var-") as var_dir, \
            running_server(argv, base_url=f"http://127.0.0.1:{port}", ready_path="/healthz",
                           env=service_env(url, Path(var_dir)), ready_timeout_s=120) as server, \
            httpx.Client(base_url=server.base_url, timeout=60) as http:
        signed_in(http)
        key_ids = {}
        for name in ("small", "large"):
            created = http.post("/me/api-keys", json={"name": name, "rate_limit_rpm": 0})
            created.raise_for_status()
            key_ids[name] = created.json()["key"]["id"]
        plain = url.replace("postgresql+psycopg://", "postgresql://")
        with psycopg.connect(plain, autocommit=True) as connection:
            started = time.perf_counter()
            for name in ("small", "large"):
                load_rows(connection, int(key_ids[name]), getattr(args, name))
            connection.execute("ANALYZE api_key_usage")
            connection.execute("ANALYZE api_key_usage_rollups")
            loaded_s = time.perf_counter() - started
            raw_s = {name: raw_aggregate_seconds(connection, int(key_ids[name]))
                     for name in key_ids}
            rollup_rows = connection.execute(
                "SELECT key_id, count(*) FROM api_key_usage_rollups GROUP BY key_id"
            ).fetchall()
        queries = [(f"usage since={since}", "usage", {"since": since})
                   for since in ("all", "month", "day")] + [
            ("series window=month", "series", {"window": "month"})]
        samples: dict[tuple[str, str], list[float]] = {}
        for _ in range(args.requests):
            for label, route, params in queries:
                for name, key_id in key_ids.items():
                    samples.setdefault((label, name), []).append(
                        timed(http, f"/me/api-keys/{key_id}/{route}", params))
    results: dict[str, Any] = {"rows": {"small": args.small, "large": args.large},
                               "load_seconds": round(loaded_s, 1), "load_average": load,
                               "rollup_rows": {str(key): count for key, count in rollup_rows},
                               "raw_aggregate_ms": {name: round(seconds * 1000, 1)
                                                    for name, seconds in raw_s.items()},
                               "queries": {}, "summary": []}
    print(f"loaded {args.small} + {args.large} rows in {loaded_s:.0f} s (load {load}); "
          f"the old aggregate over the log: small {raw_s['small'] * 1000:.1f} ms, "
          f"large {raw_s['large'] * 1000:.0f} ms")
    for label, _, _ in queries:
        figures = {}
        for name in key_ids:
            times = sorted(samples[(label, name)])
            figures[name] = {"p50_ms": statistics.median(times) * 1000,
                             "p90_ms": times[int(len(times) * 0.9)] * 1000}
        ratio = figures["large"]["p50_ms"] / figures["small"]["p50_ms"]
        results["queries"][label] = {**figures, "p50_ratio": round(ratio, 3)}
        results["summary"].append(goal_row(f"{label}: p50 at {args.large:,} rows / at "
                                           f"{args.small:,}", round(ratio, 3), GOAL,
                                           at_most=True))
        print(f"{label:22} small p50 {figures['small']['p50_ms']:6.2f} ms "
              f"p90 {figures['small']['p90_ms']:6.2f} | large p50 "
              f"{figures['large']['p50_ms']:6.2f} ms p90 {figures['large']['p90_ms']:6.2f} "
              f"| ratio {ratio:.3f}")
    return results


if __name__ == "__main__":
    sys.exit(main())
