"""``flowsvc serve`` as a real process: graceful SIGTERM, a crashing plugin contained, several
workers."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import Any

import httpx
import trio

from tests.support.processes import run_flowsvc, serve, server_process, stop
from tests.support.projects import eventually
from tests.support.server import free_port, settings_env
from tests.support.testkit_plugin import MODULE as TESTKIT

CRASHING = "tests.support.crashing_plugin"
CRASHING_CORE = "tests.support.crashing_core_plugin"


def _env(tmp_path: Path, redis_url: str = "", plugins: list[str] | None = None,
         **extra: str) -> dict[str, str]:
    return settings_env(tmp_path / "var", database_url=f"sqlite:///{tmp_path / 'flowsvc.db'}",
                        redis_url=redis_url, plugins=plugins or ["auth", TESTKIT],
                        extra={"FLOWSVC_LIMITS_ANONYMOUS_RPM": "0", **extra})


async def test_sigterm_lets_the_request_in_flight_finish_and_exits_0(tmp_path: Path) -> None:
    port = free_port()
    process = serve(_env(tmp_path), port)
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=30) as http:
            answers: list[httpx.Response] = []
            async with trio.open_nursery() as nursery:

                async def slow_request() -> None:
                    answers.append(await http.post("/testkit/sleep", params={"seconds": "1"}))

                nursery.start_soon(slow_request)
                assert (await http.get("/testkit/wait", params={"inflight": 1})).status_code == 200
                process.send_signal(signal.SIGTERM)
        code = await trio.to_thread.run_sync(process.wait, 15)
    finally:
        output = stop([process])[0]
    assert [(answer.status_code, answer.json()) for answer in answers] == [(200, {"slept": 1.0})]
    assert code == 0, output
    assert "received SIGTERM: draining" in output
    assert "flowsvc stopped cleanly" in output


async def test_a_plugin_that_keeps_crashing_is_taken_down_and_retried_not_the_service(
        tmp_path: Path) -> None:
    env = _env(tmp_path, plugins=["auth", CRASHING],
               FLOWSVC_SUPERVISOR_PART_MAX_RESTARTS="2",
               FLOWSVC_SUPERVISOR_BACKOFF_INITIAL_SECONDS="0.01",
               FLOWSVC_SUPERVISOR_PART_RETRY_SECONDS="0.5")
    port = free_port()
    process = serve(env, port)
    part = f"part:{CRASHING}"
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=30) as http:

            async def retried_past_the_root_intensity() -> bool:
                metrics = (await http.get("/metrics")).text
                # The root allows 5 restarts within 30 s: these are more.
                return _sample(metrics, "flowsvc_actor_restarts_total",
                               'actor="crashing.actor"') > 5 and _sample(
                    metrics, "flowsvc_part_failures_total", f'part="{CRASHING}"') >= 3

            await eventually(retried_past_the_root_intensity, timeout=60)
            assert process.poll() is None  # formerly the supervisor gave up: exit code 1

            ready: dict[str, Any] = {}

            async def listed_as_down() -> bool:
                response = await http.get("/readyz")
                ready.update(response.json())  # kept: the part may be retried meanwhile
                return response.status_code == 200 and part in ready["checks"]

            await eventually(listed_as_down, timeout=30)
            assert ready["checks"][part] == {"ok": False, "error": (
                "down: actor crashing.actor crashed: more than 2 restarts within 30 s")}
            assert ready["status"] == "degraded"  # 200: a balancer keeps it
            assert ready["checks"]["database"] == {"ok": True}
            # The rest of the service serves.
            assert (await http.get("/healthz")).status_code == 200
            assert (await http.get("/openapi.json")).status_code == 200
            nonce = await http.post("/auth/nonce", json={"address": "0x" + "ab" * 20})
            assert nonce.status_code == 200, nonce.text
        process.send_signal(signal.SIGTERM)
        code = await trio.to_thread.run_sync(process.wait, 15)
    finally:
        output = stop([process])[0]
    assert code == 0, output  # a part down is not the service's failure
    assert f"part {CRASHING} is down: actor crashing.actor crashed" in output
    assert f"part {CRASHING} starts again" in output
    assert "supervisor gives up" not in output and "flowsvc stopped cleanly" in output


def test_a_core_actor_that_keeps_crashing_stops_the_service_with_exit_code_1(
        tmp_path: Path) -> None:
    env = _env(tmp_path, plugins=["auth", CRASHING_CORE],
               FLOWSVC_SUPERVISOR_MAX_RESTARTS="2",
               FLOWSVC_SUPERVISOR_BACKOFF_INITIAL_SECONDS="0.01")
    code, output = run_flowsvc(env, "serve", "--bind", f"127.0.0.1:{free_port()}", timeout=60)
    assert code == 1, output
    assert output.count("actor crashing.core_actor crashed") >= 3  # each crash is logged
    assert "RuntimeError: crashing on purpose" in output
    reason = "actor crashing.core_actor crashed: more than 2 restarts within 30 s"
    assert f"supervisor gives up: {reason}" in output
    assert f"flowsvc stopped: {reason}" in output
    assert "Traceback" not in output.split("supervisor gives up")[1]  # a clean stop after


def _sample(metrics: str, name: str, labels: str) -> float:
    for line in metrics.splitlines():
        if line.startswith(f"{name}{{") and labels in line:
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_a_wrong_plugin_setting_stops_the_start_naming_it(tmp_path: Path) -> None:
    env = _env(tmp_path, FLOWSVC_PLUGINS_AUTH_SIWE_CHAIN_ID="mainnet")
    code, output = run_flowsvc(env, "serve", "--bind", f"127.0.0.1:{free_port()}")
    assert code == 2
    assert "[plugins.auth]" in output and "siwe_chain_id" in output
    assert "Traceback" not in output


def _children(parent: int) -> list[int]:
    """Process ids whose parent is ``parent`` (from /proc)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == parent:
                found.append(int(entry.name))
    return sorted(found)


