"""The API-key path on a Redis Cluster against one Redis, in the same run.

Starts a Redis Cluster of its own on loopback (3 masters with one replica each, as the tests
do) and two ``flowsvc serve`` processes on one SQLite database: one on the single Redis of
``--redis-url`` (the baseline), one on the cluster. Both serve ``x-api-key GET /healthz``
with the same key, whose cap (100000 per minute) and owner's bucket never refuse, so every
request does the whole key path: the meter's script call and the usage log. The headline is
CPU per request, one Redis's against the cluster's (``harness.Measured``); goal >= 0.9.
Measured twice: with one key (one owner: one hash slot, one script call per batch on both)
and with the keys of ``--owners`` users in turn (on the cluster a batch is cut into one call
per owner's slot; on one Redis it stays one call). Also printed: the load average.

Run ``python -m bench.bench_cluster`` (``--help`` for the knobs); it writes
``bench/results/cluster.json``. Needs wrk, redis-server and redis-cli.
"""

import argparse
import contextlib
import datetime
import os
import secrets
import sys
import tempfile
from collections.abc import Iterator, Sequence

from bench.bench_keys import _env, _forget_redis_keys
from bench.harness import (
    Measured,
    RunningServer,
    free_port,
    goal_row,
    measure_servers,
    new_key,
    python_module_argv,
    report_measured,
    running_server,
    write_json,
    wrk_found,
)
from tests.support.private_servers import private_redis_cluster

GOAL = 0.9


@contextlib.contextmanager
def _flowsvc(env: dict[str, str]) -> Iterator[RunningServer]:
    port = free_port()
    argv = python_module_argv("runtime.cli", "serve", "--bind", f"127.0.0.1:{port}")
    with running_server(argv, base_url=f"http://127.0.0.1:{port}", ready_path="/healthz",
                        env=env, ready_timeout_s=90) as server:
        yield server


def _keys_in_turn(raws: list[str]) -> str:
    """A wrk script sending the keys of ``raws`` in turn (each connection's thread cycles)."""
    listed = ", ".join(f'"{raw}"' for raw in raws)
    return (f"local keys = {{{listed}}}\nlocal n = 0\n"
            "request = function()\n  n = n + 1\n"
            "  return wrk.format(nil, nil, {['x-api-key'] = keys[n % #keys + 1]})\nend\n")


def main(argv: Sequence[str] | None = None) -> int:
    """Measure the key path on both Redis kinds, print the report; return the exit status."""
    parser = argparse.ArgumentParser(description="The API-key path: Redis Cluster / one Redis.")
    parser.add_argument("--duration", type=int, default=3, help="seconds per wrk run")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds per side")
    parser.add_argument("--connections", type=int, default=16, help="wrk connections")
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/0")
    parser.add_argument("--owners", type=int, default=16, help="users of the many-owner run")
    parser.add_argument("--json", default="cluster.json", help="file under bench/results/")
    args = parser.parse_args(argv)
    if not wrk_found():
        return 2
    prefix = f"flowsvc-bench:{secrets.token_hex(4)}:"
    with tempfile.TemporaryDirectory() as var_dir, private_redis_cluster() as cluster:
        # Many owners sign in from one address: no anonymous cap.
        single_env = {**_env(var_dir, args.redis_url, prefix), "FLOWSVC_LIMITS_ANONYMOUS_RPM": "0"}
        cluster_env = {**single_env, "FLOWSVC_REDIS_URL": cluster.url,
                       "FLOWSVC_DATABASE_MIGRATE_ON_START": "false"}
        knobs = {"rounds": args.rounds, "duration_s": args.duration,
                 "connections": args.connections}
        measured: dict[str, Measured] = {}
        with _flowsvc(single_env) as single, _flowsvc(cluster_env) as clustered:
            raw = new_key(single.base_url, 100_000)[0]
            measured["one owner"] = measure_servers(single, "/healthz", clustered, "/healthz",
                                                    headers={"x-api-key": raw}, **knobs)
            raws = [new_key(single.base_url, 100_000)[0] for _ in range(args.owners)]
            measured[f"{args.owners} owners"] = measure_servers(
                single, "/healthz", clustered, "/healthz", lua_script=_keys_in_turn(raws),
                **knobs)
    load = os.getloadavg()
    for name, result in measured.items():
        report_measured(f"x-api-key GET /healthz, {name}, Redis Cluster against one Redis "
                        f"(goal: CPU ratio >= {GOAL}): {args.rounds} rounds of "
                        f"{args.duration} s, {args.connections} connections", result,
                        "one Redis", "Redis Cluster")
    print(f"load average: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    path = write_json(args.json, {
        "command": " ".join(["python -m bench.bench_cluster",
                             *(sys.argv[1:] if argv is None else argv)]),
        "measured_at": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "cpu_count": os.cpu_count(),
        "load_average": load,
        "measured": measured,
        "ratios": {name: result.ratios() for name, result in measured.items()},
        "summary": [goal_row(f"x-api-key /healthz, {name}, Redis Cluster / one Redis: CPU ratio",
                             result.cpu_ratio, GOAL) for name, result in measured.items()],
    })
    _forget_redis_keys(args.redis_url, prefix)
    print(f"results written to {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
