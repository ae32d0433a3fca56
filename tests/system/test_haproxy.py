"""Two ``flowsvc serve`` processes behind HAProxy, configured by the file docs/ ships.

The processes share a PostgreSQL schema and a private Redis; HAProxy runs
docs/haproxy/flowsvc.cfg unchanged (the addresses through its environment). Requests are
spread over both processes with no stickiness. A project's stream read through HAProxy
survives the SIGKILL of the process serving it: the client reconnects with
``Last-Event-ID`` and gets every remaining event once, in order, from the other. The
health check takes out a dead process and one whose ``/readyz`` answers 503 (its Redis is
stopped); with no process left, HAProxy's own 503 carries flowsvc's error envelope as JSON.
"""

from __future__ import annotations

import re
import signal
import subprocess
from collections import Counter
from pathlib import Path

import httpx
import pytest
import trio

from tests.support.backends import POSTGRES_URL, postgres_schema
from tests.support.haproxy import SHIPPED_CONFIG, haproxy
from tests.support.private_servers import private_redis
from tests.support.processes import serving
from tests.support.projects import eventually, new_project, projects_env
from tests.support.server import free_port
from tests.support.sse import follow, open_sse
from tests.support.tokens import add_token
from tests.support.wallet import sign_in

SERVERS = ["flowsvc-1", "flowsvc-2"]  # the server names of the shipped configuration
CHECK_SECONDS = 30.0  # wide: the shipped check marks a server down in about 4 s


@pytest.mark.timeout(180)  # about 25 s here; room for a loaded two-core machine
async def test_two_processes_behind_the_shipped_haproxy_config(tmp_path: Path) -> None:
    assert POSTGRES_URL, "needs FLOWSVC_TEST_POSTGRES_URL (both processes share it)"
    log_path = tmp_path / "haproxy.log"
    with postgres_schema() as database_url, private_redis() as redis:
        env = projects_env(tmp_path / "var", database_url=database_url, redis_url=redis.url)
        ports, front = [free_port(), free_port()], free_port()
        backends = [f"127.0.0.1:{port}" for port in ports]
        with serving(env, ports) as processes, haproxy(front, backends, log_path):
            base_url = f"http://127.0.0.1:{front}"
            await requests_are_spread(base_url)
            slug = await a_finished_run(base_url)
            killed = await stream_resumes_on_the_other_process(base_url, slug, processes)
            await wait_logged(log_path, rf"{killed} is DOWN")
            survivor = SERVERS[1 - SERVERS.index(killed)]
            async with httpx.AsyncClient(base_url=base_url, timeout=30) as http:
                served = {(await http.get("/healthz")).headers["x-served-by"] for _ in range(6)}
            assert served == {survivor}
            # Redis stops: the survivor's /readyz answers 503, so the check takes it out.
            redis.stop()
            await wait_logged(log_path,
                              rf"{survivor} is DOWN, reason: Layer7 wrong status, code: 503")
            # /healthz needs no dependency: this 503 is HAProxy's own, with no server up.
            async with httpx.AsyncClient(base_url=base_url, timeout=30) as http:
                answer = await http.get("/healthz")
            assert answer.status_code == 503
            assert answer.headers["content-type"] == "application/json"
            assert "x-served-by" not in answer.headers
            error = answer.json()["error"]
            assert error["code"] == "unavailable" and error["message"], answer.text
            shipped = (SHIPPED_CONFIG.parent / "errors" / "503.http").read_bytes()
            assert shipped.endswith(answer.content)


async def requests_are_spread(base_url: str) -> None:
    # One keep-alive connection, yet every request is balanced on its own: no stickiness.
    async with httpx.AsyncClient(base_url=base_url, timeout=30) as http:
        served = Counter([(await http.get("/healthz")).headers["x-served-by"]
                          for _ in range(10)])
    assert served == {"flowsvc-1": 5, "flowsvc-2": 5}, served


async def a_finished_run(base_url: str) -> str:
    """Sign in, create a project and run it to its end, all through HAProxy (so over both
    processes: the nonce, the session and the run are shared); the project's slug."""
    async with httpx.AsyncClient(base_url=base_url, timeout=30) as http:
        wallet, _ = await sign_in(http)
        registered = await add_token(base_url, "balanced", wallet.address.lower())
        assert registered.status_code == 201, registered.text
        slug: str = (await new_project(http, "balanced"))["slug"]
        assert (await http.post(f"/projects/{slug}/start")).status_code == 201
    return slug


async def stream_resumes_on_the_other_process(
        base_url: str, slug: str, processes: list[subprocess.Popen[bytes]]) -> str:
    """Read a stream's first events, SIGKILL the process serving it, resume through HAProxy
    from ``Last-Event-ID``; the name of the killed server."""
    path = f"/projects/{slug}/stream"
    run, _ = await follow(base_url, path)  # the whole run, up to its "done"
    assert len(run) > 4 and run[-1].event == "done", [event.event for event in run]
    async with open_sse(base_url, path) as stream:
        assert stream.status == 200
        before = [await stream.next_event() for _ in range(3)]
        killed = stream.headers["x-served-by"]
        assert before == run[:3]
        victim = processes[SERVERS.index(killed)]
        victim.send_signal(signal.SIGKILL)
        victim.wait()
    assert before[-1].id is not None
    async with open_sse(base_url, path, {"Last-Event-ID": before[-1].id}) as stream:
        assert stream.status == 200
        assert stream.headers["x-served-by"] != killed
        after = await stream.until("done")
    assert after == run[3:]  # every remaining event, once, in order
    return killed


async def wait_logged(log_path: Path, pattern: str) -> None:
    """Until HAProxy's output matches ``pattern`` (a server state change it logs)."""
    log = trio.Path(log_path)

    async def logged() -> bool:
        return re.search(pattern, await log.read_text()) is not None

    try:
        await eventually(logged, CHECK_SECONDS)
    except BaseException:
        print(await log.read_text())
        raise
