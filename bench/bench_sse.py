"""SSE fan-out: K subscribers of one project while a run publishes 20 events/s.

For each K, K subscribers follow one stream while events are published at ``--rate`` per
second; each timed event carries the time it was published, and each subscriber records how
long it took to arrive (publish-to-receive latency). The figure of merit is the largest K
whose p99 stays under ``--budget-ms`` (250 ms) with no subscriber cut off and at least 95 %
of the window's events delivered to every subscriber. Beside it, each K records the server's
CPU use during the window (cores busy) and the publisher's real pace.

Servers, each in its own process(es), measured in the same run (``--servers``):

- **baseline**: the bare quart-trio SSE endpoint of ``bench/hello_app.py`` (``GET /sse``,
  one memory channel and one write per event per subscriber), fed by ``POST /publish`` from
  a publisher process of its own;
- **flowsvc**: ``GET /projects/<slug>/stream`` of a real project on one process in memory,
  fed by a real agent run. This module is also a flowsvc plugin (enabled by its module path
  in the benchmarked server): its route starts the run with ``start_run`` and a paced
  backend, whose every turn is one call of its ``bench_tick`` tool carrying the time. Each
  turn therefore publishes ``tool_call`` (timed) and ``tool_result`` through the runner,
  the publisher (committed to SQLite first), the project's broadcaster and the SSE
  response: ``--rate`` events a second in all. A model's HTTP round trip and real tools are
  left out on purpose: they are the run's costs, not the fan-out's. Each K gets a fresh run;
- **redis-1** and **redis-2**: the same on Redis, as ``flowsvc serve --workers 1`` and
  ``--workers 2`` (two processes sharing one listening socket; the run's events reach the
  other process through its Redis tail).

The figures are ratios within the run: flowsvc's largest K over the bare endpoint's, and
two processes' over one's. Subscribers are raw sockets spread over ``--clients`` processes
(one Trio task each) that only look for the timestamps in what they receive, to stay light.
Run it with ``python -m bench.bench_sse`` (``--help`` lists the knobs); it prints a table
and writes ``bench/results/sse.json``.
"""

from __future__ import annotations

import argparse
import atexit
import cProfile
import datetime
import json
import os
import pstats
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from contextlib import ExitStack, asynccontextmanager, contextmanager
from dataclasses import asdict, dataclass, field
from functools import partial
from typing import Any

import httpx
import trio
from eth_account import Account
from eth_account.messages import encode_defunct
from quart import Blueprint, Response
from quart import request as quart_request

from bench.harness import (
    RunningServer,
    cpu_seconds,
    free_port,
    goal_row,
    hello_server,
    process_tree,
    python_module_argv,
    running_server,
    write_json,
)
from plugins.projects.engine.model_backends import ConversationMessage, ModelTurn, ToolCallRequest
from plugins.projects.engine.submit import RunRequest, start_run
from plugins.projects.records.access import find_project
from plugins.projects.records.projects import begin_run
from plugins.projects.settings import ProjectsSettings
from runtime.agents import JsonObject, Tool, ToolContext, ToolResult
from runtime.context import require_internal
from runtime.hookspecs import hookimpl
from runtime.http import json_response
from runtime.service import Service

INTERNAL_TOKEN = "bench-internal-token-" + "i" * 32
PROFILE_VARIABLE = "BENCH_SSE_PROFILE"  # not FLOWSVC_*: the service refuses unknown ones
_STAMP = re.compile(rb'"t":([0-9]+\.[0-9]+)')
_CONNECT_AT_ONCE = 64


@dataclass
class Subscriber:
    """What one subscriber saw: latencies (seconds) of timed events, and whether it was cut
    off or refused."""

    latencies: list[float] = field(default_factory=list)
    cut_off: bool = False


