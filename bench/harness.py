"""Reusable machinery of the benchmarks: servers in subprocesses, wrk runs, ratios, reports.

These machines are shared and noisy, so a benchmark never states an absolute target: it
measures a candidate and a baseline in the same run, interleaved (``measure_pair``), and reports
their ratios. The load generator is wrk (Debian package ``wrk``).
"""

import contextlib
import dataclasses
import functools
import http.client
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.parse
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import httpx
from eth_account import Account
from eth_account.messages import encode_defunct

REPO_ROOT = Path(__file__).resolve().parent.parent
RESULTS_DIR = REPO_ROOT / "bench" / "results"
WRK_INSTALL_HINT = "wrk is not installed: run `apt-get update && apt-get install -y wrk`"

# wrk loads a single script, so ours (which reports the figures as JSON) is appended to the
# caller's. The marker lets the JSON line be found among whatever else the scripts print.
_RESULT_MARKER = "WRK_RESULT_JSON "
_REPORTER_LUA = """
function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    '\\n%s{"requests": %d, "duration_us": %d, "p50_us": %.3f, "p99_us": %.3f, '
    .. '"connect": %d, "read": %d, "write": %d, "timeout": %d, "status": %d}\\n',
    "MARKER", summary.requests, summary.duration,
    latency:percentile(50), latency:percentile(99),
    e.connect, e.read, e.write, e.timeout, e.status))
end
""".replace("MARKER", _RESULT_MARKER)


class ServerStartError(RuntimeError):
    """Raised when a server subprocess exits or does not answer before its start timeout."""


class WrkMissingError(RuntimeError):
    """Raised when the wrk binary is not on PATH; the message says how to install it."""


class WrkError(RuntimeError):
    """Raised when wrk fails or prints no figures; the message carries wrk's output."""


@dataclasses.dataclass(frozen=True)
class WrkResult:
    """The figures of one wrk run.

    ``errors`` counts socket errors (connect, read, write, timeout); ``non_2xx`` counts
    responses with a status of 400 or more (wrk's "Non-2xx or 3xx responses" counter).
    """

    rps: float
    p50_ms: float
    p99_ms: float
    errors: int
    non_2xx: int


@dataclasses.dataclass(frozen=True)
class PairResult:
    """Medians of interleaved runs of a baseline and a candidate, with every run kept."""

    baseline: WrkResult
    candidate: WrkResult
    baseline_runs: list[WrkResult]
    candidate_runs: list[WrkResult]


@dataclasses.dataclass(frozen=True)
class RunningServer:
    """A server subprocess that answered its readiness probe, and where it listens."""

    base_url: str
    process: "subprocess.Popen[bytes]"

    def url(self, path: str) -> str:
        """The absolute URL of ``path`` on this server."""
        return self.base_url.rstrip("/") + path


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _tail(log_path: Path, lines: int = 40) -> str:
    text = log_path.read_text(encoding="utf-8", errors="replace")
    return "\n".join(text.splitlines()[-lines:]) or "(no output)"


def _get_status(base_url: str, path: str) -> int:
    parts = urllib.parse.urlsplit(base_url)
    connection = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port, timeout=2)
    try:
        connection.request("GET", path)
        return connection.getresponse().status
    finally:
        connection.close()


def _stop(process: "subprocess.Popen[bytes]", grace_s: float) -> None:
    if process.poll() is not None:
        return
    process.terminate()
    try:
        process.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


