"""``GET /me`` with a session cookie against the bare quart-trio hello-world, in one run.

A real ``flowsvc serve`` process (auth plugin only, hypercorn's Trio worker, one process) and
the hello-world of ``bench.hello_app`` are started side by side; a wallet key made here signs
in over HTTP (SIWE) to get a session cookie; then wrk loads ``GET /me`` with that cookie and
``GET /hello`` with the same header, interleaved (``measure_pair``), and the ratios are printed.
The goal of issue #2 is an rps ratio of at least 0.8: checking a session is CPU work (the JWT)
plus a revocation lookup, with no database round trip per request.

Two more figures come with it: the floor, ``GET /healthz`` without a session against
hello-world (what flowsvc's own request pipeline costs before any session work), and the
CPU cost of each step of a session check measured in process, old design against new
(PyJWT on every request vs the token memo; a revocation actor call vs reading its view).

Run it with ``python -m bench.bench_session`` (``--help`` lists the knobs; ``--database-url``
and ``--redis-url`` run the service on PostgreSQL and Redis instead of SQLite and in-process
state). It prints the table and writes ``bench/results/session.json``.
"""

import argparse
import dataclasses
import datetime
import os
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import httpx
import trio
from eth_account import Account
from eth_account.messages import encode_defunct

from bench.harness import (
    PairResult,
    RunningServer,
    WrkMissingError,
    compare,
    free_port,
    hello_server,
    measure_pair,
    print_report,
    python_module_argv,
    require_wrk,
    run_wrk,
    running_server,
    write_json,
)
from plugins.auth.session_view import SessionView
from plugins.auth.sessions import SessionClaims, TokenVerifier, decode_token, issue_token
from runtime.actors import Request, open_mailbox, serve_mailbox


def service_env(var_dir: Path, args: argparse.Namespace) -> dict[str, str]:
    """The environment of the flowsvc process under test (every setting it depends on)."""
    return {
        "FLOWSVC_SERVICE_VAR_DIR": str(var_dir),
        "FLOWSVC_SERVICE_LOG_LEVEL": args.log_level,
        "FLOWSVC_SERVICE_WORKERS": "1",
        "FLOWSVC_DATABASE_URL": args.database_url,
        "FLOWSVC_REDIS_URL": args.redis_url,
        "FLOWSVC_REDIS_PREFIX": f"flowsvc-bench-{os.getpid()}:",
        "FLOWSVC_JWT_SECRET": "bench-jwt-secret-" + "x" * 32,
        "FLOWSVC_INTERNAL_TOKEN": "bench-internal-token-" + "i" * 32,
        "FLOWSVC_PLUGINS_ENABLED": "auth",
        # One user hammering /me must measure the session path, not a rate bucket.
        "FLOWSVC_LIMITS_AUTHENTICATED_RPM": str(10**9),
    }


def session_cookie(base_url: str) -> str:
    """Sign in with a fresh wallet (SIWE over HTTP) and return the ``svc_session`` token.

    :raises RuntimeError: the service refused the sign-in or set no session cookie.
    """
    wallet = Account.create()
    address = wallet.address.lower()
    with httpx.Client(base_url=base_url, timeout=10) as http:
        issued = http.post("/auth/nonce", json={"address": address})
        issued.raise_for_status()
        message = issued.json()["message"]
        signature = wallet.sign_message(encode_defunct(text=message)).signature.hex()
        verified = http.post("/auth/verify", json={
            "address": address, "message": message,
            "signature": "0x" + signature.removeprefix("0x")})
        verified.raise_for_status()
        token = verified.cookies.get("svc_session")
        if not token:
            raise RuntimeError("POST /auth/verify set no svc_session cookie")
        if http.get("/me", cookies={"svc_session": token}).status_code != 200:
            raise RuntimeError("GET /me refused the fresh session")
        return token


