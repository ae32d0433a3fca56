"""The plugin manager factory: built-in names, entry points, module paths, validation."""

from __future__ import annotations

import secrets
import textwrap
from pathlib import Path

import pluggy
import pytest

from runtime.config import ConfigError
from runtime.plugins import BUILTIN, available_plugins, get_plugin_manager
from tests.support.keys import create_key, wait_for_calls
from tests.support.server import client, make_settings, running_server, settings_env
from tests.support.testkit_plugin import MODULE as TESTKIT
from tests.support.wallet import sign_in


def _plugin_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, source: str) -> str:
    """Write ``source`` as an importable module; returns its dotted path (unique per test)."""
    package = f"flowsvc_test_{secrets.token_hex(4)}"
    (tmp_path / package).mkdir()
    (tmp_path / package / "__init__.py").write_text("")
    (tmp_path / package / "hooks.py").write_text(textwrap.dedent(source))
    monkeypatch.syspath_prepend(str(tmp_path))
    return f"{package}.hooks"


def _module(manager: pluggy.PluginManager, name: str) -> str:
    plugin = manager.get_plugin(name)
    assert plugin is not None
    module: str = plugin.__name__
    return module


def test_an_unknown_plugin_is_named_with_the_available_ones() -> None:
    with pytest.raises(ConfigError) as caught:
        get_plugin_manager(["auth", "autth"])
    message = str(caught.value)
    assert "unknown plugin 'autth'" in message
    available = message.split("available: ", 1)[1].rstrip(")").split(", ")
    assert {"auth", "hello"} <= set(available)
    assert available == sorted(available)


def test_a_module_path_that_does_not_import_is_unknown() -> None:
    with pytest.raises(ConfigError, match="unknown plugin 'no_such_package.hooks'"):
        get_plugin_manager(["no_such_package.hooks"])


def test_a_plugin_listed_twice_is_refused() -> None:
    with pytest.raises(ConfigError, match="'auth' is listed twice"):
        get_plugin_manager(["auth", "auth"])


def test_builtin_plugins_are_ordinary_plugins_after_the_essential_core() -> None:
    manager = get_plugin_manager(["auth", TESTKIT])
    assert [name for name, _ in manager.list_name_plugin()] == ["core", "auth", TESTKIT]
    assert _module(manager, "auth") == BUILTIN["auth"]
    assert _module(manager, "core") == "runtime.core_hooks"
    assert available_plugins()["auth"] == "plugins.auth.hooks"


def test_every_call_builds_a_fresh_manager() -> None:
    with_auth = get_plugin_manager(["auth"])
    without = get_plugin_manager([])
    assert with_auth is not without
    assert with_auth.has_plugin("auth") and not without.has_plugin("auth")
    assert [name for name, _ in without.list_name_plugin()] == ["core"]
    # Hooks of one manager do not leak into the other.
    assert len(with_auth.hook.flowsvc_migrations()) == 2
    assert len(without.hook.flowsvc_migrations()) == 1


def test_the_example_plugin_is_found_through_its_entry_point() -> None:
    assert available_plugins()["hello"] == "flowsvc_hello.hooks"
    manager = get_plugin_manager(["hello", "keys"])
    plugin = manager.get_plugin("hello")
    assert _module(manager, "hello") == "flowsvc_hello.hooks"
    assert {caller.name for caller in manager.get_hookcallers(plugin) or []} == {
        "flowsvc_plugin_config", "flowsvc_requires", "flowsvc_actors", "flowsvc_blueprints"}


