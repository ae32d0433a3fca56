"""Several processes and crashes: each renewal happens once across two ``flowsvc serve``
processes on PostgreSQL, and the claim of a process that died is taken over after its lease."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import httpx
import pytest

from plugins.billing import subscriptions
from runtime.wire import utcnow
from tests.support.backends import POSTGRES_URL, postgres_schema
from tests.support.billing import (
    DAY,
    INTERNAL,
    billing_env,
    billing_stack,
    subscription,
    until_subscription,
)
from tests.support.fake_cryptopay import FakeCryptoPay
from tests.support.fake_gateway import FakeGateway
from tests.support.fake_provider import deliver, running_fake
from tests.support.marketplace import signed_in
from tests.support.processes import serving
from tests.support.projects import eventually
from tests.support.server import free_port
from tests.support.wallet import sign_in

USERS = 6


@pytest.mark.postgres
async def test_two_processes_renew_each_subscription_once(tmp_path: Path) -> None:
    assert POSTGRES_URL, ("this test needs FLOWSVC_TEST_POSTGRES_URL (deselect it with "
                          "-m 'not postgres')")
    with postgres_schema() as database_url:
        async with running_fake(FakeCryptoPay()) as cryptopay, \
                running_fake(FakeGateway()) as gateway:
            env = billing_env(tmp_path / "var", database_url, cryptopay=cryptopay,
                              gateway=gateway, extra={"FLOWSVC_SERVICE_LOG_LEVEL": "warning"})
            ports = [free_port(), free_port()]
            bases = [f"http://127.0.0.1:{port}" for port in ports]
            with serving(env, ports):
                renews = []
                for n in range(USERS):
                    async with httpx.AsyncClient(base_url=bases[n % 2], timeout=30) as http:
                        await sign_in(http)
                        started = await http.post("/subscriptions/checkout",
                                                  json={"tier": "plus", "provider": "gateway"})
                        assert started.status_code == 201, started.text
                        session = gateway.session_of_url(started.json()["checkoutUrl"])
                        body, headers = gateway.signed_event(session)
                        paid = await deliver(f"{bases[n % 2]}/billing/webhooks/gateway", body,
                                             headers)
                        assert paid.json()["outcome"] == "granted", paid.text
                        renews.append((http.cookies["svc_session"],
                                       (await subscription(http))["renewsAt"]))
                async with httpx.AsyncClient(timeout=30) as internal:
                    moved = await internal.post(f"{bases[0]}/internal/billing/clock",
                                                headers=INTERNAL,
                                                json={"advanceSeconds": 30 * DAY + 60})
                    assert moved.status_code == 200, moved.text

                    async def followed() -> bool:  # the other process follows through Redis
                        other = await internal.get(f"{bases[1]}/internal/billing/clock",
                                                   headers=INTERNAL)
                        return bool(other.json()["offsetSeconds"] ==
                                    moved.json()["offsetSeconds"])

                    await eventually(followed)
                for n, (cookie, renews_at) in enumerate(renews):
                    async with httpx.AsyncClient(base_url=bases[n % 2], timeout=30,
                                                 cookies={"svc_session": cookie}) as http:
                        await until_subscription(http, periodStart=renews_at, status="active")
            charges = [key for path, key in gateway.requests if path == "/v1/payment_intents"]
            assert len(charges) == USERS and len(set(charges)) == USERS


async def test_a_claim_left_by_a_dead_process_is_taken_over_after_its_lease(
        tmp_path: Path, database_url: str) -> None:
    async with billing_stack(tmp_path / "var", database_url,
                             extra={"FLOWSVC_PLUGINS_BILLING_LEASE_SECONDS": "1"}) as stack, \
            signed_in(stack.running) as (http, _):
        await stack.subscribe(http, "plus", provider="gateway")
        first = await subscription(http)
        # As if another process, its clock a month ahead, claimed the renewal and died.
        claimed = await stack.service.db.write(
            subscriptions.claim_due, stack.clock.now() + timedelta(days=31), utcnow(),
            "dead-process", timedelta(seconds=1), 10)
        assert len(claimed) == 1
        stack.advance(30 * DAY)
        await until_subscription(http, periodStart=first["renewsAt"], status="active")
        assert [path for path, _ in stack.gateway.requests].count("/v1/payment_intents") == 1