@dataclass(frozen=True)
class Step:
    """The figures of one K."""

    subscribers: int
    p50_ms: float
    p99_ms: float
    samples: int
    expected: int
    cut_off: int
    seconds: float
    server_cpu: float
    """CPU seconds the server's processes used per second of the window (1.0: one core)."""
    timed_per_s: float
    """Timed events published per second of the window (the publisher's real pace)."""

    @property
    def cpu_us_per_delivery(self) -> float:
        """Server CPU per timed event delivered to one subscriber (µs): what one more
        subscriber costs, whatever else loads the machine."""
        return self.server_cpu * 1e6 / (self.samples / self.seconds) if self.samples else 0.0

    @property
    def within(self) -> bool:
        return self.cut_off == 0 and self.samples >= 0.95 * self.expected


async def subscribe(base_url: str, path: str, connecting: trio.CapacityLimiter,
                    ready: trio.Semaphore, since: Callable[[], float], record: Subscriber
                    ) -> None:
    """Follow ``path`` until cancelled, recording the latency of every timed event."""
    host, port = base_url.removeprefix("http://").split(":")
    try:
        async with connecting:
            stream = await trio.open_tcp_stream(host, int(port))
            await stream.send_all(f"GET {path} HTTP/1.1\r\nHost: {host}\r\n"
                                  f"Accept: text/event-stream\r\n\r\n".encode())
            buffer = b""
            while b"\r\n\r\n" not in buffer:
                data = await stream.receive_some(65536)
                if not data:
                    raise trio.BrokenResourceError("closed before the response head")
                buffer += data
    except (OSError, trio.BrokenResourceError) as exc:
        # Refused, reset or closed while connecting (a server whose listen backlog is full
        # resets what it cannot take): not served, a miss for this K rather than a crash.
        print(f"stream not opened: {exc}", file=sys.stderr, flush=True)
        record.cut_off = True
        ready.release()
        return
    async with stream:
        ready.release()
        if not buffer.startswith(b"HTTP/1.1 200"):
            # Refused (a 503 when the broadcaster did not answer in time): not served.
            print(f"stream refused: {buffer[:600]!r}", file=sys.stderr, flush=True)
            record.cut_off = True
            return
        while True:
            try:
                data = await stream.receive_some(262144)
            except trio.BrokenResourceError:
                data = b""
            if not data:
                record.cut_off = True
                return
            received = time.time()
            buffer += data
            end = buffer.rfind(b"\n\n")
            if end < 0:
                continue
            start = since()
            for stamp in _STAMP.findall(buffer, 0, end):
                published = float(stamp)
                if published >= start:
                    record.latencies.append(received - published)
            buffer = buffer[end + 2:]


def percentile(histogram: Counter[int], fraction: float) -> float:
    """The latency (ms) at ``fraction`` of a histogram of latencies in 0.1 ms buckets."""
    rank = int(sum(histogram.values()) * fraction)
    seen = 0
    for bucket in sorted(histogram):
        seen += histogram[bucket]
        if seen > rank:
            return bucket / 10
    return max(histogram, default=0) / 10


async def follow_timed(base_url: str, path: str, count: int) -> None:
    """A subscriber process: ``count`` subscribers of ``path``; says ``ready`` once all are
    connected, reads ``<window start> <seconds>`` and then prints, as one JSON line, the
    latency histogram (0.1 ms buckets) of the events published in that window and how
    many subscribers were cut off."""
    records = [Subscriber() for _ in range(count)]
    ready = trio.Semaphore(0)
    window = {"start": float("inf")}
    connecting = trio.CapacityLimiter(_CONNECT_AT_ONCE)
    stdin = trio.lowlevel.FdStream(os.dup(sys.stdin.fileno()))
    async with trio.open_nursery() as nursery:
        for record in records:
            nursery.start_soon(subscribe, base_url, path, connecting, ready,
                               lambda: window["start"], record)
        for _ in records:
            await ready.acquire()
        print("ready", flush=True)
        line = b""
        while not line.endswith(b"\n"):
            line += await stdin.receive_some(100)
        start, seconds = (float(part) for part in line.split())
        window["start"] = start
        await trio.sleep_until(trio.current_time() + start + seconds - time.time())
        nursery.cancel_scope.cancel()
    histogram = Counter(int(value * 10_000) for record in records
                        for value in record.latencies)
    print(json.dumps({"histogram": histogram, "cut_off": sum(r.cut_off for r in records),
                      "most": max(len(record.latencies) for record in records)}), flush=True)


