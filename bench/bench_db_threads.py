"""How many database threads: the thread limiter of runtime.storage at 4 against trio's 40.

Each request of ``GET /readyz`` makes one database round trip (``SELECT 1``) through
``Database.read``, i.e. SQLAlchemy in a worker thread. Two flowsvc servers, identical but
for ``service.db_threads``, are measured side by side (interleaved rounds), on SQLite and on
PostgreSQL, with the hello-world as the common baseline.

Run: ``python -m bench.bench_db_threads`` (PostgreSQL from ``FLOWSVC_BENCH_POSTGRES_URL``,
default the local test server).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from bench.harness import (
    compare,
    flowsvc_server,
    hello_server,
    measure_pair,
    print_report,
    write_json,
    wrk_found,
)

POSTGRES_URL = os.environ.get("FLOWSVC_BENCH_POSTGRES_URL",
                              "postgresql://postgres@127.0.0.1:5432/test")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--duration", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--connections", type=int, default=16)
    args = parser.parse_args(argv)
    if not wrk_found():
        return 2
    results: dict[str, object] = {}
    secrets = {"FLOWSVC_JWT_SECRET": "bench-jwt-secret-" + "j" * 32,
               "FLOWSVC_INTERNAL_TOKEN": "bench-internal-token-" + "i" * 32}
    for name, url in (("sqlite", ""), ("postgres", POSTGRES_URL)):
        env = {"FLOWSVC_DATABASE_URL": url, **(secrets if url else {})}
        with flowsvc_server({**env, "FLOWSVC_SERVICE_DB_THREADS": "40"}) as wide, \
                flowsvc_server({**env, "FLOWSVC_SERVICE_DB_THREADS": "4"}) as narrow, \
                hello_server() as hello:
            threads = measure_pair(wide.url("/readyz"), narrow.url("/readyz"),
                                   rounds=args.rounds, duration_s=args.duration,
                                   connections=args.connections)
            against_hello = measure_pair(hello.url("/hello"), narrow.url("/readyz"),
                                         rounds=1, duration_s=args.duration,
                                         connections=args.connections)
        print_report(f"{name}: GET /readyz (one DB round trip), 40 threads vs 4",
                     [("40 threads (baseline)", threads.baseline),
                      ("4 threads", threads.candidate)])
        print_report(f"{name}: 4 threads against the hello-world",
                     [("hello-world (baseline)", against_hello.baseline),
                      ("4 threads", against_hello.candidate)])
        results[name] = {"threads40": threads.baseline, "threads4": threads.candidate,
                         "ratio_4_over_40": compare(threads.baseline, threads.candidate),
                         "ratio_4_over_hello": compare(against_hello.baseline,
                                                       against_hello.candidate)}
    write_json("db_threads.json", results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
