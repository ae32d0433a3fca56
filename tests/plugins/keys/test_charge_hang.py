"""A Redis that hangs (SIGSTOP) while a charge is out: the script times out on our side but
runs in Redis once it continues (SIGCONT); the retries with the same token are no-ops, so
the charge is applied exactly once, in Redis and in the database."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from runtime.contracts.meter import METER_ACTOR, Charge, Charged
from runtime.errors import Unavailable
from runtime.server import Running
from tests.support.backends import redis_prefix
from tests.support.keys import create_key, keys_env
from tests.support.private_servers import private_redis
from tests.support.server import client, make_settings, running_server
from tests.support.wallet import sign_in

AMOUNT = 700_000


async def _charge(server: Running, key_id: int, token: str = "hang-1") -> Charged:
    charged = await server.service.registry.lookup(METER_ACTOR).call(
        Charge(key_id=key_id, micro_flow=AMOUNT, model="gpt-hang", token=token), timeout=5)
    assert isinstance(charged, Charged)
    return charged


async def test_a_charge_retried_across_a_hung_redis_is_applied_once(tmp_path: Path) -> None:
    database_url = f"sqlite:///{tmp_path / 'flowsvc.db'}"
    with private_redis() as redis:
        env = keys_env(tmp_path / "var", database_url, redis.url, prefix=redis_prefix(),
                       extra={"FLOWSVC_PLUGINS_KEYS_METER_TIMEOUT_SECONDS": "0.3"})
        async with running_server(make_settings(env), env) as server, client(server) as http:
            await sign_in(http)
            key = await create_key(http, rate_limit_rpm=0)
            key_id = int(key["id"])
            # A first charge connects the meter to Redis: the scripts sent while Redis hangs
            # then wait in its socket and run when it continues.
            await _charge(server, key_id, "warm-up")
            redis.pause()
            try:
                for _ in range(3):  # each script times out here, and waits in Redis
                    with pytest.raises(Unavailable):
                        await _charge(server, key_id)
            finally:
                redis.resume()
            with trio.fail_after(15):
                while True:
                    try:
                        charged = await _charge(server, key_id)
                        break
                    except Unavailable:  # the meter's connection is being replaced
                        await trio.sleep(0.2)
            assert (charged.micro_flow, charged.period_used) == (AMOUNT, 2 * AMOUNT)
            listed = (await http.get("/me/api-keys")).json()["keys"]
            assert [k["spend_period_used"] for k in listed if k["id"] == key["id"]] == \
                ["1.400000"]
            usage = (await http.get(f"/me/api-keys/{key_id}/usage",
                                    params={"since": "all"})).json()["usage"]
            assert (usage["charges"], usage["cost_flow"]) == (2, "1.400000")
