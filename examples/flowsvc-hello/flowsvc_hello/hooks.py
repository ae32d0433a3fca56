"""Hook implementations of the example plugin.

It shows the three things most plugins do: settings (``[plugins.hello] greeting``), an
actor that owns state (``hello.counter``, reached by address with a typed message) and
routes. ``POST /hello/<name>/tip`` also uses a contract of another plugin: it charges the
caller's API key through the keys plugin's meter (``runtime.contracts.meter``), so the
plugin names ``keys`` in ``flowsvc_requires``.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from typing import Any

import trio
from quart import Blueprint, Response

from runtime.actors import ActorSpec, Mailbox, Request, serve_mailbox
from runtime.config import Section
from runtime.context import require_user
from runtime.contracts.meter import METER_ACTOR, Charge
from runtime.errors import Unauthenticated
from runtime.hookspecs import hookimpl
from runtime.hooktypes import PluginConfig
from runtime.http import current_service, json_response
from runtime.service import Service
from runtime.wire import format_flow

COUNTER = "hello.counter"
TIP_MICRO_FLOW = 10_000  # 0.01 FLOW


class HelloSettings(Section):
    greeting: str = "hello"


@dataclass(frozen=True)
class Greet(Request[int]):
    """Message to ``hello.counter``: count one greeting; the reply is the count so far."""

    name: str


@hookimpl
def flowsvc_plugin_config() -> PluginConfig:
    return PluginConfig("hello", HelloSettings)


@hookimpl
def flowsvc_requires() -> list[str]:
    return ["keys"]


@hookimpl
def flowsvc_actors(service: Service) -> list[ActorSpec]:
    async def counter(mailbox: Mailbox, *,
                      task_status: trio.TaskStatus[Any] = trio.TASK_STATUS_IGNORED) -> None:
        greeted = 0

        async def handle(message: object) -> int:
            nonlocal greeted
            if not isinstance(message, Greet):
                raise TypeError(f"{COUNTER} does not understand {message!r}")
            greeted += 1
            return greeted

        task_status.started()
        await serve_mailbox(mailbox, handle)

    return [ActorSpec(name=COUNTER, run=counter)]


blueprint = Blueprint("hello", __name__)


@blueprint.get("/hello/<name>")
async def hello(name: str) -> Response:
    """Greet ``name`` and say how many greetings this process has made."""
    service = current_service()
    greeting = service.plugin_settings("hello", HelloSettings).greeting
    count = await service.registry.lookup(COUNTER).call(Greet(name))
    return json_response({"message": f"{greeting}, {name}", "count": count})


@blueprint.post("/hello/<name>/tip")
async def tip(name: str) -> Response:
    """Tip ``name`` 0.01 FLOW, charged to the caller's API key (402 past its spend cap)."""
    principal = require_user()
    if principal.key_id is None:
        raise Unauthenticated("tips are charged to an API key: call with x-api-key")
    # Each tip request is a new tip: a token of its own (a retry of this call, if it made
    # one, would reuse it so as to charge once).
    charged = await current_service().registry.lookup(METER_ACTOR).call(
        Charge(key_id=principal.key_id, micro_flow=TIP_MICRO_FLOW, model=f"hello:{name}"[:64],
               token=f"hello-tip:{secrets.token_hex(16)}"))
    return json_response({"tipped": name, "chargedFlow": format_flow(charged.micro_flow),
                          "periodUsedFlow": format_flow(charged.period_used)})


@hookimpl
def flowsvc_blueprints(service: Service) -> list[Blueprint]:
    return [blueprint]
