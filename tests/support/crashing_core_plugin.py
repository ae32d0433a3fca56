"""A test plugin whose actor starts, under the core's supervisor (as the projects hub starts
its broadcasters), an actor that crashes shortly after every start.

Enabled by its module path (``FLOWSVC_PLUGINS_ENABLED='["tests.support.crashing_core_plugin"]'``)
it makes the core's supervisor give up, which must stop the service cleanly with exit code 1.
"""

from __future__ import annotations

from typing import Any

import trio

from runtime.actors import ActorSpec, Mailbox
from runtime.hookspecs import hookimpl
from runtime.service import Service

ACTOR = "crashing.core_actor"
CRASH_AFTER_SECONDS = 0.2


@hookimpl
def flowsvc_actors(service: Service) -> list[ActorSpec]:
    async def crash(mailbox: Mailbox, *,
                    task_status: trio.TaskStatus[Any] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        # Crash after the start, not during it: a boot failure would fail the start instead.
        await trio.sleep(CRASH_AFTER_SECONDS)
        raise RuntimeError("crashing on purpose")

    async def starter(mailbox: Mailbox, *,
                      task_status: trio.TaskStatus[Any] = trio.TASK_STATUS_IGNORED) -> None:
        assert service.supervisor is not None
        await service.supervisor.start(ActorSpec(name=ACTOR, run=crash))
        task_status.started()
        await trio.sleep_forever()

    return [ActorSpec(name="crashing.starter", run=starter)]