@contextlib.contextmanager
def running_server(
    argv: Sequence[str],
    *,
    base_url: str,
    ready_path: str = "/",
    env: Mapping[str, str] | None = None,
    cwd: Path = REPO_ROOT,
    ready_timeout_s: float = 20.0,
    stop_grace_s: float = 5.0,
) -> Iterator[RunningServer]:
    """Run ``argv`` as a server until the block ends.

    It waits until ``GET ready_path`` on ``base_url`` answers with a 2xx status. On leaving
    the block the server gets SIGTERM, then SIGKILL if it is still running after
    ``stop_grace_s``. ``env`` is laid over the current environment. The server's stdout and
    stderr go to a temporary log that this context owns and deletes.

    :raises ServerStartError: the server exited, or did not answer within ``ready_timeout_s``;
        the message ends with the tail of its output.
    """
    with tempfile.TemporaryDirectory(prefix="flowsvc-bench-") as log_dir:
        log_path = Path(log_dir) / "server.log"
        with log_path.open("wb") as log:
            process = subprocess.Popen(
                list(argv),
                cwd=cwd,
                env={**os.environ, **(env or {})},
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        try:
            _wait_ready(process, base_url, ready_path, ready_timeout_s, log_path)
            yield RunningServer(base_url=base_url, process=process)
        finally:
            _stop(process, stop_grace_s)


def _wait_ready(
    process: "subprocess.Popen[bytes]",
    base_url: str,
    ready_path: str,
    timeout_s: float,
    log_path: Path,
) -> None:
    deadline = time.monotonic() + timeout_s
    last_answer = "no answer"
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise ServerStartError(
                f"server {process.args!r} exited with code {process.returncode} before "
                f"answering GET {ready_path}; its output ends with:\n{_tail(log_path)}"
            )
        try:
            status = _get_status(base_url, ready_path)
        except (OSError, http.client.HTTPException) as error:
            last_answer = repr(error)
        else:
            if 200 <= status < 300:
                return
            last_answer = f"status {status}"
        time.sleep(0.05)
    raise ServerStartError(
        f"server {process.args!r} did not answer GET {base_url}{ready_path} with a 2xx within "
        f"{timeout_s} s (last: {last_answer}); its output ends with:\n{_tail(log_path)}"
    )


def python_module_argv(module: str, *args: str) -> list[str]:
    """The argv that runs ``python -m module args...`` with this interpreter."""
    return [sys.executable, "-m", module, *args]


@contextlib.contextmanager
def hello_server(env: Mapping[str, str] | None = None) -> Iterator[RunningServer]:
    """Run the hello-world baseline (``bench.hello_app``) on a free port; see ``running_server``.

    :raises ServerStartError: as ``running_server``.
    """
    port = free_port()
    argv = python_module_argv("bench.hello_app", "--bind", f"127.0.0.1:{port}")
    with running_server(
        argv, base_url=f"http://127.0.0.1:{port}", ready_path="/hello", env=env
    ) as server:
        yield server


def require_wrk() -> str:
    """The path of the wrk binary.

    :raises WrkMissingError: wrk is not on PATH; the message says how to install it.
    """
    path = shutil.which("wrk")
    if path is None:
        raise WrkMissingError(WRK_INSTALL_HINT)
    return path


def wrk_found() -> bool:
    """Whether wrk is on PATH; when it is not, say how to install it (on stderr), so a
    benchmark's ``main`` can return 2 at once."""
    try:
        require_wrk()
    except WrkMissingError as error:
        print(error, file=sys.stderr)
        return False
    return True


def run_wrk(
    url: str,
    *,
    duration_s: int,
    connections: int,
    threads: int,
    headers: Mapping[str, str] | None = None,
    lua_script: str | None = None,
) -> WrkResult:
    """Load ``url`` with ``wrk --latency`` and return its figures.

    ``lua_script`` is Lua source (for example setting ``wrk.method`` and ``wrk.body``); it
    must not define ``done``, which the harness uses to read the figures as JSON.

    :raises ValueError: the arguments are ones wrk would refuse, or the script defines done.
    :raises WrkMissingError: wrk is not installed.
    :raises WrkError: wrk failed or printed no figures.
    """
    if duration_s < 1 or threads < 1 or connections < threads:
        raise ValueError("wrk needs duration_s >= 1, threads >= 1 and connections >= threads")
    if lua_script is not None and "function done" in lua_script:
        raise ValueError("lua_script must not define done(): the harness reports through it")
    wrk = require_wrk()
    with tempfile.NamedTemporaryFile("w", suffix=".lua", prefix="flowsvc-wrk-") as script:
        script.write((lua_script or "") + _REPORTER_LUA)
        script.flush()
        argv = [wrk, "--latency", f"-d{duration_s}s", f"-c{connections}", f"-t{threads}"]
        for name, value in (headers or {}).items():
            argv += ["-H", f"{name}: {value}"]
        argv += ["-s", script.name, url]
        completed = subprocess.run(
            argv, capture_output=True, text=True, timeout=duration_s + 60, check=False
        )
    if completed.returncode != 0:
        raise WrkError(f"wrk exited with code {completed.returncode}:\n{completed.stderr}")
    return _parse_wrk_output(completed.stdout)


def _parse_wrk_output(stdout: str) -> WrkResult:
    lines = [line for line in stdout.splitlines() if line.startswith(_RESULT_MARKER)]
    if not lines:
        raise WrkError(f"wrk printed no result line:\n{stdout}")
    figures = json.loads(lines[-1].removeprefix(_RESULT_MARKER))
    return WrkResult(
        rps=figures["requests"] / (figures["duration_us"] / 1e6),
        p50_ms=figures["p50_us"] / 1000,
        p99_ms=figures["p99_us"] / 1000,
        errors=figures["connect"] + figures["read"] + figures["write"] + figures["timeout"],
        non_2xx=figures["status"],
    )


def _median_result(runs: Sequence[WrkResult]) -> WrkResult:
    return WrkResult(
        rps=statistics.median(run.rps for run in runs),
        p50_ms=statistics.median(run.p50_ms for run in runs),
        p99_ms=statistics.median(run.p99_ms for run in runs),
        errors=statistics.median_low(run.errors for run in runs),
        non_2xx=statistics.median_low(run.non_2xx for run in runs),
    )


def measure_pair(
    baseline_url: str,
    candidate_url: str,
    rounds: int = 3,
    *,
    duration_s: int = 5,
    connections: int = 16,
    threads: int = 1,
    warmup_s: int = 1,
    headers: Mapping[str, str] | None = None,
    lua_script: str | None = None,
) -> PairResult:
    """Measure baseline and candidate in alternating runs and return the median of each figure.

    Each side first gets an unrecorded warm-up of ``warmup_s`` seconds (0 skips it). The
    order flips every round (B C, C B, B C, ...) so neither side always runs on a machine
    the other has just heated. The other arguments go to ``run_wrk`` for every run.

    :raises ValueError: ``rounds`` is below 1, or as ``run_wrk``.
    :raises WrkMissingError, WrkError: as ``run_wrk``.
    """
    if rounds < 1:
        raise ValueError("measure_pair needs at least one round")

    run = functools.partial(
        run_wrk, connections=connections, threads=threads, headers=headers, lua_script=lua_script
    )
    if warmup_s > 0:
        run(baseline_url, duration_s=warmup_s)
        run(candidate_url, duration_s=warmup_s)
    baseline_runs: list[WrkResult] = []
    candidate_runs: list[WrkResult] = []
    for round_index in range(rounds):
        if round_index % 2 == 0:
            baseline_runs.append(run(baseline_url, duration_s=duration_s))
            candidate_runs.append(run(candidate_url, duration_s=duration_s))
        else:
            candidate_runs.append(run(candidate_url, duration_s=duration_s))
            baseline_runs.append(run(baseline_url, duration_s=duration_s))
    return PairResult(
        baseline=_median_result(baseline_runs),
        candidate=_median_result(candidate_runs),
        baseline_runs=baseline_runs,
        candidate_runs=candidate_runs,
    )


def cpu_seconds(pid: int) -> float:
    """User plus system CPU seconds a process (all its threads) has used so far (Linux)."""
    fields = Path(f"/proc/{pid}/stat").read_text(encoding="ascii").rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def process_tree(pids: Sequence[int]) -> list[int]:
    """Each of ``pids`` with its children (the workers of ``serve --workers N``), for
    ``cpu_seconds`` over a whole server or several hosts (Linux)."""
    tree: list[int] = []
    for pid in pids:
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text(encoding="ascii").split()
        tree += [pid, *(int(child) for child in children)]
    return tree


@dataclasses.dataclass(frozen=True)
class Measured:
    """A ``measure_pair`` result and each side's CPU microseconds per request over its runs.

    CPU per request hardly moves when other work shares the machine, where throughput
    does: ``cpu_ratio`` (baseline CPU / candidate CPU) is the rps ratio the two would show
    each with a core to itself, a steadier reading of the same question, and the headline
    of every request-path benchmark.
    """

    pair: PairResult
    baseline_cpu_us: float
    candidate_cpu_us: float

    @property
    def cpu_ratio(self) -> float:
        return self.baseline_cpu_us / self.candidate_cpu_us

    def ratios(self) -> dict[str, float]:
        """``compare``'s ratios and ``cpu_ratio``."""
        return {**compare(self.pair.baseline, self.pair.candidate), "cpu_ratio": self.cpu_ratio}


def measure_servers(baseline: RunningServer, baseline_path: str, candidate: RunningServer,
                    candidate_path: str, *, rounds: int = 3, duration_s: int = 5,
                    connections: int = 16, threads: int = 1,
                    headers: Mapping[str, str] | None = None,
                    lua_script: str | None = None) -> Measured:
    """``measure_pair`` of two server processes with their CPU use around the runs
    (``lua_script`` as for ``run_wrk``).

    Each side gets one unrecorded second of warm-up, outside the CPU accounting.

    :raises WrkMissingError, WrkError: as ``run_wrk``.
    """
    urls = (baseline.url(baseline_path), candidate.url(candidate_path))
    for url in urls:
        run_wrk(url, duration_s=1, connections=connections, threads=threads, headers=headers,
                lua_script=lua_script)
    pids = (baseline.process.pid, candidate.process.pid)
    before = [cpu_seconds(pid) for pid in pids]
    pair = measure_pair(*urls, rounds=rounds, duration_s=duration_s, warmup_s=0,
                        connections=connections, threads=threads, headers=headers,
                        lua_script=lua_script)
    used = [cpu_seconds(pid) - start for pid, start in zip(pids, before, strict=True)]
    served = [sum(run.rps for run in runs) * duration_s
              for runs in (pair.baseline_runs, pair.candidate_runs)]
    return Measured(pair, used[0] / served[0] * 1e6, used[1] / served[1] * 1e6)


def report_measured(title: str, measured: Measured, baseline: str, candidate: str) -> None:
    """Print the wrk table of a ``Measured`` and its CPU figures."""
    pair = measured.pair
    print_report(title, [(baseline, pair.baseline), (candidate, pair.candidate)])
    ratios = measured.ratios()
    print(f"CPU per request: {baseline} {measured.baseline_cpu_us:.0f} us, {candidate} "
          f"{measured.candidate_cpu_us:.0f} us, CPU ratio {ratios['cpu_ratio']:.3f} "
          f"(rps ratio {ratios['rps_ratio']:.3f}, p99 ratio {ratios['p99_ratio']:.3f})")


def goal_row(figure: str, value: float, goal: float, *, at_most: bool = False
             ) -> dict[str, object]:
    """One row of ``make bench``'s summary table (``bench.run_all``), for the ``summary`` list
    of a benchmark's JSON: ``value`` against a goal of at least ``goal`` (at most with
    ``at_most``)."""
    return {"figure": figure, "value": value, "goal": f"{'<=' if at_most else '>='} {goal:g}",
            "met": value <= goal if at_most else value >= goal}


def compare(baseline: WrkResult, candidate: WrkResult) -> dict[str, float]:
    """Ratios of candidate to baseline: above 1 is better for ``rps_ratio``, worse for latency.

    :raises ValueError: a baseline figure is zero, so the ratio means nothing.
    """
    if baseline.rps <= 0 or baseline.p50_ms <= 0 or baseline.p99_ms <= 0:
        raise ValueError(f"baseline has a zero figure, no ratio can be taken: {baseline}")
    return {
        "rps_ratio": candidate.rps / baseline.rps,
        "p50_ratio": candidate.p50_ms / baseline.p50_ms,
        "p99_ratio": candidate.p99_ms / baseline.p99_ms,
    }


def format_report(title: str, rows: Sequence[tuple[str, WrkResult]]) -> str:
    """An aligned table of ``rows``, with ratios of every row against the first one.

    :raises ValueError: as ``compare``, or ``rows`` is empty.
    """
    if not rows:
        raise ValueError("a report needs at least the baseline row")
    header = ("", "rps", "p50 ms", "p99 ms", "errors", "non-2xx", "rps ratio", "p99 ratio")
    table = [header]
    for name, result in rows:
        ratios = compare(rows[0][1], result)
        table.append(
            (name, f"{result.rps:.0f}", f"{result.p50_ms:.2f}", f"{result.p99_ms:.2f}")
            + (str(result.errors), str(result.non_2xx))
            + (f"{ratios['rps_ratio']:.3f}", f"{ratios['p99_ratio']:.3f}")
        )
    widths = [max(len(row[column]) for row in table) for column in range(len(header))]
    lines = [
        "  ".join(
            cell.ljust(width) if column == 0 else cell.rjust(width)
            for column, (cell, width) in enumerate(zip(row, widths, strict=True))
        )
        for row in table
    ]
    return "\n".join([f"== {title} ==", *lines])


def print_report(title: str, rows: Sequence[tuple[str, WrkResult]]) -> None:
    """Print ``format_report(title, rows)`` to stdout."""
    print(format_report(title, rows))


def _to_json(value: object) -> object:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"cannot write {type(value).__name__} as JSON")


