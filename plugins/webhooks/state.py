"""What the webhooks plugin keeps per service: ``WEBHOOKS``.

Its settings, the SSRF policy they describe (used when a subscription is created and
before every attempt) and the dispatcher's metrics, made once per service. The
dispatcher actor owns the sending; routes and the event hook read this.
"""

from __future__ import annotations

from dataclasses import dataclass

from plugins.webhooks.metrics import DispatcherMetrics
from plugins.webhooks.settings import WebhooksSettings
from runtime.netguard import UrlPolicy
from runtime.service import Service, StateSlot


@dataclass(frozen=True)
class WebhooksState:
    settings: WebhooksSettings
    policy: UrlPolicy
    metrics: DispatcherMetrics

    @classmethod
    def create(cls, service: Service) -> WebhooksState:
        settings = service.plugin_settings("webhooks", WebhooksSettings)
        return cls(settings, settings.url_policy(), DispatcherMetrics(service.metrics.registry))


WEBHOOKS: StateSlot[WebhooksState] = StateSlot("webhooks", WebhooksState.create)
