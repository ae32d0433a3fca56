"""Helpers of the billing tests: a service with billing wired to fake providers on loopback,
its test clock, and a subscription paid end to end.

``billing_stack`` runs a fake Crypto Pay, a fake gateway and the service (with ``usdt_bep20``
on a made-up token and treasury) in the test's Trio run; the service's billing clock is a
test clock that ``Stack.advance`` moves, so a month of renewals takes a moment. It runs as
deployed: on SQLite with in-process state, on PostgreSQL with Redis.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from plugins.billing.clock import TestClock
from plugins.billing.state import BILLING
from runtime.server import Running
from runtime.service import Service
from tests.support.backends import REDIS_URL, redis_prefix
from tests.support.fake_cryptopay import FakeCryptoPay
from tests.support.fake_gateway import FakeGateway
from tests.support.fake_provider import running_fake
from tests.support.projects import EventRecorder, eventually
from tests.support.server import INTERNAL as INTERNAL  # re-exported for the billing tests
from tests.support.server import make_settings, running_server, settings_env

PLUGINS = ["auth", "chain", "billing"]
USDT_TOKEN = "0x55d398326f99059ff775485246999027b3197955"
TREASURY = "0x" + "7e" * 20
DAY = 86400.0


def billing_env(var_dir: Path, database_url: str, *, cryptopay: FakeCryptoPay | None = None,
                gateway: FakeGateway | None = None, plugins: list[str] | None = None,
                extra: dict[str, str] | None = None) -> dict[str, str]:
    """A test service with billing on the test clock, the providers pointed at the fakes,
    and the request buckets lifted (tests make many requests from one address)."""
    settings = {"TEST_CLOCK": "true", "USDT_TOKEN": USDT_TOKEN, "USDT_TREASURY": TREASURY}
    if cryptopay is not None:
        settings.update(CRYPTO_BOT_BASE_URL=cryptopay.base_url,
                        CRYPTO_BOT_TOKEN=cryptopay.token)
    if gateway is not None:
        settings.update(GATEWAY_BASE_URL=gateway.base_url,
                        GATEWAY_SECRET_KEY=gateway.secret_key,
                        GATEWAY_WEBHOOK_SECRET=gateway.webhook_secret)
    env = {f"FLOWSVC_PLUGINS_BILLING_{key}": value for key, value in settings.items()}
    env.update({"FLOWSVC_SERVICE_ENVIRONMENT": "test", "FLOWSVC_LIMITS_ANONYMOUS_RPM": "0",
                "FLOWSVC_LIMITS_AUTHENTICATED_RPM": "0", **(extra or {})})
    redis_url = REDIS_URL if database_url.startswith("postgres") else ""
    return settings_env(var_dir, database_url=database_url, redis_url=redis_url,
                        redis_prefix=redis_prefix(), plugins=plugins or PLUGINS, extra=env)


def events_named(recorder: EventRecorder, name: str, user_id: int | None = None
                 ) -> list[dict[str, Any]]:
    """The payloads of the recorded events called ``name`` (of ``user_id`` if given)."""
    return [dict(event.data) for event in recorder.events
            if event.name == name and user_id in (None, event.user_id)]


@dataclass
class Stack:
    running: Running
    cryptopay: FakeCryptoPay
    gateway: FakeGateway
    events: EventRecorder = field(default_factory=EventRecorder)

    @property
    def service(self) -> Service:
        return self.running.service

    @property
    def clock(self) -> TestClock:
        clock = self.service.state(BILLING).clock
        assert isinstance(clock, TestClock)
        return clock

    def named(self, name: str, user_id: int | None = None) -> list[dict[str, Any]]:
        """The payloads of the events called ``name`` this service emitted."""
        return events_named(self.events, name, user_id)

    def advance(self, seconds: float) -> None:
        """Move the billing clock forward (the scheduler wakes at once)."""
        self.clock.advance(seconds)

    async def subscribe(self, http: httpx.AsyncClient, tier: str, provider: str = "crypto_bot"
                        ) -> dict[str, Any]:
        """Check out ``tier`` and pay it through the provider's fake; the checkout answer."""
        answer = await http.post("/subscriptions/checkout",
                                 json={"tier": tier, "provider": provider})
        assert answer.status_code == 201, answer.text
        body: dict[str, Any] = answer.json()
        if provider == "crypto_bot":
            paid = await self.cryptopay.pay(self.cryptopay.invoice_of_url(body["checkoutUrl"]))
        else:
            paid = await self.gateway.complete(self.gateway.session_of_url(body["checkoutUrl"]))
        assert paid.status_code == 200 and paid.json()["outcome"] == "granted", paid.text
        return body


async def subscription(http: httpx.AsyncClient) -> dict[str, Any]:
    answer = await http.get("/me/subscription")
    assert answer.status_code == 200, answer.text
    body: dict[str, Any] = answer.json()
    return body


async def until_subscription(http: httpx.AsyncClient, timeout: float = 15.0,
                             **expected: Any) -> dict[str, Any]:
    """``GET /me/subscription`` once its fields equal ``expected`` (the scheduler's work)."""
    seen: dict[str, Any] = {}

    async def matches() -> bool:
        seen.update(await subscription(http))
        return all(seen.get(name) == value for name, value in expected.items())

    try:
        await eventually(matches, timeout=timeout)
    except Exception as exc:
        raise AssertionError(f"subscription never became {expected}: {seen}") from exc
    return seen


@asynccontextmanager
async def billing_stack(var_dir: Path, database_url: str, *, plugins: list[str] | None = None,
                        extra: dict[str, str] | None = None) -> AsyncIterator[Stack]:
    """Fake providers and a running service wired to them, until the block ends."""
    async with running_fake(FakeCryptoPay()) as cryptopay, running_fake(FakeGateway()) as gateway:
        env = billing_env(var_dir, database_url, cryptopay=cryptopay, gateway=gateway,
                          plugins=plugins, extra=extra)
        async with running_server(make_settings(env), env) as running:
            cryptopay.webhook_url = f"{running.base_url}/billing/webhooks/crypto_bot"
            gateway.webhook_url = f"{running.base_url}/billing/webhooks/gateway"
            stack = Stack(running, cryptopay, gateway)
            running.service.pm.register(stack.events, name="billing-test-events")
            yield stack
