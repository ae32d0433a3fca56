"""What flowsvc's request pipeline costs, counted in instructions: deterministic on a busy machine.

Each scenario of ``bench.asgi_driver`` (hello-world, ``/healthz``, ``/me`` with a session,
an ``x-api-key`` request) runs in process under ``valgrind --tool=callgrind`` with
instrumentation off until the app is warm; the harness turns it on around ``--requests``
requests only (``callgrind_control``), so start-up is not counted, and reads the
instructions of that window. The count does not move with the machine's load (the same
binary, inputs and hash seed give the same count within a fraction of a percent), so a
change of a few percent in the pipeline shows where CPU-time figures of a shared machine
cannot. The headline is the ratio hello-world / scenario: 1.0 means the scenario costs
what the bare framework costs, 0.5 twice as much.

Run it with ``python -m bench.bench_pipeline`` (``--help`` for the knobs). It needs
valgrind (Debian package). It prints a table and writes ``bench/results/pipeline.json``.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from bench.asgi_driver import SCENARIOS
from bench.harness import REPO_ROOT, write_json

_TOTALS = re.compile(r"^summary:\s+(\d+)", re.MULTILINE)


def instructions_per_request(scenario: str, requests: int, warmup: int) -> float:
    """Instructions of ``requests`` requests of ``scenario`` under callgrind, per request."""
    with tempfile.TemporaryDirectory(prefix="flowsvc-callgrind-") as folder:
        out = Path(folder) / "callgrind.out"
        argv = ["valgrind", "--tool=callgrind", "--instr-atstart=no",
                f"--callgrind-out-file={out}", sys.executable, "-m", "bench.asgi_driver",
                scenario, "--requests", str(requests), "--warmup", str(warmup), "--wait"]
        env = {**os.environ, "PYTHONHASHSEED": "0"}
        with subprocess.Popen(argv, cwd=REPO_ROOT, env=env, stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                              text=True) as driver:
            assert driver.stdin is not None and driver.stdout is not None

            def expect(word: str) -> None:
                line = driver.stdout.readline().strip()  # type: ignore[union-attr]
                if line != word:
                    raise RuntimeError(f"{scenario}: the driver said {line!r}, not {word!r}")

            def control(*args: str) -> None:
                subprocess.run(["callgrind_control", *args, str(driver.pid)], check=True,
                               capture_output=True)

            expect("warm")
            control("--instr=on")
            driver.stdin.write("go\n")
            driver.stdin.flush()
            expect("done")
            control("--dump")
            control("--instr=off")
            driver.stdin.write("go\n")
            driver.stdin.flush()
            driver.wait(timeout=600)
        dumps = sorted(out.parent.glob("callgrind.out.*"))
        if not dumps:
            raise RuntimeError(f"{scenario}: callgrind wrote no dump")
        found = _TOTALS.search(dumps[0].read_text())
        if found is None:
            raise RuntimeError(f"{scenario}: no summary in {dumps[0].name}")
        return int(found.group(1)) / requests


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=300, help="counted requests each")
    parser.add_argument("--warmup", type=int, default=200, help="uncounted requests first")
    parser.add_argument("--scenarios", nargs="+", default=list(SCENARIOS),
                        choices=SCENARIOS)
    parser.add_argument("--json", default="pipeline.json", help="file under bench/results/")
    args = parser.parse_args(argv)
    if "hello" not in args.scenarios:
        args.scenarios.insert(0, "hello")
    counts = {scenario: instructions_per_request(scenario, args.requests, args.warmup)
              for scenario in args.scenarios}
    hello = counts["hello"]
    print(f"== instructions per request, in process under callgrind ({args.requests} counted "
          f"after {args.warmup}); ratio = hello-world / scenario ==")
    print(f"{'scenario':<10} {'instructions':>14} {'ratio':>7}")
    for scenario, count in counts.items():
        print(f"{scenario:<10} {count:>14,.0f} {hello / count:>7.3f}")
    write_json(args.json, {"requests": args.requests, "warmup": args.warmup,
                           "instructions_per_request": counts,
                           "ratio_to_hello": {s: hello / c for s, c in counts.items()}})


if __name__ == "__main__":
    main()
