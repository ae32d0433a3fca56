"""Webhook delivery: deliveries per second to a local receiver, and event-to-delivery latency.

A real ``flowsvc serve`` process (auth, webhooks and chain plugins) delivers to a receiver
running in this process (``tests.support.webhook_receiver``: Trio + h11 on loopback), once on
the embedded default (SQLite, in-process state) and once on PostgreSQL when a URL is given.

* **Throughput.** This process writes ``--events`` events into the service's outbox in one
  transaction (through ``emit_event``, as a plugin would) and times the receiver from the first
  delivery to the last (``drain s`` runs from the commit to the last delivery, so it includes
  the dispatcher noticing the rows: ``poll_seconds`` is 0.1 here). The baseline, measured in
  the same run on the same receiver, is a bare sender: a separate process that signs and POSTs
  the same number of envelopes with the same concurrency and no database, so the ratio is what
  durability (claim and settle transactions) costs. The headline, as in the request-path
  benchmarks, is **CPU per delivery**: the service process's user+system time over the drain
  (from ``/proc``) against the bare sender's own CPU time over its sending, divided by the
  deliveries; their ratio (bare / service) hardly moves with the machine's load, where
  deliveries per second do.
* **Latency.** ``POST /me/webhooks/:id/test`` is called ``--rate`` times a second for
  ``--seconds`` seconds; each ping is emitted, committed and woken in the service process, and its
  latency is the receiver's arrival time minus the envelope's ``created_at``. The API request's
  own latency is shown beside it for scale.

Run it with ``python -m bench.bench_webhooks`` (``--help`` lists the knobs; ``--postgres-url``,
default ``FLOWSVC_TEST_POSTGRES_URL``, adds the PostgreSQL run). It prints the tables and writes
``bench/results/webhooks.json``.
"""

import argparse
import datetime
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from datetime import UTC
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import trio
from sqlalchemy import Connection

from bench.harness import (
    cpu_seconds,
    free_port,
    goal_row,
    postgres_schema,
    python_module_argv,
    running_server,
    session_cookie,
    write_json,
)
from plugins.webhooks.signing import envelope_body, new_secret, sign_delivery
from runtime.bootstrap import open_service
from runtime.config import load_settings
from runtime.service import Service
from tests.support.webhook_receiver import Received, running_receiver

EVENT = "flow.balance.low"


def service_env(var_dir: Path, database_url: str, concurrency: int) -> dict[str, str]:
    """The environment of the flowsvc process under test (every setting it depends on)."""
    return {
        "FLOWSVC_SERVICE_VAR_DIR": str(var_dir),
        "FLOWSVC_SERVICE_LOG_LEVEL": "warning",
        "FLOWSVC_SERVICE_COOKIE_SECURE": "false",
        "FLOWSVC_DATABASE_URL": database_url,
        "FLOWSVC_REDIS_URL": "",
        "FLOWSVC_JWT_SECRET": "bench-jwt-secret-" + "x" * 32,
        "FLOWSVC_INTERNAL_TOKEN": "bench-internal-token-" + "i" * 32,
        "FLOWSVC_PLUGINS_ENABLED": '["auth", "webhooks", "chain"]',
        "FLOWSVC_LIMITS_AUTHENTICATED_RPM": str(10**9),
        "FLOWSVC_PLUGINS_WEBHOOKS_ALLOW_HTTP": "true",
        "FLOWSVC_PLUGINS_WEBHOOKS_ALLOWED_HOSTS": '["127.0.0.1"]',
        "FLOWSVC_PLUGINS_WEBHOOKS_PER_HOST_CONCURRENCY": str(concurrency),
        "FLOWSVC_PLUGINS_WEBHOOKS_POLL_SECONDS": "0.1",
    }