async def _best_us(operation: Callable[[], Awaitable[Any]], count: int = 20_000) -> float:
    """Microseconds per ``operation``: the best of five batches (the least disturbed)."""
    best = float("inf")
    for _ in range(5):
        started = time.perf_counter()
        for _ in range(count // 5):
            await operation()
        best = min(best, (time.perf_counter() - started) / (count // 5) * 1e6)
    return best


async def session_check_costs() -> dict[str, float]:
    """CPU microseconds of each step of a session check, old design against new, in process.

    Old: PyJWT verifies the token on every request and the revocation actor is asked
    through its mailbox. New: verified tokens are remembered, and the actor-owned view is
    read directly.
    """
    secret = "bench-jwt-secret-" + "x" * 32
    now = int(time.time())
    token = issue_token(secret, SessionClaims(1, "ab" * 16, "0x" + "a" * 40, now, now + 86400))
    verifier = TokenVerifier(secret)
    view = SessionView(user_seconds=30)
    view.reset([("cd" * 16, now + 86400.0)])
    address, mailbox = open_mailbox("revocations", 1024)

    @dataclasses.dataclass(frozen=True)
    class IsRevoked(Request[bool]):
        session_id: str

    async def is_revoked(message: IsRevoked) -> bool:
        return view.is_revoked(message.session_id)

    async def pyjwt() -> object:
        return decode_token(secret, token)

    async def memo() -> object:
        return verifier.verify(token)

    async def actor_call() -> object:
        return await address.call(IsRevoked("ab" * 16))

    async def direct() -> object:
        return view.is_revoked("ab" * 16)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(serve_mailbox, mailbox, is_revoked)
        costs = {"pyjwt_decode_us": await _best_us(pyjwt),
                 "token_memo_us": await _best_us(memo),
                 "actor_call_us": await _best_us(actor_call),
                 "view_read_us": await _best_us(direct)}
        nursery.cancel_scope.cancel()
    return costs


def cpu_seconds(pid: int) -> float:
    """User plus system CPU seconds a process (all its threads) has used so far (Linux)."""
    fields = Path(f"/proc/{pid}/stat").read_text(encoding="ascii").rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@dataclasses.dataclass(frozen=True)
class Measured:
    """A ``measure_pair`` result and each side's CPU microseconds per request over its runs.

    CPU per request hardly moves when other work shares the machine, where throughput
    does: ``cpu_ratio`` (baseline CPU / candidate CPU) is the rps ratio the two would show
    each with a core to itself, a steadier reading of the same question.
    """

    pair: PairResult
    baseline_cpu_us: float
    candidate_cpu_us: float

    @property
    def cpu_ratio(self) -> float:
        return self.baseline_cpu_us / self.candidate_cpu_us


def measure(baseline: RunningServer, baseline_path: str, candidate: RunningServer,
            candidate_path: str, args: argparse.Namespace,
            headers: dict[str, str] | None = None) -> Measured:
    """Interleaved wrk runs of both sides (``measure_pair``) with their CPU use around them."""
    urls = (baseline.url(baseline_path), candidate.url(candidate_path))
    for url in urls:  # warm-up outside the CPU accounting
        run_wrk(url, duration_s=1, connections=args.connections, threads=args.threads,
                headers=headers)
    pids = (baseline.process.pid, candidate.process.pid)
    before = [cpu_seconds(pid) for pid in pids]
    pair = measure_pair(*urls, rounds=args.rounds, duration_s=args.duration, warmup_s=0,
                        connections=args.connections, threads=args.threads, headers=headers)
    used = [cpu_seconds(pid) - start for pid, start in zip(pids, before, strict=True)]
    served = [sum(run.rps for run in runs) * args.duration
              for runs in (pair.baseline_runs, pair.candidate_runs)]
    return Measured(pair, used[0] / served[0] * 1e6, used[1] / served[1] * 1e6)


def _report(title: str, measured: Measured, candidate: str) -> dict[str, float]:
    pair = measured.pair
    print_report(title, [("hello-world /hello", pair.baseline), (candidate, pair.candidate)])
    ratios = {**compare(pair.baseline, pair.candidate), "cpu_ratio": measured.cpu_ratio}
    print(f"rps ratio {ratios['rps_ratio']:.3f}, p99 ratio {ratios['p99_ratio']:.3f}; "
          f"CPU per request: hello-world {measured.baseline_cpu_us:.0f} us, "
          f"{candidate} {measured.candidate_cpu_us:.0f} us, CPU ratio {measured.cpu_ratio:.3f}")
    return ratios


def main(argv: Sequence[str] | None = None) -> int:
    """Measure ``GET /me`` against hello-world, print the report; return the exit status."""
    parser = argparse.ArgumentParser(description="GET /me with a session vs hello-world.")
    parser.add_argument("--duration", type=int, default=5, help="seconds per wrk run")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds per side")
    parser.add_argument("--connections", type=int, default=16, help="wrk connections")
    parser.add_argument("--threads", type=int, default=1, help="wrk threads")
    parser.add_argument("--database-url", default="",
                        help="the service's database (default: SQLite in a temporary folder)")
    parser.add_argument("--redis-url", default="",
                        help="the service's Redis (default: in-process shared state)")
    parser.add_argument("--log-level", default="info",
                        choices=["debug", "info", "warning", "error"],
                        help="service log level; info (the default config) writes the access log")
    parser.add_argument("--no-floor", dest="floor", action="store_false",
                        help="skip measuring GET /healthz (no session) against hello-world")
    parser.add_argument("--json", default="session.json", help="file under bench/results/")
    args = parser.parse_args(argv)
    try:
        require_wrk()
    except WrkMissingError as error:
        print(error, file=sys.stderr)
        return 2

    port = free_port()
    argv_serve = python_module_argv("runtime.cli", "serve", "--bind", f"127.0.0.1:{port}")
    with tempfile.TemporaryDirectory(prefix="flowsvc-bench-session-") as var_dir, \
            hello_server() as hello, \
            running_server(argv_serve, base_url=f"http://127.0.0.1:{port}",
                           ready_path="/healthz", env=service_env(Path(var_dir), args)) as service:
        token = session_cookie(service.base_url)
        me = measure(hello, "/hello", service, "/me", args,
                     headers={"Cookie": f"svc_session={token}"})
        # The floor: flowsvc's request pipeline on a route with no session and no database,
        # so the part of the gap to hello-world that is not the session path shows apart.
        floor = measure(hello, "/hello", service, "/healthz", args) if args.floor else None

    backend = f"{'PostgreSQL' if args.database_url else 'SQLite'}" \
              f" + {'Redis' if args.redis_url else 'in-process state'}"
    ratios = _report(
        f"GET /me with a session ({backend}, log level {args.log_level}) vs hello-world: "
        f"{args.rounds} rounds of {args.duration} s, {args.connections} connections, "
        f"{args.threads} wrk thread(s), median of each (goal: rps ratio >= 0.8)",
        me, "flowsvc GET /me")
    floor_ratios = _report("the floor: GET /healthz without a session vs hello-world",
                           floor, "flowsvc GET /healthz") if floor else None
    costs = trio.run(session_check_costs)
    print("session check, CPU per request (in process, best of 5 batches):")
    print(f"  token: PyJWT decode {costs['pyjwt_decode_us']:.1f} us, "
          f"memo hit {costs['token_memo_us']:.2f} us")
    print(f"  revocation: actor call {costs['actor_call_us']:.1f} us, "
          f"direct view read {costs['view_read_us']:.2f} us")
    path = write_json(args.json, {
        "command": " ".join(
            ["python -m bench.bench_session", *(sys.argv[1:] if argv is None else argv)]),
        "measured_at": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "cpu_count": os.cpu_count(),
        "backend": backend,
        "log_level": args.log_level,
        "me": me,
        "ratios": ratios,
        "floor": floor,
        "floor_ratios": floor_ratios,
        "session_check_costs_us": costs,
    })
    print(f"results written to {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
