"""An example third-party plugin for the webhooks tests: it declares one event type, nothing else.

It is enabled the way any third-party plugin is, through a ``flowsvc.plugins`` entry point:
``install_entry_point`` writes the distribution metadata that advertises it into a folder the
caller puts on ``sys.path`` (and ``PYTHONPATH`` for subprocess servers).
"""

from __future__ import annotations

from pathlib import Path

from runtime.events import EventType
from runtime.hookspecs import hookimpl

PLUGIN_NAME = "webhook_example"
EXAMPLE_EVENT = "example.widget.created"


@hookimpl
def flowsvc_webhook_events() -> list[EventType]:
    return [EventType(EXAMPLE_EVENT, "A widget was created (an event type added by a plugin "
                      "enabled after subscriptions were made).")]


def install_entry_point(site: Path) -> Path:
    """Write ``flowsvc_webhook_example-1.0.dist-info`` into ``site``; return ``site``."""
    dist_info = site / "flowsvc_webhook_example-1.0.dist-info"
    dist_info.mkdir(parents=True, exist_ok=True)
    (dist_info / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: flowsvc-webhook-example\nVersion: 1.0\n", encoding="utf-8")
    (dist_info / "entry_points.txt").write_text(
        f"[flowsvc.plugins]\n{PLUGIN_NAME} = {__name__}\n", encoding="utf-8")
    return site
