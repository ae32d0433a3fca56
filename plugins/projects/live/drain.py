"""SSE streams end when their process drains (``runtime.drain``), with a reconnect hint.

A process asked to stop cuts every open stream off the way a reader that fell behind is cut
off (``Subscription.dropped``): what it is writing finishes, then the stream gets the comment
``: disconnected, this process is shutting down; reconnect with Last-Event-ID`` and ends.
EventSource (and flowsvc's client) reconnects after the ``retry:`` delay the stream began
with, with ``Last-Event-ID``, through the load balancer to a process that is not draining,
and resumes after the last event it received: every event once. A stream opened on a
process that is already draining ends the same way after its head. Nothing is added to the
write path: the cut is the reader's existing check of ``dropped``.
"""

from __future__ import annotations

import weakref

from plugins.projects.live.ring import Subscription
from runtime.service import Service, StateSlot

DRAIN_REASON = "this process is shutting down"


def _open_subscriptions(service: Service) -> weakref.WeakSet[Subscription]:
    subscriptions: weakref.WeakSet[Subscription] = weakref.WeakSet()
    service.drain.on_begin(lambda: _cut_off(list(subscriptions)))
    return subscriptions


OPEN_SUBSCRIPTIONS: StateSlot[weakref.WeakSet[Subscription]] = StateSlot(
    "projects.open_subscriptions", _open_subscriptions)


def end_on_drain(service: Service, subscription: Subscription) -> None:
    """Have the drain end ``subscription``'s stream (at once, when it began)."""
    subscriptions = service.state(OPEN_SUBSCRIPTIONS)
    if service.drain.draining:
        _cut_off([subscription])
    else:
        subscriptions.add(subscription)


def _cut_off(subscriptions: list[Subscription]) -> None:
    for subscription in subscriptions:
        if subscription.dropped is None:
            subscription.dropped = DRAIN_REASON
        subscription.ring.beat()  # a reader waiting for events takes now, and stops
