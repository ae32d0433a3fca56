"""Hook implementations of the chain plugin (for now: its webhook event declaration)."""

from __future__ import annotations

from runtime.events import EventType
from runtime.hookspecs import hookimpl


@hookimpl
def flowsvc_webhook_events() -> list[EventType]:
    return [
        EventType("flow.balance.low", "The caller's FLOW balance fell below their threshold "
                  "(balance, threshold)."),
    ]
