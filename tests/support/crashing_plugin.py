"""A test plugin whose one actor crashes shortly after every start.

Enabled by its module path (``FLOWSVC_PLUGINS_ENABLED='["tests.support.crashing_plugin"]'``)
it makes the supervisor of its part give up: the part goes down and is retried later, while
the service goes on serving.
"""

from __future__ import annotations

from typing import Any

import trio

from runtime.actors import ActorSpec, Mailbox
from runtime.hookspecs import hookimpl
from runtime.service import Service

ACTOR = "crashing.actor"
CRASH_AFTER_SECONDS = 0.2


@hookimpl
def flowsvc_actors(service: Service) -> list[ActorSpec]:
    async def run(mailbox: Mailbox, *,
                  task_status: trio.TaskStatus[Any] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        # Crash after the start, not during it: a boot failure would fail the start instead.
        await trio.sleep(CRASH_AFTER_SECONDS)
        raise RuntimeError("crashing on purpose")

    return [ActorSpec(name=ACTOR, run=run)]