def test_check_pending_catches_a_hookimpl_that_matches_no_spec(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    module = _plugin_module(tmp_path, monkeypatch, """
        from runtime.hookspecs import hookimpl

        @hookimpl
        def flowsvc_blueprint(service):  # misspelt: the spec is flowsvc_blueprints
            return []
        """)
    with pytest.raises(pluggy.PluginValidationError, match="flowsvc_blueprint"):
        get_plugin_manager([module])


def test_a_hookimpl_with_an_unknown_argument_is_refused(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    module = _plugin_module(tmp_path, monkeypatch, """
        from runtime.hookspecs import hookimpl

        @hookimpl
        def flowsvc_actors(service, nursery):
            return []
        """)
    with pytest.raises(pluggy.PluginValidationError, match="nursery"):
        get_plugin_manager([module])


def test_a_plugin_module_path_is_loaded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    module = _plugin_module(tmp_path, monkeypatch, """
        from runtime.events import EventType
        from runtime.hookspecs import hookimpl

        @hookimpl
        def flowsvc_webhook_events():
            return [EventType("audit.noted", "An audit note was written.")]
        """)
    manager = get_plugin_manager([module])
    assert _module(manager, module) == module
    declared = [event.name for events in manager.hook.flowsvc_webhook_events() for event in events]
    assert declared == ["audit.noted"]


async def test_the_example_plugin_serves_its_route_and_its_actor_counts(tmp_path: Path) -> None:
    env = settings_env(tmp_path / "var", database_url=f"sqlite:///{tmp_path / 'flowsvc.db'}",
                       plugins=["auth", "keys", "hello"],
                       extra={"FLOWSVC_PLUGINS_HELLO_GREETING": "hi"})
    async with running_server(make_settings(env), env) as running, client(running) as http:
        assert running.service.supervisor is not None
        actors = running.service.supervisor.running()  # started in plugin order
        assert actors[0] == "core.housekeeper" and actors[-1] == "hello.counter"
        first = await http.get("/hello/ada")
        assert first.status_code == 200
        assert first.json() == {"message": "hi, ada", "count": 1}
        second = await http.get("/hello/grace")
        assert second.json() == {"message": "hi, grace", "count": 2}


def test_a_required_plugin_that_is_not_enabled_stops_the_start() -> None:
    with pytest.raises(ConfigError) as caught:
        get_plugin_manager(["auth", "marketplace"])
    assert "plugin 'marketplace' requires 'projects', which is not enabled" in str(caught.value)


def test_plugins_are_registered_after_the_plugins_they_require() -> None:
    manager = get_plugin_manager(["marketplace", "auth", "keys", "projects", "chain"])
    names = [name for name, _ in manager.list_name_plugin()]
    assert names == ["core", "chain", "projects", "keys", "marketplace", "auth"]


def test_a_circle_of_requirements_is_refused(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A module enabled by its path is registered under that path, its __name__.
    selfish = _plugin_module(tmp_path, monkeypatch, """
        def flowsvc_requires():
            return ["auth", __name__]
        """)
    with pytest.raises(ConfigError, match=f"in a circle: {selfish} -> {selfish}"):
        get_plugin_manager(["auth", selfish])


async def test_a_contract_nobody_provides_answers_503(tmp_path: Path, database_url: str) -> None:
    from runtime.contracts.runs import AGENT_RUNS
    from runtime.errors import Unavailable

    env = settings_env(tmp_path / "var", database_url=database_url, plugins=["auth"])
    async with running_server(make_settings(env), env) as running:
        with pytest.raises(Unavailable, match="no enabled plugin provides agent runs"):
            running.service.contract(AGENT_RUNS)


async def test_the_example_plugin_charges_a_key_through_the_meter_contract(tmp_path: Path) -> None:
    env = settings_env(tmp_path / "var", database_url=f"sqlite:///{tmp_path / 'flowsvc.db'}",
                       plugins=["auth", "keys", "hello"])
    async with running_server(make_settings(env), env) as running, client(running) as http:
        await sign_in(http)
        key = await create_key(http, spend_limit_flow="0.02", spend_period="day")
        with_key = {"x-api-key": key["raw_key"]}
        tips = [await http.post("/hello/ada/tip", headers=with_key) for _ in range(3)]
        assert [tip.status_code for tip in tips] == [200, 200, 402]
        assert tips[1].json() == {"tipped": "ada", "chargedFlow": "0.010000",
                                  "periodUsedFlow": "0.020000"}
        assert tips[2].json()["error"]["code"] == "spend_cap_reached"
        calls = await wait_for_calls(http, key["id"], 5)
        assert sum(call.get("model") == "hello:ada" for call in calls) == 2
        without_key = await http.post("/hello/ada/tip")  # the session alone
        assert without_key.status_code == 401
