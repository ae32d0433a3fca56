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
from pathlib import Path

from bench.bench_keys import _env
from bench.harness import (
    RunningServer,
    WrkMissingError,
    compare,
    free_port,
    goal_row,
    measure_pair,
    new_key,
    postgres_schema,
    print_report,
    python_module_argv,
    require_wrk,
    running_server,
    write_json,
)
from tests.support.haproxy import haproxy
from tests.support.private_servers import private_redis_cluster

GOAL = 1.6
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


def main(argv: Sequence[str] | None = None) -> int:
    """Measure one host and two through HAProxy, print the report; return the exit status."""
    parser = argparse.ArgumentParser(description="Two hosts / one host behind HAProxy.")
    parser.add_argument("--duration", type=int, default=5, help="seconds per wrk run")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds per side")
    parser.add_argument("--connections", type=int, default=32, help="wrk connections")
    parser.add_argument("--postgres-url", default="postgresql://postgres@127.0.0.1:5432/test")
    parser.add_argument("--json", default="hosts.json", help="file under bench/results/")
    args = parser.parse_args(argv)
    try:
        require_wrk()
    except WrkMissingError as error:
        print(error, file=sys.stderr)
        return 2
    prefix = f"flowsvc-bench:{secrets.token_hex(4)}:"
    with tempfile.TemporaryDirectory() as folder, private_redis_cluster() as cluster, \
            postgres_schema(args.postgres_url) as database_url:
        env = {**_env(folder, cluster.url, prefix), "FLOWSVC_DATABASE_URL": database_url,
               "FLOWSVC_LIMITS_ANONYMOUS_RPM": "0"}
        with _host(HOST_ADDRESSES[0], env) as first, \
                _host(HOST_ADDRESSES[1],
                      {**env, "FLOWSVC_DATABASE_MIGRATE_ON_START": "false"}) as second:
            addresses = [server.base_url.removeprefix("http://") for server in (first, second)]
            with _balancer([addresses[0], addresses[0]], Path(folder) / "one.log") as one, \
                    _balancer(addresses, Path(folder) / "two.log") as two:
                raw = new_key(one, 100_000)[0]
                pair = measure_pair(f"{one}/healthz", f"{two}/healthz", args.rounds,
                                    duration_s=args.duration, connections=args.connections,
                                    headers={"x-api-key": raw})
    load = os.getloadavg()
    ratios = compare(pair.baseline, pair.candidate)
    print_report(f"x-api-key GET /healthz through HAProxy, two hosts against one (goal: rps "
                 f"ratio >= {GOAL}): {args.rounds} rounds of {args.duration} s, "
                 f"{args.connections} connections",
                 [("one host", pair.baseline), ("two hosts", pair.candidate)])
    print(f"load average: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    path = write_json(args.json, {
        "command": " ".join(["python -m bench.bench_hosts",
                             *(sys.argv[1:] if argv is None else argv)]),
        "measured_at": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "cpu_count": os.cpu_count(),
        "load_average": load,
        "measured": pair,
        "ratios": ratios,
        "summary": [goal_row("x-api-key /healthz through HAProxy, two hosts / one: rps ratio",
                             ratios["rps_ratio"], GOAL)],
    })
    print(f"results written to {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