def write_json(path: str | Path, data: object) -> Path:
    """Write ``data`` as indented JSON; a relative ``path`` lands under ``bench/results/``.

    Dataclasses (``WrkResult``, ``PairResult``) are written as objects.

    :return: the absolute path written.
    :raises TypeError: ``data`` holds something JSON cannot represent.
    """
    target = Path(path) if Path(path).is_absolute() else RESULTS_DIR / path
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps(data, indent=2, default=_to_json) + "\n", encoding="utf-8")
    return target


@contextlib.contextmanager
def flowsvc_server(env: Mapping[str, str], var_dir: Path | None = None
                   ) -> Iterator[RunningServer]:
    """Run ``flowsvc serve`` on a free port with ``env`` over the bench defaults.

    The defaults: a temporary ``var/`` (SQLite database and generated secrets), the log
    level at warning so logging does not dominate the figures, and the config file of the
    repository not read (only defaults and ``env``). ``env`` wins over every default.

    :raises ServerStartError: as ``running_server``.
    """
    with tempfile.TemporaryDirectory(prefix="flowsvc-bench-var-") as scratch:
        port = free_port()
        defaults = {
            "FLOWSVC_SERVICE_VAR_DIR": str(var_dir or Path(scratch) / "var"),
            "FLOWSVC_SERVICE_LOG_LEVEL": "warning",
            "FLOWSVC_SERVICE_COOKIE_SECURE": "false",
        }
        argv = python_module_argv("runtime.cli", "--config", os.devnull, "serve",
                                  "--bind", f"127.0.0.1:{port}")
        # A minute to start: with four chains, the imports and the chain id checks took
        # more than the default 20 s at a load average of 17 on the shared two cores.
        with running_server(argv, base_url=f"http://127.0.0.1:{port}", ready_path="/healthz",
                            env={**defaults, **env}, ready_timeout_s=60.0) as server:
            yield server


