"""Emitting account events from tests, outside any change of a plugin's."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from runtime.events import OutboundEvent
from runtime.service import Service


async def emit_now(service: Service, *, user_id: int, name: str,
                   data: Mapping[str, Any]) -> OutboundEvent:
    """Emit an event in a transaction of its own; durable when this returns."""
    return await service.db.write(
        lambda connection: service.emit_event(connection, user_id=user_id, name=name,
                                              data=data))
