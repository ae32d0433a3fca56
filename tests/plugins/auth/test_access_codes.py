"""Access codes: made by the operator command, used once over real HTTP, even under a race."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import httpx
import trio
from sqlalchemy import func, select

from plugins.auth.identities import new_access_codes
from runtime.server import Running
from runtime.users import users
from tests.support.server import ROOT, client
from tests.support.wallet import sign_in


def _error(response: httpx.Response) -> tuple[int, str]:
    return response.status_code, response.json()["error"]["code"]


def _operator_creates_codes(env: dict[str, str], config: Path, count: int) -> list[str]:
    """``flowsvc access-codes create --count N`` as an operator runs it."""
    config.write_text("", encoding="utf-8")
    done = subprocess.run(
        [sys.executable, "-m", "runtime.cli", "--config", str(config),
         "access-codes", "create", "--count", str(count)],
        cwd=ROOT, env={**os.environ, **env}, capture_output=True, text=True, timeout=60,
        check=False)
    assert done.returncode == 0, done.stderr
    return done.stdout.split()


async def _count_users(server: Running) -> int:
    count: int = await server.service.db.read(
        lambda connection: connection.execute(select(func.count()).select_from(users)).scalar())
    return count


async def test_operator_code_signs_up_once(server: Running, env: dict[str, str],
                                           tmp_path: Path) -> None:
    codes = await trio.to_thread.run_sync(_operator_creates_codes, env,
                                          tmp_path / "empty.toml", 2)
    assert len(codes) == 2 and len(set(codes)) == 2
    assert all(code.startswith("ac_") for code in codes)
    async with client(server) as http:
        used = await http.post("/auth/access-code", json={"code": codes[0]})
        assert used.status_code == 200, used.text
        user = used.json()["user"]
        assert user["id"].isdigit() and user["address"] is None and "messenger" not in user
        me = await http.get("/me")
        assert me.status_code == 200 and me.json()["user"]["id"] == user["id"]
        again = await http.post("/auth/access-code", json={"code": codes[0]})
        assert _error(again) == (401, "code_invalid")
        unknown = await http.post("/auth/access-code", json={"code": "ac_not-a-code"})
        assert _error(unknown) == (401, "code_invalid")
        empty = await http.post("/auth/access-code", json={"code": ""})
        assert _error(empty) == (400, "invalid_request")


async def test_signed_in_user_keeps_their_account(server: Running) -> None:
    [code] = await server.service.db.write(new_access_codes, 1)
    async with client(server) as http:
        _, user = await sign_in(http)
        users_before = await _count_users(server)
        used = await http.post("/auth/access-code", json={"code": code})
        assert used.status_code == 200
        assert used.json()["user"] == user
        assert await _count_users(server) == users_before


async def test_twenty_concurrent_uses_of_one_code_let_exactly_one_in(server: Running) -> None:
    [code] = await server.service.db.write(new_access_codes, 1)
    users_before = await _count_users(server)
    answers: list[httpx.Response] = []

    async def use(http: httpx.AsyncClient) -> None:
        answers.append(await http.post("/auth/access-code", json={"code": code}))

    async with client(server) as http, trio.open_nursery() as nursery:
        for _ in range(20):
            nursery.start_soon(use, http)
    assert sorted(answer.status_code for answer in answers) == [200] + [401] * 19
    assert {answer.json()["error"]["code"] for answer in answers
            if answer.status_code == 401} == {"code_invalid"}
    # The losers' would-be users were rolled back with their failed redemption.
    assert await _count_users(server) == users_before + 1
