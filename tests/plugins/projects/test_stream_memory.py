"""Replay memory over real sockets: readers that ask for a large backlog and never read
cost the process at most its budget of queued bytes (``subscriber_queued_bytes``), the
most-behind are cut off, and a reader cut off resumes with ``Last-Event-ID`` and misses
nothing.

The service runs as a ``flowsvc serve`` subprocess so its memory (``VmRSS``, ``VmHWM``)
is its own. Before the budget and the shared frames, the 64 readers of the first test took
it from 172 to 1,196 MB in nine seconds (each held its backlog joined, and hypercorn's framed
copy of it); now it grows by about 2 MB.
"""

from __future__ import annotations

import json
import re
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import httpx
import trio

from plugins.projects.live.ring import WRITE_BYTES
from tests.support.fake_openai import FakeOpenAI, StreamedTurn
from tests.support.projects import (
    assert_well_formed,
    eventually,
    new_project,
    projects_env,
    sample,
    serve_projects,
    service_process,
    token_owner,
)
from tests.support.server import free_port
from tests.support.sse import follow, open_sse
from tests.support.tokens import add_token
from tests.support.wallet import sign_in

READS = 200  # tool results of 40 KB each: a ring of about 8 MB, more than the kernel
# buffers of a reader that does not read (about 3 MB)
BUDGET = 2 * 1024 * 1024
PER_ADDRESS = 32
SURVIVORS = BUDGET // (WRITE_BYTES // 2)
MARGIN = 40 * 1024 * 1024
"""What else 65 connections may cost the process (request state, allocator slack)."""
ESTABLISHED = 1


def big_run() -> FakeOpenAI:
    content = "x" * 40_000
    return FakeOpenAI([
        StreamedTurn("Plan:\n1. Write\n2. Read", [
            ("write_file", json.dumps({"path": "big.txt", "content": content}))]),
        StreamedTurn("", [("read_file", '{"path": "big.txt"}')] * READS),
        StreamedTurn("Read it all."),
    ])


def memory(process: trio.Process) -> tuple[int, int]:
    """The process's resident memory now and at its peak (``VmRSS``, ``VmHWM``), in bytes."""
    status = Path(f"/proc/{process.pid}/status").read_text()
    kilobytes = dict(re.findall(r"^(VmRSS|VmHWM):\s+(\d+) kB", status, re.M))
    return int(kilobytes["VmRSS"]) * 1024, int(kilobytes["VmHWM"]) * 1024


@asynccontextmanager
async def never_reading(port: int, path: str, source: str, count: int, last_event_id: str
                        ) -> AsyncIterator[list[trio.socket.SocketType]]:
    """``count`` connections from ``source`` asking for the stream after ``last_event_id``
    with a 4 KiB receive buffer, that then never read a byte."""
    sockets = []
    try:
        for _ in range(count):
            sock = trio.socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sockets.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            await sock.bind((source, 0))
            await sock.connect(("127.0.0.1", port))
            await sock.send(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
                            f"Accept: text/event-stream\r\nLast-Event-ID: {last_event_id}"
                            "\r\n\r\n".encode())
        yield sockets
    finally:
        for sock in sockets:
            sock.close()


def connected(sockets: list[trio.socket.SocketType]) -> int:
    """How many are still established (read from the kernel, without reading the socket)."""
    return sum(sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 1)[0] == ESTABLISHED
               for sock in sockets)


