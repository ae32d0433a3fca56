"""Account events: the catalogue plugins declare, and the event itself.

An event is emitted with ``Service.emit_event`` inside the database transaction of the
change that caused it; the ``flowsvc_event_emitted`` hook runs on that transaction (the
webhooks plugin writes its outbox there), so an event exists if and only if its cause
committed.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any


@dataclass(frozen=True)
class EventType:
    """A subscribable event name and what it means."""

    name: str
    description: str


@dataclass(frozen=True)
class OutboundEvent:
    """One account event.

    :param id: unique per event (``evt_`` + 32 hex); receivers deduplicate on it.
    :param name: a name from the catalogue.
    :param user_id: the account the event belongs to.
    :param created_at: when it happened (UTC).
    :param data: the payload; amounts are decimal strings with 6 decimals.
    """

    id: str
    name: str
    user_id: int
    created_at: datetime
    data: Mapping[str, Any]

    @classmethod
    def new(cls, name: str, user_id: int, data: Mapping[str, Any]) -> OutboundEvent:
        """A fresh event happening now, with a new id."""
        return cls(id=f"evt_{uuid.uuid4().hex}", name=name, user_id=user_id,
                   created_at=datetime.now(UTC), data=dict(data))
