"""``GET /me`` with a session cookie against the bare quart-trio hello-world, in one run.

A real ``flowsvc serve`` process (auth plugin only, hypercorn's Trio worker, one process) and
the hello-world of ``bench.hello_app`` are started side by side; a wallet key made here signs
in over HTTP (SIWE) to get a session cookie; then wrk loads ``GET /me`` with that cookie and
``GET /hello`` with the same header, interleaved (``measure_pair``), and the ratios are printed.
The goal is a CPU-per-request ratio of at least 0.85 (the server's CPU per request against
the hello-world's, from ``/proc``: steady where requests per second swing with the machine's
load): checking a session is CPU work (the JWT) plus a revocation lookup, with no database
round trip per request.

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

import trio

from bench.harness import (
    free_port,
    goal_row,
    hello_server,
    measure_servers,
    python_module_argv,
    report_measured,
    running_server,
    session_cookie,
    write_json,
    wrk_found,
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
        "FLOWSVC_SERVICE_COOKIE_SECURE": "false",  # the session cookie travels over plain HTTP
        "FLOWSVC_DATABASE_URL": args.database_url,
        "FLOWSVC_REDIS_URL": args.redis_url,
        "FLOWSVC_REDIS_PREFIX": f"flowsvc-bench-{os.getpid()}:",
        "FLOWSVC_JWT_SECRET": "bench-jwt-secret-" + "x" * 32,
        "FLOWSVC_INTERNAL_TOKEN": "bench-internal-token-" + "i" * 32,
        "FLOWSVC_PLUGINS_ENABLED": "auth",
        # One user hammering /me must measure the session path, not a rate bucket.
        "FLOWSVC_LIMITS_AUTHENTICATED_RPM": str(10**9),
    }


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
    if not wrk_found():
        return 2

    port = free_port()
    argv_serve = python_module_argv("runtime.cli", "serve", "--bind", f"127.0.0.1:{port}")
    with tempfile.TemporaryDirectory(prefix="flowsvc-bench-session-") as var_dir, \
            hello_server() as hello, \
            running_server(argv_serve, base_url=f"http://127.0.0.1:{port}",
                           ready_path="/healthz", env=service_env(Path(var_dir), args)) as service:
        token = session_cookie(service.base_url)
        knobs = {"rounds": args.rounds, "duration_s": args.duration,
                 "connections": args.connections, "threads": args.threads}
        me = measure_servers(hello, "/hello", service, "/me",
                             headers={"Cookie": f"svc_session={token}"}, **knobs)
        # The floor: flowsvc's request pipeline on a route with no session and no database,
        # so the part of the gap to hello-world that is not the session path shows apart.
        floor = measure_servers(hello, "/hello", service, "/healthz", **knobs) \
            if args.floor else None

    backend = f"{'PostgreSQL' if args.database_url else 'SQLite'}" \
              f" + {'Redis' if args.redis_url else 'in-process state'}"
    report_measured(
        f"GET /me with a session ({backend}, log level {args.log_level}) vs hello-world: "
        f"{args.rounds} rounds of {args.duration} s, {args.connections} connections, "
        f"{args.threads} wrk thread(s), median of each (goal: CPU ratio >= 0.85)",
        me, "hello-world /hello", "flowsvc GET /me")
    if floor is not None:
        report_measured("the floor: GET /healthz without a session vs hello-world "
                        "(goal: CPU ratio >= 0.92)", floor, "hello-world /hello",
                        "flowsvc GET /healthz")
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
        "ratios": me.ratios(),
        "floor": floor,
        "floor_ratios": floor.ratios() if floor else None,
        "session_check_costs_us": costs,
        "summary": [goal_row(f"GET /me CPU ratio ({backend})", me.cpu_ratio, 0.85)] + (
            [goal_row(f"GET /healthz CPU ratio ({backend})", floor.cpu_ratio, 0.92)]
            if floor else []),
    })
    print(f"results written to {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
