"""Requests per second through HAProxy: two hosts against one, in the same run.

Starts a Redis Cluster of its own on loopback (3 masters with one replica each, as the tests
do), a fresh PostgreSQL schema, two "hosts" (one ``flowsvc serve`` process each, on 127.0.0.2
and 127.0.0.3, each with its own var directory: one process a host on a two-core machine)
and two HAProxy processes running docs/haproxy/flowsvc.cfg unchanged: one in front of both
hosts, one whose two servers are both the first host (the baseline: one process behind the
same balancer). Both serve ``x-api-key GET /healthz`` with the same key, whose cap (100000 per
minute) never refuses, so every request does the whole key path on the cluster. The headline
is requests per second, two hosts over one (goal >= 1.6), measured in interleaved wrk rounds
(``harness.measure_pair``). Also printed: the load average, which on a shared machine says
how much of the second core the second host could have.

The ``sse`` part (on by default) then measures SSE subscribers held by two hosts against one
(goal >= 1.7) with ``bench_sse``'s sweep, through the same two balancers: a paced run of one
project publishes ``--rate`` events a second on whichever host HAProxy gave its request to
(the other host's subscribers get them through the run's Redis tail), and the figure is the
largest K of ``--counts`` whose p99 publish-to-receive latency stays under ``--budget-ms``
(250 ms), one host first, then two; beside it, the hosts' CPU per delivery.

Run ``python -m bench.bench_hosts`` (``--help`` for the knobs); it writes
``bench/results/hosts.json``. Needs wrk, haproxy, redis-server, redis-cli and PostgreSQL.
"""

import argparse
import contextlib
import datetime
import os
import secrets
import sys
import tempfile
from collections.abc import Iterator, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import trio

from bench.bench_keys import _env
from bench.bench_sse import Step, counts_list, flowsvc_steps, largest_within, sse_plugin_env
from bench.harness import (
    RunningServer,
    compare,
    free_port,
    goal_row,
    measure_pair,
    new_key,
    postgres_schema,
    print_report,
    python_module_argv,
    running_server,
    write_json,
    wrk_found,
)
from tests.support.haproxy import haproxy
from tests.support.private_servers import private_redis_cluster

GOAL = 1.6
SSE_GOAL = 1.7
HOST_ADDRESSES = ("127.0.0.2", "127.0.0.3")


@contextlib.contextmanager
def _host(address: str, env: dict[str, str]) -> Iterator[RunningServer]:
    """One host: ``flowsvc serve`` on ``address`` with a var directory of its own."""
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="flowsvc-bench-host-") as var_dir:
        argv = python_module_argv("runtime.cli", "serve", "--bind", f"{address}:{port}")
        with running_server(argv, base_url=f"http://{address}:{port}", ready_path="/healthz",
                            env={**env, "FLOWSVC_SERVICE_VAR_DIR": var_dir},
                            ready_timeout_s=120) as server:
            yield server


@contextlib.contextmanager
def _balancer(backends: list[str], log_path: Path) -> Iterator[str]:
    """HAProxy with the shipped configuration in front of ``backends``; its URL."""
    port = free_port()
    with haproxy(port, backends, log_path):
        yield f"http://127.0.0.1:{port}"


async def _sse_sides(one: str, two: str, hosts: Sequence[RunningServer],
                     args: argparse.Namespace) -> dict[str, list[Step]]:
    """``bench_sse``'s sweep through the one-host balancer (the first host's CPU), then
    through the two-host one (both hosts' CPU)."""
    return {"one host": await flowsvc_steps(one, hosts[:1], args, "one host"),
            "two hosts": await flowsvc_steps(two, hosts, args, "two hosts")}


def _sse_figures(sides: dict[str, list[Step]], budget_ms: float) -> dict[str, Any]:
    """Largest K within the budget per side and its ratio; each side's CPU per delivery at
    the largest K both sides measured (the same load on each, the fixed costs of the run and
    the Redis tail spread the same way), and what it makes of the ratio with a whole core per
    host: two cores' worth of deliveries at the two hosts' cost against one core's at the one
    host's. A loaded machine still gives that one, since CPU per delivery does not depend on
    the wait for a core that decides the latencies."""
    largest = {name: largest_within(steps, budget_ms) for name, steps in sides.items()}
    common = max(set.intersection(*({step.subscribers for step in steps}
                                     for steps in sides.values())))
    cpu = {name: next(step.cpu_us_per_delivery for step in steps if step.subscribers == common)
           for name, steps in sides.items()}
    return {"largest_k_within_budget": largest, "cpu_at_k": common, "cpu_us_per_delivery": cpu,
            "k_ratio": (largest["two hosts"] / largest["one host"]
                        if largest["one host"] else 0.0),
            "cpu_ratio": (2 * cpu["one host"] / cpu["two hosts"]
                          if cpu["two hosts"] else 0.0),
            "steps": sides}


