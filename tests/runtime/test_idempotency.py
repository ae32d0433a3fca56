"""``Idempotency-Key`` on writes, over real HTTP: replay, reuse, in progress, scope, processes."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest
import trio
from sqlalchemy import Connection, func, select

from plugins.auth.tables import nonces
from runtime.server import Running
from tests.support.backends import POSTGRES_URL, postgres_schema
from tests.support.processes import serving
from tests.support.server import client, free_port, make_settings, running_server, settings_env
from tests.support.testkit_plugin import MODULE as TESTKIT
from tests.support.wallet import sign_in

ADDRESS = "0x" + "cd" * 20


def _env(tmp_path: Path, database_url: str) -> dict[str, str]:
    return settings_env(tmp_path / "var", database_url=database_url, plugins=["auth", TESTKIT],
                        extra={"FLOWSVC_LIMITS_ANONYMOUS_RPM": "0"})


@pytest.fixture
async def running(tmp_path: Path, database_url: str) -> AsyncIterator[Running]:
    env = _env(tmp_path, database_url)
    async with running_server(make_settings(env), env) as served:
        yield served


def _count_nonces(connection: Connection) -> int:
    return int(connection.execute(select(func.count()).select_from(nonces)).scalar_one())


async def _nonces(running: Running) -> int:
    return await running.service.db.read(_count_nonces)


def _key(value: str) -> dict[str, str]:
    return {"Idempotency-Key": value}


async def test_a_replay_returns_the_first_answer_without_a_second_side_effect(
        running: Running) -> None:
    async with client(running) as http:
        first = await http.post("/auth/nonce", json={"address": ADDRESS}, headers=_key("k-1"))
        assert first.status_code == 200
        assert "Idempotent-Replayed" not in first.headers
        again = await http.post("/auth/nonce", json={"address": ADDRESS}, headers=_key("k-1"))
    assert again.status_code == 200
    assert again.headers["Idempotent-Replayed"] == "true"
    assert again.content == first.content
    assert again.headers["content-type"] == first.headers["content-type"]
    assert await _nonces(running) == 1


async def test_the_same_key_with_another_request_is_refused(running: Running) -> None:
    async with client(running) as http:
        await http.post("/auth/nonce", json={"address": ADDRESS}, headers=_key("k-2"))
        other = await http.post("/auth/nonce", json={"address": "0x" + "ef" * 20},
                                headers=_key("k-2"))
        elsewhere = await http.post("/testkit/release", headers=_key("k-2"))
    for response in (other, elsewhere):
        assert response.status_code == 422
        assert response.json()["error"]["code"] == "idempotency_key_reused"
    assert await _nonces(running) == 1


async def test_a_duplicate_while_the_first_runs_is_in_progress(running: Running) -> None:
    answers: list[httpx.Response] = []
    async with client(running) as http, trio.open_nursery() as nursery:

        async def first() -> None:
            answers.append(await http.post("/testkit/slow", headers=_key("k-3")))

        nursery.start_soon(first)
        assert (await http.get("/testkit/wait", params={"entered": 1})).status_code == 200
        duplicate = await http.post("/testkit/slow", headers=_key("k-3"))
        assert duplicate.status_code == 409
        assert duplicate.json()["error"]["code"] == "idempotency_in_progress"
        await http.post("/testkit/release")
    async with client(running) as http:
        replay = await http.post("/testkit/slow", headers=_key("k-3"))
        state = (await http.get("/testkit/state")).json()
    assert [answer.status_code for answer in answers] == [201]
    assert replay.status_code == 201 and replay.headers["Idempotent-Replayed"] == "true"
    assert replay.json() == answers[0].json() == {"entered": 1}
    assert state["entered"] == 1  # neither the duplicate nor the replay ran the route


async def test_keys_are_scoped_per_caller(running: Running) -> None:
    async with client(running) as ada, client(running) as bob, client(running) as anonymous:
        await sign_in(ada)
        await sign_in(bob)
        before = await _nonces(running)
        answers = [await caller.post("/auth/nonce", json={"address": ADDRESS},
                                     headers=_key("shared-key"))
                   for caller in (ada, bob, anonymous)]
    assert [answer.status_code for answer in answers] == [200, 200, 200]
    assert not any("Idempotent-Replayed" in answer.headers for answer in answers)
    assert len({answer.json()["nonce"] for answer in answers}) == 3
    assert await _nonces(running) == before + 3


async def test_a_server_error_releases_the_key(running: Running) -> None:
    async with client(running) as http:
        first = await http.post("/testkit/boom", headers=_key("k-4"))
        second = await http.post("/testkit/boom", headers=_key("k-4"))
    assert first.status_code == second.status_code == 500
    assert "Idempotent-Replayed" not in second.headers
    assert first.headers["X-Request-Id"] != second.headers["X-Request-Id"]  # ran again


async def test_client_errors_are_replayed_too(running: Running) -> None:
    async with client(running) as http:
        first = await http.post("/auth/nonce", json={"address": "bad"}, headers=_key("k-5"))
        second = await http.post("/auth/nonce", json={"address": "bad"}, headers=_key("k-5"))
    assert first.status_code == second.status_code == 400
    assert second.headers["Idempotent-Replayed"] == "true"
    assert second.content == first.content


@pytest.mark.parametrize("key", ["", "has space", "é", "x" * 256])
async def test_an_invalid_key_is_invalid_request(running: Running, key: str) -> None:
    async with client(running) as http:
        response = await http.post("/auth/nonce", json={"address": ADDRESS},
                                   headers={b"Idempotency-Key": key.encode()})
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "invalid_request"
    assert await _nonces(running) == 0


async def test_reads_ignore_the_key(running: Running) -> None:
    async with client(running) as http:
        first = await http.get("/testkit/state", headers=_key("k-6"))
        second = await http.get("/testkit/state", headers=_key("k-6"))
    assert "Idempotent-Replayed" not in second.headers
    assert first.json() == second.json()


@pytest.fixture
def shared_database_url(tmp_path: Path) -> Iterator[str]:
    """PostgreSQL when configured (what several processes share in production), else SQLite."""
    if not POSTGRES_URL:
        yield f"sqlite:///{tmp_path / 'flowsvc.db'}"
        return
    with postgres_schema() as url:
        yield url


async def test_two_processes_on_one_database_run_a_key_once(tmp_path: Path,
                                                           shared_database_url: str) -> None:
    env = _env(tmp_path, shared_database_url)
    ports = [free_port(), free_port()]
    with serving(env, ports):
        urls = [f"http://127.0.0.1:{port}" for port in ports]
        answers: list[httpx.Response] = []

        async def post(url: str) -> None:
            async with httpx.AsyncClient(base_url=url, timeout=30) as http:
                answers.append(await http.post("/auth/nonce", json={"address": ADDRESS},
                                               headers=_key("cross-process")))

        async with trio.open_nursery() as nursery:  # both at once: one claims, one waits
            for url in urls:
                nursery.start_soon(post, url)
        for url in urls:  # and later, from either process, a replay
            await post(url)
    firsts, replays = answers[:2], answers[2:]
    ran = [answer for answer in firsts
           if answer.status_code == 200 and "Idempotent-Replayed" not in answer.headers]
    assert len(ran) == 1, [(answer.status_code, answer.text) for answer in firsts]
    other = firsts[1 - firsts.index(ran[0])]
    if other.status_code == 409:  # it came while the first still ran
        assert other.json()["error"]["code"] == "idempotency_in_progress"
    else:  # it came after
        assert other.headers["Idempotent-Replayed"] == "true"
        assert other.content == ran[0].content
    assert all(replay.headers["Idempotent-Replayed"] == "true" for replay in replays)
    assert all(replay.content == ran[0].content for replay in replays)
    async with running_server(make_settings(env), env) as running:
        assert await _nonces(running) == 1
