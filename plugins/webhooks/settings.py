"""The ``[plugins.webhooks]`` settings table."""

from __future__ import annotations

import ipaddress

from pydantic import Field, field_validator, model_validator

from runtime.config import Section
from runtime.netguard import UrlPolicy


class WebhooksSettings(Section):
    """Outbound webhook delivery: URL safety, retries, concurrency and the outbox lease.

    :param allow_http: accept ``http://`` targets besides ``https://`` (tests, local relays).
    :param allowed_hosts: names or IP literals exempt from the address checks.
    :param allowed_networks: CIDR networks whose addresses are exempt from the address checks.
    :param timeout_seconds: the whole of one attempt: DNS, connect, send, response headers.
    :param max_retries: retries after the first attempt (the spec's 3).
    :param backoff_base_seconds: mean of the first retry delay; retry ``n`` averages
        ``base * 2**n`` (1, 2, 4 s by default), full jitter from 0 to twice that.
    :param max_concurrency: attempts in flight at once, per service process.
    :param per_host_concurrency: attempts in flight to one target host, per service process.
    :param poll_seconds: how often the dispatcher looks for due deliveries without a wake-up.
    :param lease_seconds: how long a claimed delivery stays reserved to the process that claimed
        it; a crashed process's claims come back after this. Must exceed ``timeout_seconds``.
    :param max_subscriptions: subscriptions per user.
    :param secret_overlap_seconds: after a secret rotation, how long deliveries are also signed
        with the old secret (0: switch at once).
    :param retention_days: finished deliveries and their attempts are purged after this.
    """

    allow_http: bool = False
    allowed_hosts: list[str] = []
    allowed_networks: list[str] = []
    timeout_seconds: float = Field(10.0, gt=0, le=120)
    max_retries: int = Field(3, ge=0, le=10)
    backoff_base_seconds: float = Field(1.0, gt=0, le=3600)
    max_concurrency: int = Field(64, ge=1, le=1024)
    per_host_concurrency: int = Field(4, ge=1, le=1024)
    poll_seconds: float = Field(1.0, gt=0, le=60)
    lease_seconds: float = Field(60.0, gt=0)
    max_subscriptions: int = Field(20, ge=1, le=1000)
    secret_overlap_seconds: int = Field(86400, ge=0, le=7 * 86400)
    retention_days: float = Field(30.0, gt=0)

    @field_validator("allowed_networks")
    @classmethod
    def _networks_parse(cls, networks: list[str]) -> list[str]:
        for network in networks:
            ipaddress.ip_network(network)  # ValueError names the bad network
        return networks

    @model_validator(mode="after")
    def _lease_outlives_an_attempt(self) -> WebhooksSettings:
        if self.lease_seconds <= self.timeout_seconds:
            raise ValueError("lease_seconds must be greater than timeout_seconds, or an attempt "
                             "still running could be claimed and sent again by another process")
        return self

    def url_policy(self) -> UrlPolicy:
        """The SSRF policy these settings describe."""
        return UrlPolicy.build(allow_http=self.allow_http, allowed_hosts=self.allowed_hosts,
                               allowed_networks=self.allowed_networks, purpose="webhooks")
