"""Run every benchmark module ``bench/bench_*.py`` in turn (``make bench``)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def main() -> int:
    failed = []
    for path in sorted(Path(__file__).parent.glob("bench_*.py")):
        module = f"bench.{path.stem}"
        print(f"\n=== {module}", flush=True)
        if subprocess.call([sys.executable, "-m", module]) != 0:
            failed.append(module)
    if failed:
        print(f"\nfailed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
