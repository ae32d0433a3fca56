"""A test plugin for the core's tests: routes that wait, sleep, fail or tell their pid.

Enabled by its module path next to the real plugins
(``plugins=["auth", "tests.support.testkit_plugin"]``). It declares one webhook event
whose ``flowsvc_event_emitted`` hook writes a user row in the emitter's transaction, so
tests can see that the hook's writes commit or roll back with their cause.

Routes (state is per service, kept in the blueprint's closure):

- ``POST /testkit/slow``: counts itself as entered, then waits for ``POST /testkit/release``.
- ``POST /testkit/sleep?seconds=S``: in flight for ``S`` seconds (shutdown tests).
- ``GET /testkit/state``: ``{"entered", "inflight"}``.
- ``GET /testkit/wait?entered=N`` (or ``inflight=N``): answers once the count reaches ``N``.
- ``POST /testkit/boom``: raises an unexpected exception carrying ``SECRET_DETAIL``.
- ``POST /testkit/crash``: asks the ``testkit.flaky`` actor to crash while answering.
- ``GET /testkit/pid``: the serving process id.
"""

from __future__ import annotations

import os
from typing import Any

import trio
from quart import Blueprint, Response, request
from sqlalchemy import Connection, insert

from runtime.actors import ActorSpec, Mailbox
from runtime.events import EventType, OutboundEvent
from runtime.hookspecs import hookimpl
from runtime.http import json_response
from runtime.service import Service
from runtime.users import users
from runtime.wire import utcnow

MODULE = "tests.support.testkit_plugin"
FLAKY = "testkit.flaky"
EVENT = "testkit.happened"
SECRET_DETAIL = "testkit-secret-detail-that-must-not-leak"
SLOW_LIMIT_SECONDS = 20


@hookimpl
def flowsvc_webhook_events() -> list[EventType]:
    return [EventType(EVENT, "A test event; its hook writes a user named after it.")]


@hookimpl
def flowsvc_event_emitted(service: Service, connection: Connection, event: OutboundEvent) -> None:
    if event.name == EVENT:
        connection.execute(insert(users).values(display_name=f"event:{event.id}",
                                                created_at=utcnow()))


@hookimpl
def flowsvc_actors(service: Service) -> list[ActorSpec]:
    async def flaky(mailbox: Mailbox, *,
                    task_status: trio.TaskStatus[Any] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        async for envelope in mailbox:
            if envelope.message == "crash":
                raise RuntimeError("testkit.flaky crashes on purpose")
            envelope.reply(envelope.message)

    return [ActorSpec(name=FLAKY, run=flaky)]


@hookimpl
def flowsvc_blueprints(service: Service) -> list[Blueprint]:
    blueprint = Blueprint("testkit", __name__)
    released = trio.Event()
    state = {"entered": 0, "inflight": 0}
    changed = [trio.Event()]  # replaced on every change of ``state``

    def count(name: str, step: int) -> None:
        state[name] += step
        changed[0].set()
        changed[0] = trio.Event()

    @blueprint.post("/testkit/slow")
    async def slow() -> Response:
        count("entered", 1)
        with trio.fail_after(SLOW_LIMIT_SECONDS):
            await released.wait()
        return json_response({"entered": state["entered"]}, 201)

    @blueprint.post("/testkit/release")
    async def release() -> Response:
        released.set()
        return json_response({"released": True})

    @blueprint.post("/testkit/sleep")
    async def sleep() -> Response:
        seconds = float(request.args.get("seconds", "1"))
        count("inflight", 1)
        try:
            await trio.sleep(seconds)
        finally:
            count("inflight", -1)
        return json_response({"slept": seconds})

    @blueprint.get("/testkit/state")
    async def get_state() -> Response:
        return json_response(state)

    @blueprint.get("/testkit/wait")
    async def wait() -> Response:
        wanted = {name: int(value) for name, value in request.args.items()}
        with trio.fail_after(SLOW_LIMIT_SECONDS):
            while any(state[name] < value for name, value in wanted.items()):
                await changed[0].wait()
        return json_response(state)

    @blueprint.post("/testkit/boom")
    async def boom() -> Response:
        raise RuntimeError(SECRET_DETAIL)

    @blueprint.post("/testkit/crash")
    async def crash() -> Response:
        answer = await service.registry.lookup(FLAKY).call("crash", timeout=10)
        return json_response({"answer": answer})

    @blueprint.get("/testkit/pid")
    async def pid() -> Response:
        return json_response({"pid": os.getpid()})

    return [blueprint]
