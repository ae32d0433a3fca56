"""The ``marketplace.scheduler`` actor: settles subscriptions and prunes ranking history.

Every ``scheduler_interval_seconds`` it renews or ends the subscriptions whose period is
over (``subscriptions.settle_due``) and deletes ranking history no listing cursor can
still use (older than ``cursor_ttl_seconds`` plus a minute of margin). A database or Redis outage is
waited out with backoff (``runtime.backoff``), so the pass runs seconds after the
dependency returns; a pass that fails for any other reason is logged with its traceback
and tried again at the next interval. It takes no messages: nothing but its clock drives
it.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import trio

from plugins.marketplace.ranking import now_us, prune
from plugins.marketplace.settings import MarketplaceSettings
from plugins.marketplace.state import MARKETPLACE
from plugins.marketplace.subscriptions import settle_due
from runtime.actors import ActorSpec, Mailbox
from runtime.backoff import until_available

if TYPE_CHECKING:
    from runtime.service import Service

log = logging.getLogger("flowsvc.marketplace")
SCHEDULER_ACTOR = "marketplace.scheduler"
PRUNE_MARGIN_SECONDS = 60


async def run_pass(service: Service, settings: MarketplaceSettings) -> None:
    """One pass: settle due subscriptions, prune expired ranking history."""
    report = await settle_due(service)
    if report["renewed"] or report["ended"]:
        log.info("subscriptions renewed=%d ended=%d", report["renewed"], report["ended"])
    horizon = now_us() - (settings.cursor_ttl_seconds + PRUNE_MARGIN_SECONDS) * 1_000_000
    pruned = await service.db.write(prune, horizon)
    if pruned:
        log.info("pruned %d ranking history rows", pruned)


def scheduler_actor(service: Service) -> ActorSpec:
    """The ``marketplace.scheduler`` actor: a pass at start, then every interval."""
    settings = service.state(MARKETPLACE).settings

    async def run(mailbox: Mailbox, *,
                  task_status: trio.TaskStatus[Any] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        while True:
            try:
                await until_available(lambda: run_pass(service, settings),
                                      what="the marketplace scheduler pass", log=log)
            except Exception:  # a bug in one pass must not stop settling for good
                log.exception("marketplace scheduler pass failed")
            await trio.sleep(settings.scheduler_interval_seconds)

    return ActorSpec(name=SCHEDULER_ACTOR, run=run)
