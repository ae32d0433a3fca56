"""The ``flowsvc`` command: migrate, plugins, plugin commands and configuration errors.

``runtime.cli.main`` runs in this process (it reads ``os.environ``, set per test), in a
worker thread when the test itself runs in Trio; ``test_server`` covers ``serve`` as a
real process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import trio
from sqlalchemy import create_engine, inspect

from runtime.cli import main
from runtime.sandbox.jail import cgroups_state
from runtime.storage import normalize_url
from tests.support.server import client, free_port, make_settings, running_server, settings_env
from tests.support.testkit_plugin import MODULE as TESTKIT


@pytest.fixture
def cli_env(tmp_path: Path, database_url: str, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """The environment of the command, set in ``os.environ``; no ./config.toml is read."""
    env = settings_env(tmp_path / "var", database_url=database_url, plugins=["auth", TESTKIT],
                       extra={"FLOWSVC_LIMITS_ANONYMOUS_RPM": "0"})
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.chdir(tmp_path)
    return env


def _tables(database_url: str) -> set[str]:
    engine = create_engine(normalize_url(database_url))
    try:
        return set(inspect(engine).get_table_names())
    finally:
        engine.dispose()


def test_migrate_creates_the_tables_of_every_enabled_plugin(
        cli_env: dict[str, str], database_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["migrate"]) == 0
    assert capsys.readouterr().out == "migrations applied\n"
    tables = _tables(database_url)
    assert {"alembic_version", "users", "idempotency_keys", "auth_nonces", "auth_sessions",
            "auth_access_codes"} <= tables
    assert main(["migrate"]) == 0  # again: nothing to do, nothing fails
    assert _tables(database_url) == tables


def test_doctor_says_what_the_sandbox_offers(cli_env: dict[str, str],
                                             capsys: pytest.CaptureFixture[str],
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    assert main(["doctor"]) == 0
    assert capsys.readouterr().out == ("sandbox commands: available\n"
                                       "sandbox browser: available\n"
                                       f"sandbox cgroups: {cgroups_state()}\n")
    monkeypatch.setenv("FLOWSVC_SANDBOX_ACTIVE", "false")
    assert main(["doctor"]) == 1
    reason = "turned off by [sandbox] active = false"
    assert capsys.readouterr().out == (f"sandbox commands: {reason}\n"
                                       f"sandbox browser: {reason}\n"
                                       f"sandbox cgroups: {cgroups_state()}\n")


def test_plugins_lists_hooks_actors_and_routes(cli_env: dict[str, str],
                                               capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plugins"]) == 0
    sections: dict[str, list[str]] = {}
    for line in capsys.readouterr().out.splitlines():
        if not line.startswith(" "):
            name = line.split(":", 1)[0]
            sections[name] = []
        else:
            sections[name].append(line.strip())
    assert list(sections) == ["core", "auth", TESTKIT]
    core, auth, testkit = sections["core"], sections["auth"], sections[TESTKIT]
    assert "actors: core.housekeeper, core.log_flusher, core.retention" in core
    assert any(line.startswith("hooks: ") and "flowsvc_migrations" in line for line in core)
    auth_hooks = next(line for line in auth if line.startswith("hooks: "))
    assert {"flowsvc_blueprints", "flowsvc_actors", "flowsvc_commands",
            "flowsvc_authenticate"} <= set(auth_hooks.removeprefix("hooks: ").split(", "))
    assert "routes (auth):" in auth
    assert {"POST /auth/nonce", "POST /auth/verify", "POST /auth/access-code",
            "GET /me"} <= set(auth)
    assert "actors: testkit.flaky" in testkit
    assert "GET /testkit/pid" in testkit


async def test_access_codes_create_prints_codes_that_work_once_each(
        cli_env: dict[str, str], capsys: pytest.CaptureFixture[str]) -> None:
    code = await trio.to_thread.run_sync(main, ["access-codes", "create", "--count", "3"])
    assert code == 0
    codes = capsys.readouterr().out.split()
    assert len(codes) == len(set(codes)) == 3
    async with running_server(make_settings(cli_env), cli_env) as running, \
            client(running) as http:
        for access_code in codes:
            signed_in = await http.post("/auth/access-code", json={"code": access_code})
            assert signed_in.status_code == 200, signed_in.text
            assert "svc_session" in signed_in.cookies
            again = await http.post("/auth/access-code", json={"code": access_code})
            assert again.status_code == 401
            assert again.json()["error"]["code"] == "code_invalid"


@pytest.mark.parametrize(("environ", "named"), [
    ({"FLOWSVC_SERVICE_WORKERS": "0"}, "service.workers"),
    ({"FLOWSVC_PLUGINS_ENABLED": json.dumps(["auth", "authh"])}, "unknown plugin 'authh'"),
    ({"FLOWSVC_PLUGINS_AUTH_SIWE_CHAIN_ID": "mainnet"}, "siwe_chain_id"),
    ({"FLOWSVC_SERVICE_BND": "127.0.0.1:9"}, "unknown environment variable: FLOWSVC_SERVICE_BND"),
    ({"FLOWSVC_PLUGINS_AUTH_BOT_TOKN": "x", "FLOWSVC_JWTT_SECRET": "y"},
     "unknown environment variables: FLOWSVC_JWTT_SECRET, FLOWSVC_PLUGINS_AUTH_BOT_TOKN"),
])
def test_a_configuration_error_is_one_line_naming_it_and_exit_code_2(
        cli_env: dict[str, str], monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str], environ: dict[str, str], named: str) -> None:
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    assert main(["migrate"]) == 2
    captured = capsys.readouterr()
    assert captured.err.startswith("flowsvc: ")
    assert named in captured.err
    assert "Traceback" not in captured.err
    assert captured.out == ""


def test_config_option_reads_that_file(cli_env: dict[str, str], tmp_path: Path,
                                       monkeypatch: pytest.MonkeyPatch,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.delenv("FLOWSVC_PLUGINS_ENABLED")
    config = tmp_path / "custom.toml"
    config.write_text("[plugins]\nenabled = []\n[service]\nworkerz = 2\n")
    assert main(["--config", str(config), "plugins"]) == 2
    assert "service.workerz" in capsys.readouterr().err
    config.write_text("[plugins]\nenabled = []\n")
    assert main(["--config", str(config), "plugins"]) == 0
    assert [line for line in capsys.readouterr().out.splitlines()
            if not line.startswith(" ")] == ["core: runtime.core_hooks"]


def test_config_option_after_the_sub_command_and_from_the_environment(
        cli_env: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.delenv("FLOWSVC_PLUGINS_ENABLED")
    config = tmp_path / "elsewhere.toml"
    config.write_text("[plugins]\nenabled = []\n")
    assert main(["plugins", "--config", str(config)]) == 0
    assert "auth:" not in capsys.readouterr().out
    monkeypatch.setenv("FLOWSVC_CONFIG", str(config))
    assert main(["plugins"]) == 0
    assert "auth:" not in capsys.readouterr().out


def test_without_any_config_every_builtin_plugin_command_is_listed(
        cli_env: dict[str, str], monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.delenv("FLOWSVC_PLUGINS_ENABLED")  # and cwd holds no config.toml
    with pytest.raises(SystemExit) as exited:
        main(["--help"])
    assert exited.value.code == 0
    assert "access-codes" in capsys.readouterr().out


def test_short_secrets_are_refused_outside_the_embedded_default(
        cli_env: dict[str, str], monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("FLOWSVC_REDIS_URL", "redis://127.0.0.1:1/0")  # not embedded now
    monkeypatch.setenv("FLOWSVC_JWT_SECRET", "x")
    assert main(["migrate"]) == 2
    assert "FLOWSVC_JWT_SECRET must be at least 32 bytes" in capsys.readouterr().err


def test_an_unreachable_redis_names_the_cause(cli_env: dict[str, str],
                                              monkeypatch: pytest.MonkeyPatch,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("FLOWSVC_REDIS_URL", f"redis://127.0.0.1:{free_port()}/0")
    assert main(["migrate"]) == 2
    error = capsys.readouterr().err
    assert "cannot reach Redis at 127.0.0.1:" in error
    assert "ConnectionRefusedError" in error and "ExceptionGroup" not in error


# What `flowsvc --help` must not load: the web, database, Redis and chain stacks make it take
# seconds (issue 14 asks for under one). Checked as imports, not as a time: a time swings with
# the machine's load, the set of imported modules does not.
REPOSITORY = Path(__file__).resolve().parents[2]
HEAVY_PACKAGES = ("quart", "hypercorn", "sqlalchemy", "psycopg", "coredis", "redis", "httpx",
                  "jwt", "eth_account", "eth_abi", "web3")


def test_help_lists_every_plugin_command_without_loading_the_web_or_database_stack(
        tmp_path: Path) -> None:
    script = ("import sys\n"
              "from runtime.cli import main\n"
              "try:\n"
              "    main(['--help'])\n"
              "except SystemExit:\n"
              "    pass\n"
              f"print('LOADED', sorted(name for name in {HEAVY_PACKAGES!r} "
              "if name in sys.modules))\n")
    finished = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True,
                              text=True, timeout=120,
                              env={"PATH": os.environ["PATH"], "PYTHONPATH": str(REPOSITORY)})
    assert finished.returncode == 0, finished.stderr
    for command in ("serve", "migrate", "plugins", "tokens", "access-codes", "dev-wallet"):
        assert command in finished.stdout
    assert "LOADED []" in finished.stdout