def main(argv: Sequence[str] | None = None) -> int:
    """Measure one host and two through HAProxy, print the report; return the exit status."""
    parser = argparse.ArgumentParser(description="Two hosts / one host behind HAProxy.")
    parser.add_argument("--duration", type=int, default=5, help="seconds per wrk run")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds per side")
    parser.add_argument("--connections", type=int, default=32, help="wrk connections")
    parser.add_argument("--parts", default="rps,sse", type=lambda text: text.split(","),
                        help="rps (requests per second), sse (subscribers held)")
    parser.add_argument("--counts", default="50,100,200,400,700,1000,1500,2000,3000",
                        type=counts_list,
                        help="sse: subscriber counts K to measure, in increasing order")
    parser.add_argument("--seconds", type=float, default=5.0, help="sse: measured s per K")
    parser.add_argument("--rate", type=float, default=20.0, help="sse: events per second")
    parser.add_argument("--budget-ms", type=float, default=250.0, help="sse: p99 budget")
    parser.add_argument("--clients", type=int, default=2, help="sse: subscriber processes")
    parser.add_argument("--postgres-url", default="postgresql://postgres@127.0.0.1:5432/test")
    parser.add_argument("--json", default="hosts.json", help="file under bench/results/")
    args = parser.parse_args(argv)
    if not wrk_found():
        return 2
    prefix = f"flowsvc-bench:{secrets.token_hex(4)}:"
    results: dict[str, Any] = {}
    summary: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as folder, private_redis_cluster() as cluster, \
            postgres_schema(args.postgres_url) as database_url:
        env = {**_env(folder, cluster.url, prefix), "FLOWSVC_DATABASE_URL": database_url,
               **sse_plugin_env("keys")}
        with _host(HOST_ADDRESSES[0], env) as first, \
                _host(HOST_ADDRESSES[1],
                      {**env, "FLOWSVC_DATABASE_MIGRATE_ON_START": "false"}) as second:
            addresses = [server.base_url.removeprefix("http://") for server in (first, second)]
            with _balancer([addresses[0], addresses[0]], Path(folder) / "one.log") as one, \
                    _balancer(addresses, Path(folder) / "two.log") as two:
                if "rps" in args.parts:
                    raw = new_key(one, 100_000)[0]
                    pair = measure_pair(f"{one}/healthz", f"{two}/healthz", args.rounds,
                                        duration_s=args.duration,
                                        connections=args.connections,
                                        headers={"x-api-key": raw})
                    results["measured"] = pair
                    results["ratios"] = compare(pair.baseline, pair.candidate)
                    summary.append(goal_row(
                        "x-api-key /healthz through HAProxy, two hosts / one: rps ratio",
                        results["ratios"]["rps_ratio"], GOAL))
                if "sse" in args.parts:
                    results["sse"] = sse = _sse_figures(
                        trio.run(partial(_sse_sides, one, two, [first, second], args)),
                        args.budget_ms)
                    summary.append(goal_row(
                        f"SSE subscribers through HAProxy, two hosts / one: largest K at p99 < "
                        f"{args.budget_ms:g} ms", sse["k_ratio"], SSE_GOAL))
                    summary.append(goal_row(
                        "SSE through HAProxy, two hosts / one: subscribers a core each would "
                        "hold, from CPU per delivery", sse["cpu_ratio"], SSE_GOAL))
    load = os.getloadavg()
    if "measured" in results:
        print_report(f"x-api-key GET /healthz through HAProxy, two hosts against one (goal: "
                     f"rps ratio >= {GOAL}): {args.rounds} rounds of {args.duration} s, "
                     f"{args.connections} connections",
                     [("one host", results["measured"].baseline),
                      ("two hosts", results["measured"].candidate)])
    if "sse" in results:
        sse = results["sse"]
        print(f"SSE subscribers through HAProxy at {args.rate:g} events/s, largest K with p99 "
              f"under {args.budget_ms:g} ms (of {max(args.counts)} tried): "
              + ", ".join(f"{name} {k}" for name, k in sse["largest_k_within_budget"].items())
              + f"; two hosts / one {sse['k_ratio']:.2f} (goal >= {SSE_GOAL})")
        print(f"hosts' CPU per delivery at K={sse['cpu_at_k']}: "
              + ", ".join(f"{name} {us:.0f} us" for name, us in
                          sse["cpu_us_per_delivery"].items())
              + f"; a core per host would hold two hosts / one {sse['cpu_ratio']:.2f}")
    print(f"load average: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    path = write_json(args.json, {
        "command": " ".join(["python -m bench.bench_hosts",
                             *(sys.argv[1:] if argv is None else argv)]),
        "measured_at": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "cpu_count": os.cpu_count(),
        "load_average": load,
        **results,
        "summary": summary,
    })
    print(f"results written to {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
