"""Keeping a process-local view in step with changes made in every service process.

Several actors keep a view of database rows in memory (revoked sessions, cached API
keys) that any process may change. They all follow the same recipe, written once here:

- **listen** on a fan-out channel of the shared state; every process publishes a short
  message there after it commits a change, so the others hear of it within milliseconds;
- **resync** the whole view after every (re)subscription, because messages published
  while nobody listened are lost;
- **poll** the database every ``poll_seconds`` for recent changes, the safety net for a
  message lost anyway;
- **serve the mailbox** for changes made in this very process.

An outage of the database or Redis (``runtime.errors.is_outage``) never crashes the
actor: the listener resubscribes and resyncs with backoff, a failed poll is retried at
the next interval, and the view says it is not ready until its first resync. Any other
exception is a bug and crashes the actor, for the supervisor to restart.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import trio

from runtime.actors import Handler, Mailbox, serve_mailbox
from runtime.backoff import Backoff, outage_cause
from runtime.errors import is_outage
from runtime.shared import SharedState

log = logging.getLogger("flowsvc.follow")


@dataclass(frozen=True)
class ChangeFeed:
    """How one view follows changes.

    :param name: for log lines (the actor's name).
    :param channel: the shared-state fan-out channel changes are announced on.
    :param resync: reload the whole view (after each subscription).
    :param apply: apply one message heard on ``channel``.
    :param poll: read recent changes from the database.
    :param poll_seconds: how often ``poll`` runs.
    """

    name: str
    channel: str
    resync: Callable[[], Awaitable[None]]
    apply: Callable[[str], None]
    poll: Callable[[], Awaitable[None]]
    poll_seconds: float


async def follow_changes(feed: ChangeFeed, shared: SharedState, mailbox: Mailbox,
                         handle: Handler | None = None, *,
                         task_status: trio.TaskStatus[Any] = trio.TASK_STATUS_IGNORED) -> None:
    """Run ``feed`` and answer ``mailbox`` with ``handle`` until cancelled (an actor's body);
    without ``handle`` every message is refused with ``TypeError``.

    Ready once the first resync was tried: loaded when the dependencies answer, and
    ready all the same during an outage, so that an outage at start does not stop the
    service from starting.
    """
    first_try = trio.Event()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_listen, feed, shared, first_try)
        nursery.start_soon(_poll, feed)
        await first_try.wait()
        task_status.started()
        await serve_mailbox(mailbox, handle or _refuse(feed.name))
        nursery.cancel_scope.cancel()


async def _listen(feed: ChangeFeed, shared: SharedState, first_try: trio.Event) -> None:
    backoff = Backoff()
    while True:
        try:
            async with shared.subscribe(feed.channel) as messages:
                # Subscribed before the resync: nothing committed after it is missed.
                try:
                    await feed.resync()
                finally:
                    first_try.set()
                backoff.reset()
                async for message in messages:
                    feed.apply(message)
            log.warning("%s: the %s subscription ended; resubscribing", feed.name, feed.channel)
            delay = backoff.next_delay()
        except Exception as exc:
            first_try.set()
            if not is_outage(exc):
                raise
            delay = backoff.next_delay()
            log.warning("%s: %s; retrying in %.1f s", feed.name, outage_cause(exc), delay)
        await trio.sleep(delay)


async def _poll(feed: ChangeFeed) -> None:
    while True:
        await trio.sleep(feed.poll_seconds)
        try:
            await feed.poll()
        except Exception as exc:
            if not is_outage(exc):
                raise
            log.warning("%s: poll failed (%s); retrying in %.1f s", feed.name, outage_cause(exc),
                        feed.poll_seconds)


def _refuse(name: str) -> Handler:
    async def refuse(message: object) -> None:
        raise TypeError(f"{name} takes no messages, not {message!r}")

    return refuse

