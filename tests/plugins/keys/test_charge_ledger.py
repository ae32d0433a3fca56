"""The charge ledger when the transaction that records a charge breaks at its ``COMMIT``.

PostgreSQL is a private one behind ``CommitCutter`` (a TCP proxy that breaks a connection
at its ``COMMIT``), on both meters (in-process, and Redis). The charge's caller sees 503
either way; what the ledger does next depends on what really happened:

- committed: a retry with the same token answers the charge, which counts once;
- not committed, and nobody retries (its caller died): the reconciler voids it after
  ``charge_grace_seconds`` and the meter gives the spend back; a retry after all makes
  the charge anew, once.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from pathlib import Path

import httpx
import psycopg
import pytest
import trio
from sqlalchemy import Connection, select

from plugins.keys.tables import key_charges
from runtime.contracts.meter import METER_ACTOR, Charge, Charged
from runtime.errors import Unavailable
from runtime.server import Running
from tests.support.backends import REDIS_URL, redis_prefix
from tests.support.commit_cutter import CommitCutter
from tests.support.keys import create_key, keys_env
from tests.support.private_servers import PrivatePostgres, private_postgres
from tests.support.server import client, make_settings, running_server
from tests.support.wallet import sign_in

AMOUNT = 400_000
METERS = ["memory"] + (["redis"] if REDIS_URL else [])


async def _charge(server: Running, key_id: int) -> Charged:
    charged = await server.service.registry.lookup(METER_ACTOR).call(
        Charge(key_id=key_id, micro_flow=AMOUNT, model="gpt-cut", token="cut-1"), timeout=10)
    assert isinstance(charged, Charged)
    return charged


def _state(connection: Connection) -> str:
    return str(connection.execute(select(key_charges.c.state)
                                  .where(key_charges.c.token == "cut-1")).scalar_one())


async def _spend_and_usage(http: httpx.AsyncClient, key_id: str) -> tuple[str, int]:
    [key] = [k for k in (await http.get("/me/api-keys")).json()["keys"] if k["id"] == key_id]
    usage = (await http.get(f"/me/api-keys/{key_id}/usage",
                            params={"since": "all"})).json()["usage"]
    return key["spend_period_used"], usage["charges"]


@pytest.fixture(scope="module")
def postgres() -> Iterator[PrivatePostgres]:
    """One private PostgreSQL for the module: starting one was most of each test's time."""
    with private_postgres() as server:
        yield server


@pytest.fixture
def database_url(postgres: PrivatePostgres) -> str:
    """A database of the test's own in the private PostgreSQL (a URL straight to it)."""
    name = f"ledger_{secrets.token_hex(4)}"
    with psycopg.connect(postgres.url, autocommit=True) as connection:
        connection.execute(f'CREATE DATABASE "{name}"')
    return postgres.url.rsplit("/", 1)[0] + f"/{name}"


@pytest.mark.parametrize("meter", METERS)
@pytest.mark.parametrize("committed", [True, False], ids=["committed", "not-committed"])
async def test_a_charge_whose_commit_broke(tmp_path: Path, nursery: trio.Nursery,
                                           postgres: PrivatePostgres, database_url: str,
                                           meter: str, committed: bool) -> None:
    cutter = CommitCutter(postgres.port)
    await nursery.start(cutter.serve)
    url = database_url.replace(f":{postgres.port}/", f":{cutter.port}/")
    env = keys_env(tmp_path / "var", url, REDIS_URL if meter == "redis" else "",
                   prefix=redis_prefix(),
                   extra={"FLOWSVC_PLUGINS_KEYS_CHARGE_GRACE_SECONDS": "1",
                          "FLOWSVC_PLUGINS_KEYS_CHARGE_RECONCILE_SECONDS": "0.3"})
    async with running_server(make_settings(env), env) as server, client(server) as http:
        await sign_in(http)
        key = await create_key(http, rate_limit_rpm=0)
        key_id = int(key["id"])
        # The usage row is written only by the transaction that records the charge.
        cutter.cut_next("INSERT INTO api_key_usage (", after=committed)
        with pytest.raises(Unavailable):
            await _charge(server, key_id)
        assert cutter.cuts == 1
        if committed:
            charged = await _charge(server, key_id)
            assert (charged.micro_flow, charged.period_used) == (AMOUNT, AMOUNT)
            assert await _spend_and_usage(http, key["id"]) == ("0.400000", 1)
            assert await server.service.db.read(_state) == "applied"
            return
        with trio.fail_after(10):
            # The reconciler's work shows only in the database: poll it.
            while await server.service.db.read(_state) != "void":  # noqa: ASYNC110
                await trio.sleep(0.1)
        assert await _spend_and_usage(http, key["id"]) == ("0.000000", 0)
        # Its caller retrying after all makes it anew, once.
        for _ in range(2):
            charged = await _charge(server, key_id)
            assert (charged.micro_flow, charged.period_used) == (AMOUNT, AMOUNT)
        assert await _spend_and_usage(http, key["id"]) == ("0.400000", 1)
        assert await server.service.db.read(_state) == "applied"