def percentile(values: Sequence[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def rate_of(received: Sequence[Received]) -> float:
    """Deliveries per second from the first arrival to the last."""
    span = received[-1].at - received[0].at
    return (len(received) - 1) / span if span > 0 else float("inf")


def emit_many(service: Service, user_id: int, count: int, connection: Connection) -> None:
    for index in range(count):
        service.emit_event(connection, user_id=user_id, name=EVENT,
                           data={"balance": f"{index}.000000", "threshold": "1.000000"})


GOALS = {"in-process (SQLite)": {"ratio": 0.8},
         "PostgreSQL": {"ratio": 0.8, "deliveries_per_s": 600}}
LATENCY_P99_GOAL_MS = 100.0
LATENCY_RATE = 50.0
CPU_LINE = "BARE_SENDER_CPU_S "


async def bare_send(url: str, count: int, concurrency: int) -> None:
    """The baseline: sign and POST ``count`` envelopes with ``concurrency`` workers; print the
    CPU seconds that took (``CPU_LINE``), start-up and imports left out."""
    started = time.process_time()
    secret = new_secret()
    left = iter(range(count))
    limits = httpx.Limits(max_connections=concurrency)
    async with httpx.AsyncClient(limits=limits, timeout=30) as http:

        async def worker() -> None:
            for index in left:
                event_id = f"evt_{index:032x}"
                body = envelope_body(event_id, EVENT, 1, datetime.datetime.now(UTC), {})
                headers = sign_delivery(secret, body, timestamp=int(time.time()),
                                        event_id=event_id)
                headers["Content-Type"] = "application/json"
                (await http.post(url, content=body, headers=headers)).raise_for_status()

        async with trio.open_nursery() as nursery:
            for _ in range(concurrency):
                nursery.start_soon(worker)
    print(f"{CPU_LINE}{time.process_time() - started}")


async def measure(base_url: str, pid: int, token: str, env: dict[str, str],
                  args: argparse.Namespace) -> dict[str, Any]:
    async with running_receiver() as receiver, httpx.AsyncClient(
            base_url=base_url, cookies={"svc_session": token}, timeout=30) as http:
        user_id = int((await http.get("/me")).json()["user"]["id"])
        created = await http.post("/me/webhooks", json={"url": receiver.url(), "events": []})
        webhook_id = created.json()["webhook"]["id"]

        # The emitter's one transaction of ``--events`` events is set-up, not measured: on a
        # loaded machine it may outlast the usual 5 s database deadline.
        emitter_env = {**env, "FLOWSVC_DATABASE_TIMEOUT_SECONDS": "120"}
        async with open_service(load_settings(None, emitter_env), migrate=False,
                                environ=emitter_env) as emitter:
            await emitter.db.write(partial(emit_many, emitter, user_id, args.events))
            committed = time.time()
            service_cpu = cpu_seconds(pid)
            delivered = await receiver.wait_for(args.events, timeout=300)
            service_cpu = cpu_seconds(pid) - service_cpu
        service_rate = rate_of(delivered)
        drained = delivered[-1].at - committed

        receiver.received.clear()
        sender = await trio.run_process(python_module_argv(
            "bench.bench_webhooks", "--bare-sender", receiver.url(), str(args.events),
            str(args.concurrency)), capture_stdout=True)
        baseline_rate = rate_of(receiver.received)
        baseline_cpu = float(sender.stdout.decode().rsplit(CPU_LINE, 1)[1])

        receiver.received.clear()
        request_ms: list[float] = []

        async def ping() -> None:
            started = time.perf_counter()
            answer = await http.post(f"/me/webhooks/{webhook_id}/test")
            answer.raise_for_status()
            request_ms.append((time.perf_counter() - started) * 1000)

        pings = int(args.rate * args.seconds)
        async with trio.open_nursery() as nursery:
            start = trio.current_time()
            for index in range(pings):
                await trio.sleep_until(start + index / args.rate)
                nursery.start_soon(ping)
        arrived = await receiver.wait_for(pings, timeout=60)
        latency_ms = [
            (request.at - datetime.datetime.fromisoformat(
                json.loads(request.body)["created_at"]).timestamp()) * 1000
            for request in arrived]
    service_cpu_us = service_cpu / args.events * 1e6
    baseline_cpu_us = baseline_cpu / args.events * 1e6
    return {
        "deliveries_per_s": service_rate, "bare_sender_per_s": baseline_rate,
        "ratio": service_rate / baseline_rate, "drain_s": drained,
        "cpu_us_per_delivery": service_cpu_us, "bare_cpu_us_per_delivery": baseline_cpu_us,
        "cpu_ratio": baseline_cpu_us / service_cpu_us,
        "latency_p50_ms": percentile(latency_ms, 0.5),
        "latency_p99_ms": percentile(latency_ms, 0.99),
        "request_p50_ms": percentile(request_ms, 0.5),
        "request_p99_ms": percentile(request_ms, 0.99),
    }


def measure_backend(database_url: str, args: argparse.Namespace) -> dict[str, Any]:
    """Start a service on ``database_url`` (empty: SQLite in a temporary folder) and measure."""
    with tempfile.TemporaryDirectory(prefix="flowsvc-bench-webhooks-") as var_dir:
        env = service_env(Path(var_dir), database_url, args.concurrency)
        port = free_port()
        argv = python_module_argv("runtime.cli", "serve", "--bind", f"127.0.0.1:{port}")
        with running_server(argv, base_url=f"http://127.0.0.1:{port}", ready_path="/healthz",
                            env=env, ready_timeout_s=60) as service:
            token = session_cookie(service.base_url)
            full_env = {**os.environ, **env}
            return trio.run(measure, service.base_url, service.process.pid, token, full_env,
                            args)


def summary(name: str, result: dict[str, Any]) -> list[dict[str, object]]:
    """The goals of ``name``'s backend as rows of the ``make bench`` summary: the ratio to the
    bare sender on CPU per delivery (the headline) and on deliveries per second."""
    goals = GOALS[name]
    rows = [goal_row(f"{name}: CPU ratio to the bare sender", result["cpu_ratio"],
                     goals["ratio"]),
            goal_row(f"{name}: deliveries/s ratio to the bare sender", result["ratio"],
                     goals["ratio"])]
    if "deliveries_per_s" in goals:
        rows.append(goal_row(f"{name}: deliveries/s", result["deliveries_per_s"],
                             goals["deliveries_per_s"]))
    rows.append(goal_row(f"{name}: event-to-delivery p99 ms at {LATENCY_RATE:g}/s",
                         result["latency_p99_ms"], LATENCY_P99_GOAL_MS, at_most=True))
    return rows


def report(results: dict[str, dict[str, Any]], args: argparse.Namespace) -> None:
    print(f"== webhooks: {args.events} events, {args.concurrency} concurrent requests to one "
          f"receiver (goals: PostgreSQL >= 600/s, ratio >= 0.8 on both) ==")
    print(f"{'':24}{'deliveries/s':>14}{'bare sender/s':>15}{'ratio':>8}{'CPU us':>8}"
          f"{'bare CPU us':>13}{'CPU ratio':>11}{'drain s':>9}")
    for name, result in results.items():
        print(f"{name:24}{result['deliveries_per_s']:>14.0f}{result['bare_sender_per_s']:>15.0f}"
              f"{result['ratio']:>8.3f}{result['cpu_us_per_delivery']:>8.0f}"
              f"{result['bare_cpu_us_per_delivery']:>13.0f}{result['cpu_ratio']:>11.3f}"
              f"{result['drain_s']:>9.2f}")
    print(f"== webhooks: event-to-delivery latency, {args.rate:g} test pings/s for "
          f"{args.seconds:g} s (goal: p99 < {LATENCY_P99_GOAL_MS:g} ms) ==")
    print(f"{'':24}{'p50 ms':>9}{'p99 ms':>9}{'request p50':>13}{'request p99':>13}")
    for name, result in results.items():
        print(f"{name:24}{result['latency_p50_ms']:>9.1f}{result['latency_p99_ms']:>9.1f}"
              f"{result['request_p50_ms']:>13.1f}{result['request_p99_ms']:>13.1f}")
    for name, result in results.items():
        for row in summary(name, result):
            print(f"{row['figure']}: {row['value']:.3f} (goal {row['goal']}): "
                  f"{'met' if row['met'] else 'NOT met'}")


def main(argv: Sequence[str] | None = None) -> int:
    """Measure webhook throughput and latency, print the report; return the exit status."""
    parser = argparse.ArgumentParser(description="Webhook deliveries per second and latency.")
    parser.add_argument("--events", type=int, default=2000, help="events for the throughput")
    parser.add_argument("--concurrency", type=int, default=16,
                        help="concurrent requests to the receiver (per_host_concurrency)")
    parser.add_argument("--rate", type=float, default=LATENCY_RATE,
                        help="test pings per second")
    parser.add_argument("--seconds", type=float, default=10, help="seconds of test pings")
    parser.add_argument("--postgres-url", default=os.environ.get("FLOWSVC_TEST_POSTGRES_URL", ""),
                        help="PostgreSQL for the second run (default FLOWSVC_TEST_POSTGRES_URL; "
                             "empty: SQLite only)")
    parser.add_argument("--json", default="webhooks.json", help="file under bench/results/")
    parser.add_argument("--bare-sender", nargs=3, metavar=("URL", "COUNT", "CONCURRENCY"),
                        help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.bare_sender:
        url, count, concurrency = args.bare_sender
        trio.run(bare_send, url, int(count), int(concurrency))
        return 0

    results = {"in-process (SQLite)": measure_backend("", args)}
    if args.postgres_url:
        with postgres_schema(args.postgres_url) as url:
            results["PostgreSQL"] = measure_backend(url, args)
    else:
        print("no --postgres-url: SQLite only", file=sys.stderr)
    report(results, args)
    path = write_json(args.json, {
        "command": " ".join(["python -m bench.bench_webhooks",
                             *(sys.argv[1:] if argv is None else argv)]),
        "measured_at": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "cpu_count": os.cpu_count(),
        "load_average": Path("/proc/loadavg").read_text(encoding="ascii").split()[:3],
        "results": results,
        "summary": [row for name, result in results.items() for row in summary(name, result)],
        "median_ratio": statistics.median(result["ratio"] for result in results.values()),
    })
    print(f"results written to {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
