"""The benchmark harness against a real hello-world server and a real wrk."""

import http.client
import json
import os
import signal
import subprocess
import sys
import urllib.parse
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench.harness import (
    RunningServer,
    ServerStartError,
    WrkMissingError,
    WrkResult,
    compare,
    format_report,
    free_port,
    hello_server,
    process_tree,
    require_wrk,
    run_wrk,
    running_server,
    write_json,
)


@pytest.fixture(scope="module")
def hello() -> Iterator[RunningServer]:
    with hello_server() as server:
        yield server


def _require_wrk() -> None:
    # wrk is a declared dependency of the suite (the Makefile installs it): its absence is a
    # failure with the install command, never a skip.
    try:
        require_wrk()
    except WrkMissingError as error:
        pytest.fail(str(error))


def _connect(server: RunningServer) -> http.client.HTTPConnection:
    port = urllib.parse.urlsplit(server.base_url).port
    return http.client.HTTPConnection("127.0.0.1", port, timeout=5)


def test_wrk_against_hello_world_reports_throughput_and_latency(hello: RunningServer) -> None:
    _require_wrk()
    result = run_wrk(hello.url("/hello"), duration_s=1, connections=2, threads=1)

    assert result.rps > 0
    assert 0 < result.p50_ms <= result.p99_ms
    assert (result.errors, result.non_2xx) == (0, 0)


def test_wrk_sends_headers_and_runs_the_lua_script(hello: RunningServer) -> None:
    _require_wrk()
    post = 'wrk.method = "POST"\nwrk.body = "tick"\n'
    headers = {"Content-Type": "text/plain"}

    published = run_wrk(
        hello.url("/publish"),
        duration_s=1,
        connections=1,
        threads=1,
        headers=headers,
        lua_script=post,
    )
    # GET is not an allowed method on /publish, so only a POST can answer 2xx.
    assert published.rps > 0
    assert published.non_2xx == 0
    refused = run_wrk(hello.url("/publish"), duration_s=1, connections=1, threads=1)
    assert refused.non_2xx > 0


def test_run_wrk_refuses_a_script_that_takes_over_done(hello: RunningServer) -> None:
    with pytest.raises(ValueError, match="done"):
        run_wrk(
            hello.url("/hello"),
            duration_s=1,
            connections=1,
            threads=1,
            lua_script="function done(summary, latency, requests) end",
        )


def test_sse_stream_receives_each_publish(hello: RunningServer) -> None:
    stream = _connect(hello)
    stream.request("GET", "/sse")
    response = stream.getresponse()
    assert response.getheader("Content-Type", "").startswith("text/event-stream")
    assert response.readline() == b": subscribed\n"
    assert response.readline() == b"\n"

    publisher = _connect(hello)
    publisher.request("POST", "/publish", body=b"first\nsecond")
    answer = publisher.getresponse()
    assert json.loads(answer.read()) == {"delivered": 1}
    publisher.close()

    event = [response.readline() for _ in range(4)]
    stream.close()
    assert event[0].startswith(b"id: ")
    assert event[1:] == [b"data: first\n", b"data: second\n", b"\n"]


def test_server_that_exits_fails_the_start_with_its_output() -> None:
    port = free_port()
    argv = [sys.executable, "-c", "import sys; sys.stderr.write('boom: no config'); sys.exit(3)"]

    with (
        pytest.raises(ServerStartError, match=r"(?s)code 3.*boom: no config"),
        running_server(argv, base_url=f"http://127.0.0.1:{port}", ready_path="/hello"),
    ):
        pytest.fail("the block must not run when the server never answered")


def test_silent_server_fails_the_start_after_the_timeout() -> None:
    port = free_port()
    argv = [sys.executable, "-c", "import time; print('sleeping', flush=True); time.sleep(30)"]

    with (
        pytest.raises(ServerStartError, match=r"(?s)did not answer.*sleeping"),
        running_server(
            argv, base_url=f"http://127.0.0.1:{port}", ready_path="/", ready_timeout_s=0.5
        ),
    ):
        pytest.fail("the block must not run when the server never answered")


def test_compare_and_report_show_ratios_against_the_first_row() -> None:
    baseline = WrkResult(rps=1000.0, p50_ms=2.0, p99_ms=10.0, errors=0, non_2xx=0)
    candidate = WrkResult(rps=500.0, p50_ms=4.0, p99_ms=25.0, errors=1, non_2xx=2)

    assert compare(baseline, candidate) == {"rps_ratio": 0.5, "p50_ratio": 2.0, "p99_ratio": 2.5}
    report = format_report("half as fast", [("base", baseline), ("cand", candidate)])
    lines = report.splitlines()
    assert lines[0] == "== half as fast =="
    assert lines[2].split() == ["base", "1000", "2.00", "10.00", "0", "0", "1.000", "1.000"]
    assert lines[3].split() == ["cand", "500", "4.00", "25.00", "1", "2", "0.500", "2.500"]
    assert len({len(line) for line in lines[1:]}) == 1


def test_compare_refuses_a_baseline_without_figures() -> None:
    empty = WrkResult(rps=0.0, p50_ms=0.0, p99_ms=0.0, errors=5, non_2xx=0)

    with pytest.raises(ValueError, match="zero figure"):
        compare(empty, empty)


def test_write_json_writes_dataclasses_as_objects(tmp_path: Path) -> None:
    result = WrkResult(rps=1.5, p50_ms=1.0, p99_ms=2.0, errors=0, non_2xx=0)

    written = write_json(tmp_path / "nested" / "result.json", {"run": result})

    assert written == tmp_path / "nested" / "result.json"
    assert json.loads(written.read_text()) == {
        "run": {"rps": 1.5, "p50_ms": 1.0, "p99_ms": 2.0, "errors": 0, "non_2xx": 0}
    }


def test_process_tree_lists_each_process_then_its_children() -> None:
    with subprocess.Popen(
            [sys.executable, "-c", "import subprocess, time; child = subprocess.Popen(['sleep', "
             "'60']); print(child.pid, flush=True); time.sleep(60)"],
            stdout=subprocess.PIPE, text=True) as parent:
        assert parent.stdout is not None
        child = int(parent.stdout.readline())
        try:
            tree = process_tree([parent.pid, os.getpid()])
        finally:
            os.kill(child, signal.SIGKILL)
            parent.kill()

    assert tree[:3] == [parent.pid, child, os.getpid()]
    assert parent.pid in tree[3:]  # this test's own child
