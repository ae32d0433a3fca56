"""The token registry of the chain plugin: its internal endpoints, its command, the ``TOKENS``
contract, and a database whose ``tokens`` table the projects plugin created before the
registry moved here."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import httpx
import pytest
from alembic import command
from sqlalchemy import Engine, insert, inspect, select, text

from plugins.chain.tables import tokens
from runtime.bootstrap import open_service
from runtime.cli import main
from runtime.contracts.tokens import TOKENS, TokenInfo
from runtime.migrate import alembic_config
from runtime.service import Service
from runtime.wire import utcnow
from tests.support.backends import another_database
from tests.support.schema import drift
from tests.support.server import INTERNAL, client, make_settings, settings_env
from tests.support.tokens import add_token, chain_env, serve_chain
from tests.support.wallet import sign_in

LEGACY_REVISIONS = Path(__file__).parents[2] / "support" / "legacy_migrations"


def error_of(response: httpx.Response) -> tuple[int, str]:
    return response.status_code, response.json()["error"]["code"]


async def test_internal_token_registry(tmp_path: Path) -> None:
    async with serve_chain(tmp_path / "var", f"sqlite:///{tmp_path / 'db.sqlite'}") as running:
        owner = "0x" + "ab" * 20
        created = await add_token(running.base_url, "tok", owner.upper().replace("0X", "0x"))
        assert created.status_code == 201
        token = created.json()["token"]
        assert token["ownerAddress"] == owner and token["template"] == "dpnm"
        updated = await add_token(running.base_url, "tok", "0x" + "cd" * 20)
        assert updated.status_code == 200
        assert updated.json()["token"]["ownerAddress"].endswith("cd")
        clash = await add_token(running.base_url, "tok2", owner, instance=token["instance"])
        assert error_of(clash) == (409, "conflict")
        async with client(running) as http:
            assert error_of(await http.put("/internal/tokens/x", json={})) == \
                (401, "unauthenticated")
            await sign_in(http)
            assert error_of(await http.get("/internal/tokens/tok")) == (401, "unauthenticated")
        async with client(running,
                          headers=INTERNAL) as ops:
            assert (await ops.get("/internal/tokens/tok")).json()["token"]["slug"] == "tok"
            assert error_of(await ops.get("/internal/tokens/none")) == (404, "not_found")
            bad = await ops.put("/internal/tokens/tok", json={
                "ownerAddress": owner, "template": "pump", "chainId": 56, "instance": owner})
            assert error_of(bad) == (400, "invalid_request")



async def test_a_slug_is_matched_whole(tmp_path: Path) -> None:
    """``$`` matches before a final newline: ``name%0A`` must not register ``"name\\n"``."""
    async with serve_chain(tmp_path / "var", f"sqlite:///{tmp_path / 'db.sqlite'}") as running:
        owner = "0x" + "ab" * 20
        for slug in ("name%0A", "name%0D%0A", "%0Aname", "na%0Ame"):
            refused = await add_token(running.base_url, slug, owner, instance=owner)
            assert error_of(refused) == (400, "invalid_request"), (slug, refused.text)
            assert refused.json()["error"]["details"] == [{"field": "slug",
                                                           "message": "malformed"}]
        for address in (owner + "\n", owner + "\r\n"):
            refused = await add_token(running.base_url, "name", address, instance=owner)
            assert error_of(refused) == (400, "invalid_request"), refused.text
        async with client(running, headers=INTERNAL) as ops:
            assert error_of(await ops.get("/internal/tokens/name")) == (404, "not_found")
            assert (await add_token(running.base_url, "name", owner,
                                    instance=owner)).status_code == 201


def test_tokens_add_update_and_list(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                    capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)  # no config.toml: defaults and the environment only
    for name, value in chain_env(tmp_path / "var", f"sqlite:///{tmp_path / 'db.sqlite'}").items():
        monkeypatch.setenv(name, value)
    owner, instance = "0x" + "Ab" * 20, "0x" + "12" * 20
    add = ["tokens", "add", "moon", "--owner", owner, "--template", "virtuals",
           "--chain-id", "56", "--instance", instance]
    assert main(add) == 0
    assert capsys.readouterr().out == f"added moon owned by {owner.lower()}\n"
    assert main([*add[:4], "0x" + "cd" * 20, *add[5:]]) == 0
    assert capsys.readouterr().out.startswith("updated moon owned by 0xcdcd")
    assert main(["tokens", "add", "Bad Slug", *add[3:]]) == 2
    assert "lowercase letters" in capsys.readouterr().out
    assert main(["tokens", "list"]) == 0
    assert capsys.readouterr().out == f"moon\t0x{'cd' * 20}\tvirtuals\t56\t{instance}\n"


async def test_other_plugins_read_the_registry_through_the_tokens_contract(
        tmp_path: Path, database_url: str) -> None:
    async with serve_chain(tmp_path / "var", database_url) as running:
        owner, instance = "0x" + "Ef" * 20, "0x" + "34" * 20
        assert (await add_token(running.base_url, "moon", owner, instance=instance)
                ).status_code == 201
        registry = running.service.contract(TOKENS)
        found = await running.service.db.read(registry.get, "moon")
        assert found == TokenInfo(slug="moon", owner_address=owner.lower(), template="dpnm",
                                  chain_id=56, instance=instance)
        assert await running.service.db.read(registry.get, "sun") is None


def _service_settings(var_dir: Path, database_url: str, plugins: list[str]) -> Any:
    return make_settings(settings_env(var_dir, database_url=database_url,
                                      extra={"FLOWSVC_PLUGINS_ENABLED": json.dumps(plugins)}))


def _migrate_with_the_legacy_projects_revision(service: Service) -> None:
    """What the code before the move did: the core branch, then projects_0001 with tokens."""
    config = alembic_config(service)
    folders = [*service.migration_folders(), LEGACY_REVISIONS]
    config.set_main_option("version_locations", os.pathsep.join(str(f) for f in folders))
    with service.db.engine.begin() as connection:
        config.attributes["connection"] = connection
        command.upgrade(config, "heads")
        now = utcnow()
        connection.execute(insert(tokens), [
            {"slug": slug, "owner_address": "0x" + digit * 40, "template": "dpnm",
             "chain_id": 56, "instance_address": "0x" + digit * 39 + "f", "created_at": now,
             "updated_at": now} for slug, digit in (("moon", "1"), ("sun", "2"))])


def _described(engine: Engine) -> dict[str, Any]:
    """Every table but Alembic's, with its columns, keys, indexes and constraints."""
    found = inspect(engine)
    return {table: {
        "columns": [(c["name"], str(c["type"]), c["nullable"]) for c in found.get_columns(table)],
        "primary": found.get_pk_constraint(table)["constrained_columns"],
        "foreign": sorted((tuple(f["constrained_columns"]), f["referred_table"],
                           tuple(f["referred_columns"])) for f in found.get_foreign_keys(table)),
        "indexes": sorted((i["name"], tuple(i["column_names"]), bool(i["unique"]))
                          for i in found.get_indexes(table)),
        "unique": sorted((u["name"], tuple(u["column_names"]))
                         for u in found.get_unique_constraints(table)),
    } for table in sorted(found.get_table_names()) if table != "alembic_version"}