@contextlib.contextmanager
def postgres_schema(url: str) -> Iterator[str]:
    """A fresh schema in ``url``'s database; yields a SQLAlchemy URL using it, drops it after.

    Lets benchmarks and tests share one PostgreSQL server without seeing each other's rows.
    """
    import secrets
    import urllib.parse

    import psycopg

    plain = url.replace("postgresql+psycopg://", "postgresql://")
    schema = f"flowsvc_{secrets.token_hex(6)}"
    with psycopg.connect(plain, autocommit=True) as connection:
        connection.execute(f'CREATE SCHEMA "{schema}"')
    separator = "&" if "?" in url else "?"
    try:
        yield f"{url}{separator}options={urllib.parse.quote(f'-csearch_path={schema}')}"
    finally:
        with psycopg.connect(plain, autocommit=True) as connection:
            connection.execute(f'DROP SCHEMA "{schema}" CASCADE')


def signed_in(http: httpx.Client) -> str:
    """Sign ``http`` (an ``httpx.Client`` on a flowsvc service) in with a fresh wallet over
    SIWE; the session token, also kept in the client's cookies.

    :raises RuntimeError: the service refused the sign-in or set no session cookie.
    """
    wallet = Account.create()
    address = wallet.address.lower()
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
    return str(token)


def session_cookie(base_url: str) -> str:
    """A ``svc_session`` token of a fresh wallet signed in to the service at ``base_url``.

    :raises RuntimeError: the service refused the sign-in or the session.
    """
    with httpx.Client(base_url=base_url, timeout=30) as http:
        token = signed_in(http)
        if http.get("/me").status_code != 200:
            raise RuntimeError("GET /me refused the fresh session")
        return token


def new_key(base_url: str, rate_limit_rpm: int) -> tuple[str, str, str]:
    """Sign a fresh wallet in and create an API key: (raw key, key id, session token)."""
    with httpx.Client(base_url=base_url, timeout=30) as http:
        token = signed_in(http)
        created = http.post("/me/api-keys", json={"name": "bench",
                                                  "rate_limit_rpm": rate_limit_rpm})
        created.raise_for_status()
        key = created.json()["key"]
        return key["raw_key"], key["id"], token
