"""Hook implementations of the example plugin."""

from __future__ import annotations

from typing import Any

import trio
from quart import Blueprint, Response

from runtime.actors import ActorSpec, Mailbox, serve_mailbox
from runtime.config import Section
from runtime.hookspecs import hookimpl
from runtime.http import json_response
from runtime.service import PluginConfig, Service

COUNTER = "hello.counter"


class HelloSettings(Section):
    greeting: str = "hello"


@hookimpl
def flowsvc_plugin_config() -> PluginConfig:
    return PluginConfig("hello", HelloSettings)


@hookimpl
def flowsvc_actors(service: Service) -> list[ActorSpec]:
    async def counter(mailbox: Mailbox, *,
                      task_status: trio.TaskStatus[Any] = trio.TASK_STATUS_IGNORED) -> None:
        greeted = 0

        async def handle(name: str) -> int:
            nonlocal greeted
            greeted += 1
            return greeted

        task_status.started()
        await serve_mailbox(mailbox, handle)

    return [ActorSpec(name=COUNTER, run=counter)]


@hookimpl
def flowsvc_blueprints(service: Service) -> list[Blueprint]:
    blueprint = Blueprint("hello", __name__)
    greeting = service.plugin_settings("hello", HelloSettings).greeting

    @blueprint.get("/hello/<name>")
    async def hello(name: str) -> Response:
        count = await service.registry.lookup(COUNTER).call(name)
        return json_response({"message": f"{greeting}, {name}", "count": count})

    return [blueprint]
