"""Marketplace listing latency with 100,000 published agents, on SQLite and on PostgreSQL.

For each database the script migrates a fresh database, bulk-loads ``--agents`` published
agents (varied earnings, ratings, runs and publication times, one of 20 tags each) with
their ranking history, starts a real ``flowsvc serve`` (auth + marketplace), and loads
``GET /marketplace/agents`` with wrk for every sort: the first page, and a page
``--deep`` agents into the list (its cursor made from the ranking at that position).
Keyset paging must cost the same at any depth, so the two should be alike. Each case
is measured interleaved with the hello-world baseline (``measure_pair``) and reported
with its p50/p99 and ratios.

Run it with ``python -m bench.bench_marketplace`` (``--help`` lists the knobs); PostgreSQL
is measured when ``--postgres-url`` (or ``FLOWSVC_TEST_POSTGRES_URL``) is given, in a
schema of its own that is dropped afterwards. Results go to
``bench/results/marketplace.json``.
"""

import argparse
import datetime
import json
import os
import random
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast

import httpx
import trio
from sqlalchemy import Connection, insert, select

from bench.harness import (
    PairResult,
    compare,
    free_port,
    hello_server,
    measure_pair,
    postgres_schema,
    print_report,
    python_module_argv,
    running_server,
    write_json,
    wrk_found,
)
from plugins.marketplace.ranking import (
    OPEN,
    SORTS,
    Cursor,
    Sort,
    micros,
    now_us,
    rating_score,
    trending_score,
)
from plugins.marketplace.tables import agent_tags, agents, rank_entries
from runtime.bootstrap import open_service
from runtime.config import load_settings
from runtime.storage import make_engine
from runtime.users import create_user

TAGS = [f"tag-{number:02d}" for number in range(20)]
# The marketplace and the plugins it requires (projects also requires chain).
MIGRATED_PLUGINS = '["keys", "chain", "projects", "marketplace"]'
CHUNK = 5000


def service_env(var_dir: Path, database_url: str) -> dict[str, str]:
    """The environment of the flowsvc process under test."""
    return {
        "FLOWSVC_SERVICE_VAR_DIR": str(var_dir),
        "FLOWSVC_SERVICE_LOG_LEVEL": "warning",
        "FLOWSVC_DATABASE_URL": database_url,
        "FLOWSVC_REDIS_URL": "",
        "FLOWSVC_JWT_SECRET": "bench-jwt-secret-" + "x" * 32,
        "FLOWSVC_INTERNAL_TOKEN": "bench-" + "i" * 32,
        "FLOWSVC_PLUGINS_ENABLED": '["auth", "keys", "chain", "projects", "marketplace"]',
        # wrk is one anonymous client: measure the listing, not the per-IP bucket.
        "FLOWSVC_LIMITS_ANONYMOUS_RPM": "0",
    }


def _agent_rows(first_id: int, count: int, owner_id: int, rng: random.Random
                ) -> list[dict[str, Any]]:
    start = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)
    rows = []
    for agent_id in range(first_id, first_id + count):
        ratings = rng.randrange(0, 40)
        published = start + datetime.timedelta(seconds=agent_id * 60 + rng.randrange(60))
        rows.append({
            "id": agent_id, "slug": f"bench-{agent_id:06d}", "owner_id": owner_id,
            "name": f"Bench agent {agent_id}", "description": "An agent of the benchmark.",
            "agent_template": "fullstack-builder", "instructions": "",
            "monetization": {"model": "per_call", "defaultPerCallFlow": "0.010000"},
            "premium": agent_id % 10 == 0, "linked_token": None, "source_project": None,
            "status": "published", "published_at": published, "created_at": published,
            "updated_at": published, "runs_count": rng.randrange(0, 500),
            "earned_micro": rng.randrange(0, 10**10),
            "rating_sum": sum(rng.randrange(1, 6) for _ in range(ratings)),
            "rating_count": ratings,
            "trending_log2": None if rng.random() < 0.2 else rng.uniform(700, 720),
        })
    return rows


def _entries(row: dict[str, Any]) -> list[dict[str, Any]]:
    scores = {"trending": trending_score(row["trending_log2"]),
              "new": micros(row["published_at"]), "top_earning": row["earned_micro"],
              "top_rated": rating_score(row["rating_sum"], row["rating_count"])}
    return [{"sort": sort, "agent_id": row["id"], "score": score,
             "valid_from": micros(row["published_at"]), "valid_to": OPEN}
            for sort, score in scores.items()]


def load_agents(database_url: str, count: int, seed: int) -> None:
    """Migrate the database and bulk-load ``count`` published agents with their rankings."""
    settings = load_settings(None, environ={"FLOWSVC_DATABASE_URL": database_url,
                                            "FLOWSVC_JWT_SECRET": "bench-" + "x" * 32,
                                            "FLOWSVC_INTERNAL_TOKEN": "bench-" + "i" * 32,
                                            "FLOWSVC_PLUGINS_ENABLED": MIGRATED_PLUGINS})

    async def migrate() -> None:
        async with open_service(settings, migrate=True):
            pass

    trio.run(migrate)
    rng = random.Random(seed)
    engine = make_engine(settings.database_url, 1)
    try:
        with engine.begin() as connection:
            owner = create_user(connection, display_name="bench owner")
            for first in range(1, count + 1, CHUNK):
                rows = _agent_rows(first, min(CHUNK, count + 1 - first), owner.id, rng)
                connection.execute(insert(agents), rows)
                connection.execute(insert(rank_entries),
                                   [entry for row in rows for entry in _entries(row)])
                connection.execute(insert(agent_tags), [
                    {"agent_id": row["id"], "tag": rng.choice(TAGS)} for row in rows])
        # A bulk load leaves the planner without statistics (autovacuum would gather them
        # within a minute on PostgreSQL); without them it sorts every row for a page.
        with engine.connect() as connection:
            connection.execution_options(isolation_level="AUTOCOMMIT").exec_driver_sql("ANALYZE")
    finally:
        engine.dispose()