async def _line(process: trio.Process) -> bytes:
    assert process.stdout is not None
    data = b""
    while not data.endswith(b"\n"):
        piece = await process.stdout.receive_some(1 << 20)
        if not piece:
            raise RuntimeError(f"a subscriber process ended early: {data[-300:]!r}")
        data += piece
    return data


async def measure(base_url: str, servers: Sequence[RunningServer], path: str, count: int,
                  seconds: float, clients: int) -> Step:
    """Open ``count`` subscribers of ``base_url`` (a server, or a balancer in front of
    ``servers``) in ``clients`` processes, then record ``seconds`` of timed events and the
    CPU ``servers`` used meanwhile."""
    shares = [count // clients + (index < count % clients) for index in range(clients)]
    processes = [await trio.lowlevel.open_process(
        [sys.executable, "-m", "bench.bench_sse", "subscribers", base_url, path, str(share)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE) for share in shares if share]
    try:
        # Connecting takes about a millisecond a subscriber on a quiet machine: ten times that
        # and half a minute is wide, and a server that cannot take them misses the K sooner.
        with trio.fail_after(30 + count / 100):
            for process in processes:
                await _line(process)
        await trio.sleep(1.0)  # let every subscriber settle before the window opens
        pids = process_tree([server.process.pid for server in servers])
        cpu_before = sum(cpu_seconds(pid) for pid in pids)
        window = f"{time.time()} {seconds}\n".encode()
        for process in processes:
            assert process.stdin is not None
            await process.stdin.send_all(window)
        histogram: Counter[int] = Counter()
        cut_off = most = 0
        with trio.fail_after(seconds + 120):
            for process in processes:
                answer = json.loads(await _line(process))
                histogram.update({int(bucket): n for bucket, n in answer["histogram"].items()})
                cut_off += answer["cut_off"]
                most = max(most, answer["most"])
        server_cpu = (sum(cpu_seconds(pid) for pid in pids) - cpu_before) / seconds
    except trio.TooSlowError:
        # A server that cannot take this many subscribers (or answer them) misses this K; the
        # sweep goes on to its end rather than the whole run failing.
        print(f"K={count}: the subscribers did not connect or report in time", flush=True)
        return Step(count, float("inf"), float("inf"), 0, 1, 0, seconds, 0.0, 0.0)
    finally:
        for process in processes:
            process.kill()
            await process.wait()
    samples = sum(histogram.values())
    if not samples:
        return Step(count, float("inf"), float("inf"), 0, 1, cut_off, seconds, server_cpu, 0.0)
    # Every subscriber should have every event of the window: as many as the one with most
    # (the publisher's own pace is not the fan-out's to answer for).
    return Step(count, percentile(histogram, 0.5), percentile(histogram, 0.99), samples,
                count * most, cut_off, seconds, server_cpu, most / seconds)


async def sweep(name: str, counts: Sequence[int], budget_ms: float,
                run_step: Callable[[int], Any]) -> list[Step]:
    """Measure each K in turn until two in a row miss the budget."""
    steps: list[Step] = []
    misses = 0
    for count in counts:
        step: Step = await run_step(count)
        steps.append(step)
        print(f"{name:>8} K={count:5d}  p50 {step.p50_ms:8.1f} ms  p99 {step.p99_ms:8.1f} ms  "
              f"samples {step.samples}/{step.expected}  cut off {step.cut_off}  "
              f"timed/s {step.timed_per_s:.1f}  server CPU {step.server_cpu:.2f}  "
              f"CPU/delivery {step.cpu_us_per_delivery:.0f} us", flush=True)
        misses = 0 if step.within and step.p99_ms < budget_ms else misses + 1
        if misses == 2:
            break
    return steps


# ------------------------------------------------------------------ the baseline

async def baseline_steps(server: RunningServer, args: argparse.Namespace) -> list[Step]:
    async def publish(count: int) -> Step:
        async with helper_process("publish", server.url("/publish"), str(args.rate)):
            return await measure(server.base_url, [server], "/sse", count, args.seconds,
                                 args.clients)

    return await sweep("baseline", args.baseline_counts or args.counts, args.budget_ms,
                       publish)


async def publish_forever(url: str, rate: float) -> None:
    """POST the time to ``url`` ``rate`` times a second (the baseline's publisher)."""
    async with httpx.AsyncClient() as http:
        due = trio.current_time()
        while True:
            await http.post(url, content=json.dumps({"t": time.time()}, separators=(",", ":")))
            due += 1 / rate
            await trio.sleep_until(due)


@asynccontextmanager
async def helper_process(*arguments: str) -> AsyncIterator[trio.Process]:
    """This module in another process (the baseline's publisher), so that publishing never
    competes for the CPU with the subscribers it is measured by."""
    process = await trio.lowlevel.open_process(
        [sys.executable, "-m", "bench.bench_sse", *arguments], stdout=subprocess.PIPE)
    try:
        assert process.stdout is not None
        await process.stdout.receive_some(100)  # its ready line
        yield process
    finally:
        process.terminate()
        await process.wait()


# ------------------------------------------------------------------ flowsvc

class PacedBackend:
    """A model backend that makes one ``bench_tick`` call per turn, on a fixed schedule."""

    def __init__(self, turns_per_second: float) -> None:
        self.interval = 1 / turns_per_second
        self.due: float | None = None

    def planned_steps(self) -> list[str]:
        return ["Publish paced events"]

    async def next_turn(self, conversation: Sequence[ConversationMessage],
                        tools: Sequence[Tool]) -> ModelTurn:
        self.due = trio.current_time() if self.due is None else self.due + self.interval
        await trio.sleep_until(self.due)
        return ModelTurn("", [ToolCallRequest("tick", "bench_tick",
                                              json.dumps({"t": time.time()}))])


async def _tick(context: ToolContext, args: JsonObject) -> ToolResult:
    return ToolResult(result={"ok": True})


@hookimpl
def flowsvc_agent_tools(service: Service) -> list[Tool]:
    return [Tool("bench_tick", "Returns at once (the SSE benchmark's publisher).",
                 {"type": "object"}, _tick)]


@hookimpl
def flowsvc_blueprints(service: Service) -> list[Blueprint]:
    profile_path = os.environ.get(PROFILE_VARIABLE)
    if profile_path:
        # ``--profile``: cProfile over the server's Trio thread from here on, written when
        # the server exits (it slows everything about twice; the shares are what count).
        profiler = cProfile.Profile()
        profiler.enable()
        atexit.register(profiler.dump_stats, profile_path)
    blueprint = Blueprint("bench_sse", __name__)

    @blueprint.post("/bench-sse/<slug>/run")
    async def paced_run(slug: str) -> Response:
        """Start a paced run of the project (``?turns=<per second>``); internal only."""
        require_internal()
        project = await find_project(service, slug)
        template = service.templates[project.agent_template]
        settings = service.plugin_settings("projects", ProjectsSettings)
        request = RunRequest(
            owner_id=project.owner_id, template=template, brief=project.brief,
            workspace=settings.workspaces(service.settings.service.var_dir) / str(project.id),
            stream=project.stream, project_id=project.id,
            backend=PacedBackend(float(quart_request.args.get("turns", "10"))))
        run_id = await start_run(service, request, prepare=lambda connection, run_id:
                                 begin_run(connection, project.id, run_id))
        return json_response({"runId": run_id}, 201)

    return [blueprint]


async def signed_in(http: httpx.AsyncClient) -> str:
    """Sign in with a fresh wallet (SIWE); the client keeps the cookie. Returns the address."""
    wallet = Account.create()
    address: str = wallet.address.lower()
    message = (await http.post("/auth/nonce", json={"address": address})).json()["message"]
    signature = "0x" + wallet.sign_message(encode_defunct(text=message)).signature.hex() \
        .removeprefix("0x")
    verified = await http.post("/auth/verify", json={"address": address, "message": message,
                                                     "signature": signature})
    verified.raise_for_status()
    return address


async def flowsvc_steps(base_url: str, servers: Sequence[RunningServer],
                        args: argparse.Namespace, name: str,
                        counts: Sequence[int] | None = None) -> list[Step]:
    """Sweep K (``counts``, else ``args.counts``; ``args.seconds``, ``args.rate``, ``args.clients``,
    ``args.budget_ms``) over a paced run of a new project of ``base_url``: a flowsvc server
    with :func:`sse_plugin_env`, or a balancer in front of ``servers``."""
    # The operator's client carries no session: a session cookie would win over the
    # internal token.
    internal = {"Authorization": f"Bearer {INTERNAL_TOKEN}"}
    async with httpx.AsyncClient(base_url=base_url, timeout=30) as http, \
            httpx.AsyncClient(base_url=base_url, timeout=30,
                              headers=internal) as operator:
        owner = await signed_in(http)
        (await operator.put("/internal/tokens/bench", json={
            "ownerAddress": owner, "template": "dpnm", "chainId": 56,
            "instance": "0x" + "be" * 20})).raise_for_status()
        created = await http.post("/projects", json={
            "tokenSlug": "bench", "title": "Fan-out", "agentTemplate": "fullstack-builder",
            "brief": "Publish events for the fan-out benchmark."})
        slug = created.json()["slug"]

        async def one_run(count: int) -> Step:
            # A fresh run per K; readers without Last-Event-ID get it from its start, before
            # the measured window opens.
            started = await operator.post(f"/bench-sse/{slug}/run",
                                          params={"turns": str(args.rate / 2)})
            started.raise_for_status()
            step = await measure(base_url, servers, f"/projects/{slug}/stream", count,
                                 args.seconds, args.clients)
            await http.post(f"/projects/{slug}/cancel")
            return step

        return await sweep(name, counts or args.counts, args.budget_ms, one_run)


@asynccontextmanager
async def flowsvc_bench_server(*, redis_url: str | None = None, workers: int = 1,
                               profile: str | None = None) -> AsyncIterator[RunningServer]:
    """flowsvc with the auth, chain and projects plugins and this module as a plugin; with
    ``redis_url``, ``workers`` processes behind one port sharing that Redis."""
    shared = {} if redis_url is None else {
        "FLOWSVC_REDIS_URL": redis_url, "FLOWSVC_SERVICE_WORKERS": str(workers),
        "FLOWSVC_REDIS_PREFIX": f"bench-sse-{os.getpid()}-{workers}:"}
    env = {**shared, **({PROFILE_VARIABLE: profile} if profile else {}), **sse_plugin_env()}
    with ExitStack() as stack:
        server = await trio.to_thread.run_sync(stack.enter_context, _serve(env))
        try:
            yield server
        finally:
            await trio.to_thread.run_sync(stack.close)


def sse_plugin_env(*plugins: str) -> dict[str, str]:
    """The settings of a server ``flowsvc_steps`` can measure: the auth, chain and projects
    plugins, ``plugins`` and this module enabled, no rate limits, room for every subscriber."""
    enabled = ["auth", "chain", "projects", *plugins, "bench.bench_sse"]
    return {
        "FLOWSVC_PLUGINS_ENABLED": json.dumps(list(dict.fromkeys(enabled))),
        "FLOWSVC_INTERNAL_TOKEN": INTERNAL_TOKEN,
        "FLOWSVC_JWT_SECRET": "bench-jwt-secret-" + "j" * 32,
        "FLOWSVC_LIMITS_ANONYMOUS_RPM": "0", "FLOWSVC_LIMITS_AUTHENTICATED_RPM": "0",
        "FLOWSVC_LIMITS_INTERNAL_RPM": "0", "FLOWSVC_PLUGINS_PROJECTS_MAX_TURNS": "100000",
        "FLOWSVC_PLUGINS_PROJECTS_SUBSCRIBER_MAX_LAG": "1000",
        # Every subscriber connects from this one address.
        "FLOWSVC_PLUGINS_PROJECTS_STREAMS_PER_CLIENT": "100000",
    }


@contextmanager
def _serve(env: dict[str, str]) -> Iterator[RunningServer]:
    """``flowsvc serve`` on a free port with a var dir of its own; up to 90 s to answer (a
    loaded machine, and two workers start after the migrations)."""
    with tempfile.TemporaryDirectory(prefix="flowsvc-bench-sse-") as var_dir:
        port = free_port()
        argv = python_module_argv("runtime.cli", "--config", os.devnull, "serve",
                                  "--bind", f"127.0.0.1:{port}")
        with running_server(argv, base_url=f"http://127.0.0.1:{port}", ready_path="/healthz",
                            env={"FLOWSVC_SERVICE_VAR_DIR": var_dir,
                                 "FLOWSVC_SERVICE_LOG_LEVEL": "warning",
                                 "FLOWSVC_SERVICE_COOKIE_SECURE": "false", **env},
                            ready_timeout_s=90) as server:
            yield server


async def run(args: argparse.Namespace) -> dict[str, list[Step]]:
    results: dict[str, list[Step]] = {}
    if "baseline" in args.servers:
        with ExitStack() as stack:
            baseline = await trio.to_thread.run_sync(stack.enter_context, hello_server())
            results["baseline"] = await baseline_steps(baseline, args)
    if "flowsvc" in args.servers:
        async with flowsvc_bench_server(profile=args.profile) as server:
            results["flowsvc"] = await flowsvc_steps(server.base_url, [server], args,
                                                     "flowsvc")
    for workers in (1, 2):
        name = f"redis-{workers}"
        if name in args.servers:
            async with flowsvc_bench_server(redis_url=args.redis_url,
                                            workers=workers) as server:
                results[name] = await flowsvc_steps(server.base_url, [server], args, name,
                                                    args.redis_counts)
    return results


def ratios(largest: dict[str, int]) -> dict[str, float]:
    """flowsvc's largest K against the bare endpoint's, two processes' against one's."""
    pairs = {"flowsvc_vs_baseline": ("flowsvc", "baseline"),
             "two_vs_one_process": ("redis-2", "redis-1")}
    return {name: largest[top] / largest[bottom] for name, (top, bottom) in pairs.items()
            if largest.get(top) is not None and largest.get(bottom)}


def largest_within(steps: list[Step], budget_ms: float) -> int:
    return max((s.subscribers for s in steps if s.within and s.p99_ms < budget_ms), default=0)


# Issue 21: readers one process holds within the budget, and what two processes on Redis hold.
READERS_GOAL = 5000
TWO_PROCESS_GOAL = 1.8


def goal_rows(largest: dict[str, int], args: argparse.Namespace) -> list[dict[str, object]]:
    """The goals measured by this run, as rows of ``make bench``'s summary table."""
    rows = []
    if "flowsvc" in largest:
        rows.append(goal_row(f"SSE readers within p99 {args.budget_ms:g} ms at "
                             f"{args.rate:g} events/s, one process", largest["flowsvc"],
                             READERS_GOAL))
    two = ratios(largest).get("two_vs_one_process")
    if two is not None:
        rows.append(goal_row("SSE readers, two processes on Redis / one", round(two, 2),
                             TWO_PROCESS_GOAL))
    return rows


def counts_list(text: str) -> list[int]:
    """Subscriber counts K, comma-separated."""
    return [int(part) for part in text.split(",")]


def main(argv: Sequence[str] | None = None) -> int:
    arguments = list(sys.argv[1:] if argv is None else argv)
    if arguments[:1] == ["publish"]:
        print("ready", flush=True)
        trio.run(publish_forever, arguments[1], float(arguments[2]))
        return 0
    if arguments[:1] == ["subscribers"]:
        trio.run(follow_timed, arguments[1], arguments[2], int(arguments[3]))
        return 0
    parser = argparse.ArgumentParser(description="SSE fan-out: flowsvc against a bare endpoint.")
    parser.add_argument("--counts",
                        default="100,300,600,1000,1500,2000,2500,3000,4000,5000,6000,8000",
                        type=counts_list,
                        help="subscriber counts K to measure, in increasing order")
    parser.add_argument("--baseline-counts", type=counts_list,
                        help="the bare endpoint's counts K (default: --counts)")
    parser.add_argument("--redis-counts", type=counts_list,
                        help="the counts K of redis-1 and redis-2 (default: --counts)")
    parser.add_argument("--seconds", type=float, default=5.0, help="measured seconds per K")
    parser.add_argument("--rate", type=float, default=20.0, help="events published per second")
    parser.add_argument("--budget-ms", type=float, default=250.0, help="p99 budget")
    parser.add_argument("--clients", type=int, default=2,
                        help="subscriber processes the K subscribers are spread over")
    parser.add_argument("--servers", default="baseline,flowsvc",
                        type=lambda text: text.split(","),
                        help="which servers to measure: baseline (the bare endpoint), flowsvc "
                             "(one process, in memory), redis-1 and redis-2 (one and two "
                             "processes behind one port on Redis)")
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/0",
                        help="the Redis of redis-1 and redis-2")
    parser.add_argument("--json", default="sse.json", help="file under bench/results/")
    parser.add_argument("--profile", metavar="PATH",
                        help="profile the flowsvc server (one process) with cProfile, write the "
                             "stats to PATH and print their top entries")
    args = parser.parse_args(arguments)
    load_before = os.getloadavg()[0]
    results = trio.run(partial(run, args))
    summary = {name: largest_within(steps, args.budget_ms) for name, steps in results.items()}
    print(f"largest K with p99 under {args.budget_ms:g} ms: "
          + ", ".join(f"{name} {count}" for name, count in summary.items()))
    cpu = {name: statistics.median(step.cpu_us_per_delivery for step in steps if step.samples)
           for name, steps in results.items() if any(step.samples for step in steps)}
    print("ratios: " + ", ".join(f"{name} {value:.2f}"
                                 for name, value in ratios(summary).items()))
    print("server CPU per delivery (median over K): "
          + ", ".join(f"{name} {value:.0f} us" for name, value in cpu.items()))
    path = write_json(args.json, {
        "command": " ".join(["python -m bench.bench_sse", *arguments]),
        "measured_at": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "cpu_count": os.cpu_count(), "rate": args.rate, "seconds": args.seconds,
        "clients": args.clients,
        "load_average": [load_before, os.getloadavg()[0]],
        "budget_ms": args.budget_ms, "largest_k_within_budget": summary,
        "ratios": ratios(summary),
        "cpu_us_per_delivery": cpu,
        "summary": goal_rows(summary, args),
        "steps": {name: [{**asdict(step), "cpu_us_per_delivery": step.cpu_us_per_delivery}
                         for step in steps] for name, steps in results.items()},
    })
    print(f"results written to {path}")
    if args.profile:
        pstats.Stats(args.profile).sort_stats("tottime").print_stats(25)
    return 0


if __name__ == "__main__":
    sys.exit(main())
