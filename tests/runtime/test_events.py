"""Account events: the catalogue, and emitting inside the transaction of their cause.

The test plugin's ``flowsvc_event_emitted`` hook writes a user named ``event:<id>`` on the
emitter's connection, so what the hook writes is visible (or not) in the database.
"""

from __future__ import annotations

import json
import re
import secrets
import textwrap
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from sqlalchemy import Connection, select

from runtime.bootstrap import open_service
from runtime.config import ConfigError
from runtime.events import OutboundEvent
from runtime.service import Service
from runtime.users import users
from tests.support.events import emit_now
from tests.support.server import make_settings, settings_env
from tests.support.testkit_plugin import EVENT
from tests.support.testkit_plugin import MODULE as TESTKIT


def _env(tmp_path: Path, database_url: str, plugins: list[str]) -> dict[str, str]:
    return settings_env(tmp_path / "var", database_url=database_url,
                        extra={"FLOWSVC_PLUGINS_ENABLED": json.dumps(plugins)})


@pytest.fixture
async def service(tmp_path: Path, database_url: str) -> AsyncIterator[Service]:
    env = _env(tmp_path, database_url, ["auth", TESTKIT])
    async with open_service(make_settings(env), migrate=True, environ=env) as opened:
        yield opened


def _event_users(connection: Connection) -> list[str]:
    return sorted(connection.execute(
        select(users.c.display_name).where(users.c.display_name.like("event:%"))).scalars())


async def test_the_catalogue_has_the_declared_events(service: Service) -> None:
    assert service.event_types[EVENT].description.startswith("A test event")


async def test_an_event_is_written_in_the_transaction_of_its_cause(service: Service) -> None:
    def cause(connection: Connection) -> OutboundEvent:
        return service.emit_event(connection, user_id=7, name=EVENT, data={"amount": "1.500000"})

    event = await service.db.write(cause)
    assert re.fullmatch(r"evt_[0-9a-f]{32}", event.id)
    assert (event.name, event.user_id, dict(event.data)) == (EVENT, 7, {"amount": "1.500000"})
    assert event.created_at.tzinfo is UTC
    assert abs((datetime.now(UTC) - event.created_at).total_seconds()) < 60
    assert await service.db.read(_event_users) == [f"event:{event.id}"]


async def test_an_event_rolls_back_with_its_cause(service: Service) -> None:
    emitted: list[OutboundEvent] = []

    def cause_then_fail(connection: Connection) -> None:
        emitted.append(service.emit_event(connection, user_id=7, name=EVENT, data={}))
        raise RuntimeError("the cause fails after the event")

    with pytest.raises(RuntimeError):
        await service.db.write(cause_then_fail)
    assert len(emitted) == 1  # the hook ran ...
    assert await service.db.read(_event_users) == []  # ... and its write rolled back


async def test_an_undeclared_event_is_a_programming_error(service: Service) -> None:
    with pytest.raises(ValueError, match="'nobody.declared' is not declared"):
        await service.db.write(lambda connection: service.emit_event(
            connection, user_id=1, name="nobody.declared", data={}))
    assert await service.db.read(_event_users) == []


async def test_emit_event_now_is_durable_when_it_returns(service: Service) -> None:
    event = await emit_now(service, user_id=3, name=EVENT, data={"n": 1})
    assert await service.db.read(_event_users) == [f"event:{event.id}"]
    second = await emit_now(service, user_id=3, name=EVENT, data={"n": 2})
    assert second.id != event.id


async def test_an_event_name_declared_twice_stops_the_start(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    package = f"flowsvc_test_{secrets.token_hex(4)}"
    (tmp_path / package).mkdir()
    (tmp_path / package / "__init__.py").write_text("")
    (tmp_path / package / "hooks.py").write_text(textwrap.dedent(f"""
        from runtime.events import EventType
        from runtime.hookspecs import hookimpl

        @hookimpl
        def flowsvc_webhook_events():
            return [EventType({EVENT!r}, "The same name again.")]
        """))
    monkeypatch.syspath_prepend(str(tmp_path))
    env = _env(tmp_path, f"sqlite:///{tmp_path / 'flowsvc.db'}", [TESTKIT, f"{package}.hooks"])
    with pytest.raises(ConfigError, match=f"two plugins declare the webhook event '{EVENT}'"):
        async with open_service(make_settings(env), migrate=False, environ=env):
            pass