async def test_a_database_migrated_before_the_move_upgrades_and_keeps_its_tokens(
        tmp_path: Path, database_url: str) -> None:
    async with open_service(_service_settings(tmp_path / "old", database_url, []),
                            migrate=False) as old:
        _migrate_with_the_legacy_projects_revision(old)
        with old.db.engine.connect() as connection:
            before = connection.execute(select(tokens).order_by(tokens.c.slug)).all()
            legacy_versions = set(connection.execute(
                text("SELECT version_num FROM alembic_version")).scalars())
    assert len(before) == 2 and "projects_0001" in legacy_versions

    plugins = ["auth", "chain", "projects"]
    async with open_service(_service_settings(tmp_path / "var", database_url, plugins),
                            migrate=True) as upgraded:
        with upgraded.db.engine.connect() as connection:
            assert connection.execute(select(tokens).order_by(tokens.c.slug)).all() == before
            assert drift(connection, upgraded.metadata()) == []
        schema = _described(upgraded.db.engine)
    with another_database(tmp_path, database_url) as fresh_url:
        async with open_service(_service_settings(tmp_path / "fresh", fresh_url, plugins),
                                migrate=True) as fresh:
            assert _described(fresh.db.engine) == schema
            assert (("token_slug",), "tokens", ("slug",)) in schema["projects"]["foreign"]
