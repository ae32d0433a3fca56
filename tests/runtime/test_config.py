"""Settings: config.toml validated at start, environment overrides, embedded-default secrets."""

from __future__ import annotations

import json
import stat
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from plugins.auth.settings import AuthSettings
from runtime.bootstrap import open_service
from runtime.config import ConfigError, Settings, load_settings
from tests.support.server import ROOT

SECRETS = {"FLOWSVC_JWT_SECRET": "j" * 40, "FLOWSVC_INTERNAL_TOKEN": "i" * 40}


def _toml(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "config.toml"
    path.write_text(text, encoding="utf-8")
    return path


def _var(tmp_path: Path) -> dict[str, str]:
    return {"FLOWSVC_SERVICE_VAR_DIR": str(tmp_path / "var")}


def _error(path: Path | None, environ: dict[str, str]) -> str:
    with pytest.raises(ConfigError) as caught:
        load_settings(path, environ=environ)
    return str(caught.value)


async def test_repo_config_toml_loads_with_its_plugin_tables(tmp_path: Path) -> None:
    """The file ``make serve`` uses is valid, core keys and ``[plugins.*]`` tables alike."""
    environ = _var(tmp_path)
    settings = load_settings(ROOT / "config.toml", environ=environ)
    assert settings.service.bind == "127.0.0.1:8000"
    assert settings.plugins.enabled == [
        "auth", "keys", "projects", "webhooks", "marketplace", "billing", "chain", "console"]
    assert settings.embedded
    async with open_service(settings, migrate=False, environ=environ) as service:
        auth = service.plugin_settings("auth", AuthSettings)
        assert auth.siwe_chain_id == 56
        assert {"project.completed", "agent.published", "payment.received",
                "flow.balance.low"} <= set(service.event_types)


@pytest.mark.parametrize(("text", "named"), [
    ("[service]\nbindd = '127.0.0.1:1'\n", "service.bindd"),
    ("[servce]\nbind = '127.0.0.1:1'\n", "servce"),
    ("[service]\nworkers = 0\n", "service.workers"),
    ("[service]\nlog_level = 'loud'\n", "service.log_level"),
    ("[supervisor]\nmax_restarts = 'many'\n", "supervisor.max_restarts"),
    ("[service]\nbind = '8000'\n", "service.bind"),
    ("[service]\npublic_url = 'example.com'\n", "service.public_url"),
    ("[database]\nurl = 'mysql://db/flow'\n", "database.url"),
    ("[redis]\nurl = 'localhost:6379'\n", "redis.url"),
    ("[pricing]\n'/projects' = 'free'\n", "pricing./projects"),
])
def test_wrong_key_or_value_is_named(tmp_path: Path, text: str, named: str) -> None:
    message = _error(_toml(tmp_path, text), {**_var(tmp_path), **SECRETS})
    assert str(tmp_path / "config.toml") in message
    assert named in message


def test_unreadable_toml_is_a_config_error(tmp_path: Path) -> None:
    assert "cannot read" in _error(_toml(tmp_path, "[service\n"), _var(tmp_path))
    assert "cannot read" in _error(tmp_path / "missing.toml", _var(tmp_path))


def test_every_key_can_be_overridden_from_the_environment(tmp_path: Path) -> None:
    path = _toml(tmp_path, "[service]\nworkers = 2\n[database]\nurl = 'sqlite:///a.db'\n")
    settings = load_settings(path, environ={
        **_var(tmp_path),
        "FLOWSVC_DATABASE_URL": "postgresql://flow@db.internal/flow",
        "FLOWSVC_REDIS_URL": "redis://cache.internal:6379/1",
        "FLOWSVC_JWT_SECRET": "from-env-" + "s" * 32,
        "FLOWSVC_INTERNAL_TOKEN": "internal-from-env-" + "t" * 32,
        "FLOWSVC_SERVICE_WORKERS": "3",
        "FLOWSVC_SERVICE_COOKIE_SECURE": "false",
        "FLOWSVC_SERVICE_TRUSTED_PROXIES": '["10.0.0.0/8"]',
        "FLOWSVC_SUPERVISOR_BACKOFF_INITIAL_SECONDS": "0.5",
        "FLOWSVC_PRICING": '{"POST /projects": "1.25"}',
        "FLOWSVC_PLUGINS_ENABLED": '["auth", "hello"]',
    })
    assert settings.database.url == "postgresql://flow@db.internal/flow"
    assert settings.redis.url == "redis://cache.internal:6379/1"
    assert settings.jwt.secret == "from-env-" + "s" * 32
    assert settings.internal.token == "internal-from-env-" + "t" * 32
    assert settings.service.workers == 3
    assert settings.service.cookie_secure is False
    assert settings.service.trusted_proxies == ["10.0.0.0/8"]
    assert settings.supervisor.backoff_initial_seconds == 0.5
    assert str(settings.pricing["POST /projects"]) == "1.25"
    assert settings.plugins.enabled == ["auth", "hello"]
    assert not settings.embedded


def test_enabled_plugins_from_a_comma_list(tmp_path: Path) -> None:
    settings = load_settings(None, environ={**_var(tmp_path),
                                            "FLOWSVC_PLUGINS_ENABLED": " auth, hello ,"})
    assert settings.plugins.enabled == ["auth", "hello"]


def test_a_wrong_environment_value_is_named(tmp_path: Path) -> None:
    message = _error(None, {**_var(tmp_path), "FLOWSVC_SERVICE_WORKERS": "several"})
    assert "service.workers" in message
    message = _error(None, {**_var(tmp_path), "FLOWSVC_PRICING": "{not json"})
    assert "not valid JSON" in message


async def test_plugin_keys_come_from_their_table_and_the_environment(tmp_path: Path) -> None:
    path = _toml(tmp_path, "[plugins.auth]\nsiwe_chain_id = 97\nbot_token = 'from-file'\n")
    environ = {**_var(tmp_path), "FLOWSVC_PLUGINS_AUTH_BOT_TOKEN": "123:from-env"}
    settings = load_settings(path, environ=environ)
    async with open_service(settings, migrate=False, environ=environ) as service:
        auth = service.plugin_settings("auth", AuthSettings)
        assert auth.bot_token == "123:from-env"
        assert auth.siwe_chain_id == 97


@pytest.mark.parametrize(("text", "environ", "named"), [
    ("[plugins.auth]\nbot_tokn = 'x'\n", {}, "bot_tokn"),
    ("", {"FLOWSVC_PLUGINS_AUTH_SIWE_CHAIN_ID": "mainnet"}, "siwe_chain_id"),
    ("[plugins.bilingg]\nx = 1\n", {}, "[plugins.bilingg]"),
])
async def test_a_wrong_plugin_key_or_value_stops_the_start(
        tmp_path: Path, text: str, environ: dict[str, str], named: str) -> None:
    environ = {**_var(tmp_path), **environ}
    settings = load_settings(_toml(tmp_path, text), environ=environ)
    with pytest.raises(ConfigError) as caught:
        async with open_service(settings, migrate=False, environ=environ):
            pass
    assert named in str(caught.value)


def test_embedded_default_generates_secrets_once(tmp_path: Path) -> None:
    first = load_settings(None, environ=_var(tmp_path))
    assert first.embedded
    stored = tmp_path / "var" / "secrets.json"
    assert stat.S_IMODE(stored.stat().st_mode) == 0o600
    assert len(first.jwt.secret) >= 32 and len(first.internal.token) >= 32
    assert first.jwt.secret != first.internal.token
    assert json.loads(stored.read_text()) == {"jwt_secret": first.jwt.secret,
                                              "internal_token": first.internal.token}
    second = load_settings(None, environ=_var(tmp_path))
    assert (second.jwt.secret, second.internal.token) == (first.jwt.secret, first.internal.token)


def test_configured_secrets_are_kept_and_nothing_is_written(tmp_path: Path) -> None:
    settings = load_settings(None, environ={**_var(tmp_path), **SECRETS})
    assert settings.jwt.secret == SECRETS["FLOWSVC_JWT_SECRET"]
    assert not (tmp_path / "var" / "secrets.json").exists()


@pytest.mark.parametrize("environ", [
    {"FLOWSVC_DATABASE_URL": "postgresql://flow@db.internal/flow"},
    {"FLOWSVC_REDIS_URL": "redis://cache.internal:6379/0"},
])
def test_outside_the_embedded_default_a_missing_secret_is_an_error(
        tmp_path: Path, environ: dict[str, str]) -> None:
    message = _error(None, {**_var(tmp_path), **environ})
    assert "FLOWSVC_JWT_SECRET" in message and "FLOWSVC_INTERNAL_TOKEN" in message
    message = _error(None, {**_var(tmp_path), **environ,
                            "FLOWSVC_JWT_SECRET": SECRETS["FLOWSVC_JWT_SECRET"]})
    assert "FLOWSVC_INTERNAL_TOKEN" in message and "FLOWSVC_JWT_SECRET" not in message
    assert not (tmp_path / "var" / "secrets.json").exists()


def test_settings_are_frozen(tmp_path: Path) -> None:
    settings: Settings = load_settings(None, environ={**_var(tmp_path), **SECRETS})
    with pytest.raises(ValueError, match="frozen"):
        settings.service.workers = 9  # type: ignore[misc]


def test_commands_starting_at_once_agree_on_one_set_of_secrets(tmp_path: Path) -> None:
    barrier = threading.Barrier(8)

    def load() -> tuple[str, str]:
        barrier.wait()
        settings = load_settings(None, environ=_var(tmp_path))
        return settings.jwt.secret, settings.internal.token

    with ThreadPoolExecutor(8) as pool:
        results = set(pool.map(lambda _: load(), range(8)))
    assert len(results) == 1
    assert sorted(path.name for path in (tmp_path / "var").iterdir()) == ["secrets.json"]