async def test_readers_that_never_read_a_large_replay_cost_at_most_the_budget(
        tmp_path: Path, nursery: trio.Nursery) -> None:
    model_url = await nursery.start(big_run().serve)
    env = projects_env(tmp_path / "var", database_url=f"sqlite:///{tmp_path / 'db.sqlite'}",
                       backend="openai", model_base_url=model_url, model="fake",
                       subscriber_queued_bytes=str(BUDGET), streams_per_client="40",
                       # Only the budget cuts readers off here, not the write timeout.
                       subscriber_write_timeout_seconds="3600")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    async with service_process(env, port, tmp_path / "serve.log") as process, \
            httpx.AsyncClient(base_url=url, timeout=30) as http:
        wallet, _ = await sign_in(http)
        assert (await add_token(url, "big", wallet.address.lower())).status_code == 201
        created = await http.post("/projects", json={
            "tokenSlug": "big", "title": "Big", "agentTemplate": "research-agent",
            "brief": "Read the big file again and again."})
        path = f"/projects/{created.json()['slug']}/stream"
        assert (await http.post(f"{path.removesuffix('/stream')}/start")).status_code == 201
        complete, _ = await follow(url, path, timeout=120)
        assert_well_formed(complete)
        assert complete[-1].event == "done" and len(complete) > 2 * READS
        last = int(complete[-1].id or 0)

        before, peak_before = memory(process)
        most_queued = 0.0
        async with never_reading(port, path, "127.0.0.1", PER_ADDRESS, "0") as first, \
                never_reading(port, path, "127.0.0.2", PER_ADDRESS, "0") as second, \
                never_reading(port, path, "127.0.0.3", 2, str(last - 3)) as near_the_head:
            behind = first + second

            async def most_behind_cut() -> bool:
                nonlocal most_queued
                metrics = (await http.get("/metrics")).text
                most_queued = max(most_queued, sample(metrics, "flowsvc_sse_queued_bytes"))
                # With nobody waiting for room the last ones stay, holding the budget in
                # writes of more than half WRITE_BYTES each (40 KB frames joined).
                return connected(behind) <= SURVIVORS

            await eventually(most_behind_cut, timeout=90)
            now, peak = memory(process)
            metrics = (await http.get("/metrics")).text
            assert 0 < most_queued <= BUDGET
            assert sample(metrics, "flowsvc_sse_queued_bytes") <= BUDGET
            cut = sample(metrics, 'flowsvc_sse_readers_cut_total{reason="queued_bytes"}')
            assert cut >= 2 * PER_ADDRESS - SURVIVORS
            # Shared frames: the backlogs cost the process about the budget, not 64 copies
            # of the ring (each about 8 MB).
            assert now - before < 2 * BUDGET + MARGIN, (before, now)
            assert peak - max(peak_before, before) < 2 * BUDGET + MARGIN, (peak_before, peak)
            # Readers with little to catch up on finished their writes and are not cut.
            assert connected(near_the_head) == 2


async def test_a_reader_cut_off_by_the_budget_resumes_and_gets_every_event_once(
        tmp_path: Path, nursery: trio.Nursery) -> None:
    model_url = await nursery.start(big_run().serve)
    async with serve_projects(tmp_path / "var", f"sqlite:///{tmp_path / 'db.sqlite'}",
                              backend="openai", model_base_url=model_url, model="fake",
                              subscriber_queued_bytes=str(BUDGET),
                              subscriber_write_timeout_seconds="3600") as running, \
            token_owner(running, "resume") as http:
        slug = (await new_project(http, "resume"))["slug"]
        path = f"/projects/{slug}/stream"
        assert (await http.post(f"/projects/{slug}/start")).status_code == 201
        complete, _ = await follow(running.base_url, path, timeout=120)
        assert complete[-1].event == "done"
        quarter = complete[len(complete) // 4].id
        async with open_sse(running.base_url, path, {"Last-Event-ID": "0"},
                            receive_buffer=4096) as stalled:
            for _ in range(5):  # it reads a few events, then stops reading
                await stalled.next_event()
            # Others, a quarter less behind, stop reading too: the budget is soon spent, and
            # the stalled reader, the furthest behind, is cut off first.
            port = int(running.base_url.rsplit(":", 1)[1])
            async with never_reading(port, path, "127.0.0.1", 24, str(quarter)):
                async def stalled_cut() -> bool:
                    return connected([stalled.socket]) == 0

                await eventually(stalled_cut, timeout=60)
            try:  # what reached it before the reset is still there to read
                await stalled.until_end()
            except trio.BrokenResourceError:
                pass
        metrics = (await http.get("/metrics")).text
        assert sample(metrics, 'flowsvc_sse_readers_cut_total{reason="queued_bytes"}') >= 1
        assert sample(metrics, 'flowsvc_sse_readers_cut_total{reason="write_timeout"}') == 0
        assert 5 <= len(stalled.events) < len(complete)
        assert stalled.events == complete[:len(stalled.events)]
        async with open_sse(running.base_url, path,
                            {"Last-Event-ID": str(stalled.events[-1].id)}) as resumed:
            rest = await resumed.until("done", timeout=60)
        assert stalled.events + rest == complete