def deep_cursor(database_url: str, sort: str, position: int) -> str:
    """A cursor standing after the agent at ``position`` (1-based) of ``sort``."""
    settings = load_settings(None, environ={"FLOWSVC_DATABASE_URL": database_url,
                                            "FLOWSVC_JWT_SECRET": "bench-" + "x" * 32,
                                            "FLOWSVC_INTERNAL_TOKEN": "bench-" + "i" * 32})
    engine = make_engine(settings.database_url, 1)
    try:
        with engine.connect() as connection:
            row = _at_position(connection, sort, position)
    finally:
        engine.dispose()
    now = now_us()
    return Cursor(cast(Sort, sort), None, now, now, int(row.score), int(row.agent_id)).encode()


def _at_position(connection: Connection, sort: str, position: int) -> Any:
    entry = rank_entries.c
    return connection.execute(
        select(entry.score, entry.agent_id).where(entry.sort == sort)
        .order_by(entry.score.desc(), entry.agent_id.desc())
        .offset(position - 1).limit(1)).one()


def measure_backend(name: str, database_url: str, args: argparse.Namespace
                    ) -> dict[str, PairResult]:
    """Load the agents, serve them, and measure every case against hello-world."""
    print(f"{name}: loading {args.agents} agents...", flush=True)
    load_agents(database_url, args.agents, args.seed)
    cases = {f"{sort} first page": f"/marketplace/agents?sort={sort}" for sort in SORTS}
    cases.update({f"{sort} page at {args.deep}": "/marketplace/agents?cursor="
                  + deep_cursor(database_url, sort, args.deep) for sort in SORTS})
    cases["trending first page, tag filter"] = f"/marketplace/agents?sort=trending&tag={TAGS[3]}"
    port = free_port()
    argv = python_module_argv("runtime.cli", "serve", "--bind", f"127.0.0.1:{port}")
    results: dict[str, PairResult] = {}
    with tempfile.TemporaryDirectory(prefix="flowsvc-bench-market-") as var_dir, \
            hello_server() as hello, \
            running_server(argv, base_url=f"http://127.0.0.1:{port}", ready_path="/healthz",
                           env=service_env(Path(var_dir), database_url)) as service:
        for label, path in cases.items():
            check = httpx.get(service.url(path), timeout=30)
            if check.status_code != 200 or len(check.json()["agents"]) == 0:
                raise RuntimeError(f"{label}: {check.status_code} {check.text[:300]}")
            results[label] = measure_pair(hello.url("/hello"), service.url(path),
                                          rounds=args.rounds, duration_s=args.duration,
                                          connections=args.connections, threads=1)
    print_report(f"GET /marketplace/agents on {name}, {args.agents} agents: {args.rounds} "
                 f"round(s) of {args.duration} s, {args.connections} connections",
                 [("hello-world", next(iter(results.values())).baseline)]
                 + [(label, pair.candidate) for label, pair in results.items()])
    return results


def main(argv: Sequence[str] | None = None) -> int:
    """Measure the listing on each database; print the tables and write the JSON."""
    parser = argparse.ArgumentParser(description="Marketplace listing latency per sort.")
    parser.add_argument("--agents", type=int, default=100_000, help="published agents")
    parser.add_argument("--deep", type=int, default=90_000,
                        help="position of the deep page's cursor")
    parser.add_argument("--duration", type=int, default=5, help="seconds per wrk run")
    parser.add_argument("--rounds", type=int, default=1, help="interleaved rounds per case")
    parser.add_argument("--connections", type=int, default=8, help="wrk connections")
    parser.add_argument("--seed", type=int, default=1, help="random seed of the agents")
    parser.add_argument("--postgres-url", default=os.environ.get("FLOWSVC_TEST_POSTGRES_URL", ""),
                        help="a PostgreSQL database to measure too (a schema is made in it)")
    parser.add_argument("--json", default="marketplace.json", help="file under bench/results/")
    args = parser.parse_args(argv)
    if not 1 <= args.deep <= args.agents:
        parser.error("--deep must be between 1 and --agents")
    if not wrk_found():
        return 2
    report: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="flowsvc-bench-sqlite-") as folder:
        report["sqlite"] = measure_backend("SQLite", f"sqlite:///{folder}/bench.db", args)
    if args.postgres_url:
        with postgres_schema(args.postgres_url) as url:
            report["postgresql"] = measure_backend("PostgreSQL", url, args)
    path = write_json(args.json, {
        "command": " ".join(["python -m bench.bench_marketplace",
                             *(sys.argv[1:] if argv is None else argv)]),
        "measured_at": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "cpu_count": os.cpu_count(),
        "agents": args.agents,
        "deep": args.deep,
        "results": {backend: {label: {"pair": pair, "ratios": compare(pair.baseline,
                                                                      pair.candidate)}
                              for label, pair in cases.items()}
                    for backend, cases in report.items()},
    })
    print(f"results written to {path}")
    print(json.dumps({backend: {label: [round(pair.candidate.p50_ms, 2),
                                        round(pair.candidate.p99_ms, 2)]
                                for label, pair in cases.items()}
                      for backend, cases in report.items()}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
