"""The chains of ``[plugins.chain]``: the TOML array of tables and its environment override,
what is refused, and the start-up check of every URL's chain id against an anvil."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from plugins.chain.indexed import TokenCounters, earned_by_level, indexed_head, token_counters
from plugins.chain.settings import ChainSettings
from plugins.chain.state import CHAIN
from runtime.config import ConfigError, validate_section
from tests.support.chain.anvil import Anvil
from tests.support.chain.deploy import Deployment
from tests.support.chain.service import chain_entry, chains_env
from tests.support.server import make_settings, running_server
from tests.support.tokens import chain_env

ADDRESS = "0x" + "Ab" * 20
TOML = f"""
[[plugins.chain.chains]]
id = 56
name = "bsc"
rpc_urls = ["https://bsc.example/rpc", "http://127.0.0.1:8545"]
factory = "{ADDRESS}"
usdt = "{ADDRESS}"
flow_instance = "{ADDRESS}"

[[plugins.chain.chains]]
id = 97
name = "bsc-testnet"
rpc_urls = ["https://testnet.example/rpc"]
factory = "{ADDRESS}"
usdt = "{ADDRESS}"
flow_instance = "{ADDRESS}"
finality_depth = 3
max_log_range = 500
"""


def _chains(table: dict[str, object], environ: dict[str, str] | None = None) -> ChainSettings:
    settings = validate_section(ChainSettings, table, ("plugins", "chain"), environ or {},
                                "[plugins.chain]")
    assert isinstance(settings, ChainSettings)
    return settings


def test_an_array_of_tables_configures_each_chain() -> None:
    settings = _chains(tomllib.loads(TOML)["plugins"]["chain"])
    bsc, testnet = settings.chains
    assert (bsc.id, bsc.name, bsc.finality_depth, bsc.max_log_range) == (56, "bsc", 12, None)
    assert bsc.factory == ADDRESS.lower()  # addresses are kept lowercase
    assert bsc.multicall3 == "0xca11bde05977b3631167028862be2a173976ca11"
    assert (testnet.finality_depth, testnet.max_log_range) == (3, 500)
    assert _chains({}).chains == []  # the embedded default: no chain


def test_the_environment_replaces_the_list_as_json() -> None:
    entry = {"id": 1, "name": "eth", "rpc_urls": ["https://eth.example"], "factory": ADDRESS,
             "usdt": ADDRESS, "flow_instance": ADDRESS}
    settings = _chains(tomllib.loads(TOML)["plugins"]["chain"], chains_env([entry]))
    assert [chain.id for chain in settings.chains] == [1]


@pytest.mark.parametrize(("change", "message"), [
    ({"rpc_urls": []}, "at least 1 item"),
    ({"rpc_urls": ["ws://node"]}, "http:// or https://"),
    ({"factory": "0x1234"}, "EVM address"),
    ({"id": 0}, "greater than 0"),
    ({"finality_depth": -1}, "greater than or equal to 0"),
    ({"surprise": 1}, "Extra inputs"),
])
def test_a_bad_chain_is_refused_naming_its_key(change: dict[str, object], message: str) -> None:
    entry = {"id": 1, "name": "eth", "rpc_urls": ["https://eth.example"], "factory": ADDRESS,
             "usdt": ADDRESS, "flow_instance": ADDRESS, **change}
    with pytest.raises(ConfigError, match=message):
        _chains({"chains": [entry]})


def test_two_chains_with_one_id_are_refused() -> None:
    table = tomllib.loads(TOML)["plugins"]["chain"]
    table["chains"][1]["id"] = 56
    with pytest.raises(ConfigError, match="two chains have the id 56"):
        _chains(table)


async def test_a_url_serving_another_chain_stops_the_start(
        tmp_path: Path, anvil: Anvil, deployment: Deployment) -> None:
    platform = deployment.platform
    env = {**chain_env(tmp_path / "var", f"sqlite:///{tmp_path / 'db.sqlite'}"),
           **chains_env([chain_entry(platform, [anvil.url + "/?key=secret"], chain_id=56,
                                     instance=deployment.dpnm.instance)])}
    with pytest.raises(BaseException) as raised:  # a group, from the server's nursery
        async with running_server(make_settings(env), env):
            pass
    errors = [error for error in _leaves(raised.value) if isinstance(error, ConfigError)]
    assert len(errors) == 1
    message = str(errors[0])
    assert "serves chain id 31337" in message and "configured with id 56" in message
    assert "secret" not in message and "\n" not in message


async def test_a_matching_chain_starts_with_nothing_indexed(
        tmp_path: Path, anvil: Anvil, deployment: Deployment) -> None:
    platform = deployment.platform
    entry = chain_entry(platform, [anvil.url], instance=deployment.dpnm.instance)
    env = {**chain_env(tmp_path / "var", f"sqlite:///{tmp_path / 'db.sqlite'}"),
           **chains_env([entry])}
    async with running_server(make_settings(env), env) as running:
        service = running.service
        state = service.state(CHAIN)
        assert list(state.pools) == [platform.chain_id]
        assert state.pools[platform.chain_id].endpoints[0].chain_id == platform.chain_id
        instance = deployment.dpnm.instance
        assert await service.db.read(token_counters, 5, instance) == TokenCounters(0, 0, 0, 0)
        assert await service.db.read(earned_by_level, 5, instance, ADDRESS) == [0] * 10
        assert await service.db.read(indexed_head, 5) is None


def _leaves(error: BaseException) -> list[BaseException]:
    if isinstance(error, BaseExceptionGroup):
        return [leaf for inner in error.exceptions for leaf in _leaves(inner)]
    return [error]