def _pid_answering(port: int) -> int:
    response = httpx.get(f"http://127.0.0.1:{port}/testkit/pid", timeout=30,
                         headers={"Connection": "close"})  # a new connection each time
    pid: int = response.json()["pid"]
    return pid


def test_several_workers_need_redis_and_then_share_one_port(tmp_path: Path,
                                                            redis_url: str) -> None:
    env = _env(tmp_path, redis_url)
    port = free_port()
    if not redis_url:
        code, output = run_flowsvc(env, "serve", "--bind", f"127.0.0.1:{port}", "--workers", "2")
        assert code == 2
        assert "--workers > 1 needs Redis (set FLOWSVC_REDIS_URL)" in output
        assert "migrations applied" not in output  # refused before doing anything
        return
    parent = serve(env, port, "--workers", "2")
    try:
        workers = _children(parent.pid)
        assert len(workers) == 2
        # Freeze one worker: the other must answer on the shared port, and the other way round.
        for frozen, expected in (workers, reversed(workers)):
            os.kill(frozen, signal.SIGSTOP)
            try:
                assert _pid_answering(port) == expected
            finally:
                os.kill(frozen, signal.SIGCONT)
        parent.send_signal(signal.SIGTERM)  # forwarded to the workers
        assert parent.wait(timeout=30) == 0
    finally:
        output = stop([parent])[0]
    assert output.count("flowsvc stopped cleanly") == 2, output


def test_the_service_runs_its_migrations_and_serves_the_embedded_default(tmp_path: Path) -> None:
    """No database URL, no Redis, no secrets: SQLite and secrets under var/, like `make serve`."""
    env = {"FLOWSVC_SERVICE_VAR_DIR": str(tmp_path / "var"), "FLOWSVC_DATABASE_URL": "",
           "FLOWSVC_REDIS_URL": "", "FLOWSVC_JWT_SECRET": "", "FLOWSVC_INTERNAL_TOKEN": "",
           "FLOWSVC_PLUGINS_ENABLED": json.dumps(["auth"])}
    port = free_port()
    process = serve(env, port)
    try:
        nonce = httpx.post(f"http://127.0.0.1:{port}/auth/nonce",
                           json={"address": "0x" + "12" * 20}, timeout=30)
    finally:
        stop([process])
    assert nonce.status_code == 200
    assert (tmp_path / "var" / "flowsvc.db").exists()
    assert (tmp_path / "var" / "secrets.json").exists()


def test_an_unreachable_redis_stops_the_start_with_a_clear_message(tmp_path: Path) -> None:
    closed = free_port()
    env = _env(tmp_path, redis_url=f"redis://user:hunter2@127.0.0.1:{closed}/0")
    code, output = run_flowsvc(env, "serve", "--bind", f"127.0.0.1:{free_port()}", timeout=30)
    assert code == 2
    assert f"cannot reach Redis at 127.0.0.1:{closed}" in output
    assert "hunter2" not in output


def test_public_url_follows_the_bind_unless_it_is_set(tmp_path: Path) -> None:
    port = free_port()
    address = "0x" + "12" * 20
    with server_process(_env(tmp_path), port):
        nonce = httpx.post(f"http://127.0.0.1:{port}/auth/nonce", json={"address": address})
    assert nonce.status_code == 200, nonce.text
    message = nonce.json()["message"]
    assert message.startswith(f"127.0.0.1:{port} wants you to sign in")
    assert f"URI: http://127.0.0.1:{port}\n" in message
    with server_process(_env(tmp_path, FLOWSVC_SERVICE_PUBLIC_URL="https://flow.example"),
                        port):
        nonce = httpx.post(f"http://127.0.0.1:{port}/auth/nonce", json={"address": address})
    assert "URI: https://flow.example\n" in nonce.json()["message"]
