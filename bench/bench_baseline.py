"""Hello-world against itself: proves the harness end to end and shows the noise floor.

Two identical hello-world servers are measured as "baseline" and "candidate" with
``measure_pair``. Their ratios should be close to 1.0; how far each round's ratio strays from
1.0 is the noise a real benchmark's ratio has to beat before it means anything.

Run it with ``python -m bench.bench_baseline`` (``--help`` lists the knobs). It prints the
table and writes ``bench/results/baseline.json``.
"""

import argparse
import datetime
import os
import sys
from collections.abc import Sequence

from bench.harness import (
    compare,
    hello_server,
    measure_pair,
    print_report,
    write_json,
    wrk_found,
)


def main(argv: Sequence[str] | None = None) -> int:
    """Measure hello-world against itself, print the report; return the exit status."""
    parser = argparse.ArgumentParser(description="Measure hello-world against itself.")
    parser.add_argument("--duration", type=int, default=5, help="seconds per wrk run")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds per side")
    parser.add_argument("--connections", type=int, default=16, help="wrk connections")
    parser.add_argument("--threads", type=int, default=1, help="wrk threads")
    parser.add_argument("--json", default="baseline.json", help="file under bench/results/")
    args = parser.parse_args(argv)
    if not wrk_found():
        return 2

    with hello_server() as first, hello_server() as second:
        pair = measure_pair(
            first.url("/hello"),
            second.url("/hello"),
            rounds=args.rounds,
            duration_s=args.duration,
            connections=args.connections,
            threads=args.threads,
        )

    print_report(
        f"hello-world vs itself: {args.rounds} rounds of {args.duration} s, "
        f"{args.connections} connections, {args.threads} wrk thread(s), median of each",
        [("hello A (baseline)", pair.baseline), ("hello B (candidate)", pair.candidate)],
    )
    round_ratios = [
        compare(baseline, candidate)
        for baseline, candidate in zip(pair.baseline_runs, pair.candidate_runs, strict=True)
    ]
    rps_ratios = [ratios["rps_ratio"] for ratios in round_ratios]
    p99_ratios = [ratios["p99_ratio"] for ratios in round_ratios]
    print(
        f"noise floor (per-round self-ratios): rps {min(rps_ratios):.3f}..{max(rps_ratios):.3f},"
        f" p99 {min(p99_ratios):.3f}..{max(p99_ratios):.3f}"
    )
    path = write_json(
        args.json,
        {
            "command": " ".join(
                ["python -m bench.bench_baseline", *(sys.argv[1:] if argv is None else argv)]
            ),
            "measured_at": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "cpu_count": os.cpu_count(),
            "pair": pair,
            "ratios": compare(pair.baseline, pair.candidate),
            "round_ratios": round_ratios,
        },
    )
    print(f"results written to {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
