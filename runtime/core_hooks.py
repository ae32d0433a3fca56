"""The core's own hook implementations, registered before any plugin and never disabled.

They give the core tables and migrations, authenticate internal callers, price routes
from ``[pricing]``, run the housekeeping actor that purges expired idempotency keys and the
one that writes batched log lines (``runtime.logs``), and the retention actor that keeps
the plugins' append-only tables (``runtime.retention``). Like a plugin's hooks, this module
imports at its top only what the request hooks need, so that ``flowsvc --help`` loads no
database or web stack.
"""

from __future__ import annotations

import hmac
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

import trio

from runtime.hookspecs import hookimpl
from runtime.logs import FLUSH_SECONDS, flush_logs
from runtime.principal import Credentials, Principal
from runtime.wire import MICRO

if TYPE_CHECKING:
    from sqlalchemy import MetaData

    from runtime.actors import ActorSpec, Mailbox
    from runtime.service import Service

log = logging.getLogger("flowsvc.core")
PURGE_INTERVAL_SECONDS = 3600.0


@hookimpl
def flowsvc_tables() -> MetaData:
    from runtime.users import metadata

    return metadata


@hookimpl
def flowsvc_migrations() -> Path:
    return Path(__file__).parent / "migrations" / "versions"


@hookimpl
def flowsvc_authenticate(service: Service, credentials: Credentials) -> Principal | None:
    """Internal callers send ``Authorization: Bearer <internal.token>``."""
    token = service.settings.internal.token
    if credentials.api_key is None and credentials.bearer is not None and \
            hmac.compare_digest(credentials.bearer.encode(), token.encode()):
        return Principal(user_id=0, address=None, via="internal")
    return None


@hookimpl
def flowsvc_request_cost(service: Service, route: str, method: str) -> int | None:
    """``[pricing]`` maps ``"METHOD /route/<template>"`` or ``"/route/<template>"`` to FLOW."""
    pricing = service.settings.pricing
    price = pricing.get(f"{method} {route}", pricing.get(route))
    return None if price is None else int(price * MICRO)


@hookimpl
def flowsvc_actors(service: Service) -> list[ActorSpec]:
    from runtime.actors import ActorSpec
    from runtime.backoff import until_available
    from runtime.idempotency import purge_expired
    from runtime.retention import retention_actor

    async def housekeeper(mailbox: Mailbox, *,
                          task_status: trio.TaskStatus[Any] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        while True:
            purged = await until_available(lambda: service.db.write(purge_expired),
                                           what="purging expired idempotency keys", log=log)
            if purged:
                log.info("purged %d expired idempotency keys", purged)
            await trio.sleep(PURGE_INTERVAL_SECONDS)

    async def log_flusher(mailbox: Mailbox, *,
                          task_status: trio.TaskStatus[Any] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        try:
            while True:
                await trio.sleep(FLUSH_SECONDS)
                flush_logs()
        finally:
            flush_logs()

    retained = [table for tables in service.pm.hook.flowsvc_retained_tables(service=service)
                for table in tables or []]
    retention = service.settings.retention
    return [ActorSpec(name="core.housekeeper", run=housekeeper),
            ActorSpec(name="core.log_flusher", run=log_flusher),
            retention_actor(service.db, retained, check_seconds=retention.check_seconds,
                            ahead=retention.partitions_ahead)]
