"""The whole schedule under the test clock, over HTTP: renewals, grace with a retry a day,
cancel after seven failed days, a successful retry, cancel and lapse, upgrades pro-rated at
once and downgrades at the next period, for an off-session and an invoice provider."""

from __future__ import annotations

from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import trio

from runtime.wire import iso
from tests.support.auth import BOT_TOKEN, init_data
from tests.support.billing import DAY, Stack, billing_stack, subscription, until_subscription
from tests.support.fake_botapi import FakeBotApi
from tests.support.marketplace import signed_in
from tests.support.projects import eventually
from tests.support.server import client


def at(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def later(text: str, days: float) -> str:
    return iso(at(text) + timedelta(days=days))


def code(response: httpx.Response) -> str:
    return str(response.json()["error"]["code"])


async def change(http: httpx.AsyncClient, tier: str, status: int = 200) -> dict[str, Any]:
    answer = await http.post("/me/subscription/change", json={"tier": tier})
    assert answer.status_code == status, answer.text
    body: dict[str, Any] = answer.json()
    return body


def last_charge(stack: Stack) -> dict[str, Any]:
    return stack.gateway.charges[-1]


async def test_gateway_renews_downgrades_upgrades_and_cancels_after_a_week_of_grace(
        tmp_path: Path, database_url: str) -> None:
    async with billing_stack(tmp_path / "var", database_url) as stack, \
            signed_in(stack.running) as (http, user_id):
        nothing = await http.post("/me/subscription/change", json={"tier": "max"})
        assert nothing.status_code == 404 and code(nothing) == "not_found"
        await stack.subscribe(http, "pro", "gateway")
        first = await subscription(http)
        customer = next(iter(stack.gateway.sessions.values()))["customer"]
        assert (await change(http, "plus"))["nextTier"] == "plus"  # at the next period
        assert (await subscription(http))["tier"] == "pro"

        stack.advance(30 * DAY)
        renewed = await until_subscription(http, periodStart=first["renewsAt"])
        assert (renewed["tier"], renewed["status"], renewed["nextTier"]) == \
            ("plus", "active", None)
        assert renewed["renewsAt"] == later(first["renewsAt"], 30)
        assert (last_charge(stack)["amount"], last_charge(stack)["customer"]) == \
            ("2000", customer)

        stack.gateway.declining.add(customer)
        refused = await http.post("/me/subscription/change", json={"tier": "max"})
        assert refused.status_code == 402 and code(refused) == "payment_failed"
        assert (await subscription(http))["tier"] == "plus"
        stack.gateway.declining.discard(customer)
        stack.advance(15 * DAY)
        upgraded = await change(http, "max")  # at once, the rest of the period pro-rated
        assert (upgraded["tier"], upgraded["renewsAt"]) == ("max", renewed["renewsAt"])
        assert last_charge(stack)["amount"] == "9000"  # (200 - 20) USD x 15/30, in cents
        assert upgraded["features"]["dedicatedRuntime"] is True

        anchor = upgraded["renewsAt"]
        stack.gateway.declining.add(customer)
        stack.advance(15 * DAY)
        grace = await until_subscription(http, status="grace")
        assert (grace["tier"], grace["features"]["dedicatedRuntime"]) == ("max", True)
        assert (grace["renewsAt"], grace["graceEndsAt"]) == (later(anchor, 1), later(anchor, 7))
        in_grace = await http.post("/me/subscription/change", json={"tier": "plus"})
        assert in_grace.status_code == 409 and code(in_grace) == "conflict"
        stack.advance(DAY)
        await until_subscription(http, status="grace", renewsAt=later(anchor, 2))
        stack.gateway.declining.discard(customer)
        stack.advance(DAY)  # the second retry succeeds: active, the period kept its anchor
        back = await until_subscription(http, status="active", periodStart=anchor)
        assert (back["tier"], back["renewsAt"]) == ("max", later(anchor, 30))

        stack.gateway.declining.add(customer)
        stack.advance(30 * DAY)
        await until_subscription(http, status="grace")
        for day in range(1, 7):
            stack.advance(DAY)
            await until_subscription(http, status="grace",
                                     renewsAt=later(back["renewsAt"], day + 1))
        stack.advance(DAY)
        ended = await until_subscription(http, status="canceled", tier="none")
        assert not any(ended["features"].values())
        assert ended["renewsAt"] == ended["endsAt"] is not None  # when the tier went
        assert [event["reason"] for event in stack.named("subscription.canceled")] == \
            ["payment_failed"]
        assert len(stack.named("subscription.grace", user_id)) == 2
        assert len(stack.named("subscription.ended", user_id)) == 1
        # The checkout, the renewal, the upgrade and the successful retry were paid; the
        # other attempts were declined and charged nothing.
        granted = [p for p in (await http.get("/me/subscription/payments")).json()["payments"]
                   if p["outcome"] == "granted"]
        assert len(granted) == 4


async def test_invoice_renewals_reach_the_messenger_and_a_cancel_lapses(
        tmp_path: Path, database_url: str, nursery: trio.Nursery) -> None:
    bot = FakeBotApi()
    bot_url = await nursery.start(bot.serve)
    messenger = {"FLOWSVC_PLUGINS_AUTH_BOT_TOKEN": BOT_TOKEN,
                 "FLOWSVC_PLUGINS_AUTH_BOT_API_BASE_URL": bot_url}
    async with billing_stack(tmp_path / "var", database_url, extra=messenger) as stack, \
            client(stack.running) as http:
        signed = await http.post("/auth/messenger", json={
            "initData": init_data({"id": 4242, "first_name": "Ada"})})
        assert signed.status_code == 200, signed.text
        await stack.subscribe(http, "plus")
        first = await subscription(http)

        stack.advance(29 * DAY + 3600)  # inside the day before renewsAt: the invoice is sent
        [notice] = await bot.wait_for(1)
        assert notice.chat_id == 4242 and "20.000000 USD" in notice.text
        invoice = (await until_open_invoice(http))["openInvoice"]
        assert (invoice["purpose"], invoice["checkoutUrl"]) == \
            ("renewal", notice.text.split(" at ")[1].split(" ")[0])
        paid = await stack.cryptopay.pay(stack.cryptopay.invoice_of_url(invoice["checkoutUrl"]))
        assert paid.json()["outcome"] == "granted"
        renewed = await subscription(http)
        assert (renewed["periodStart"], renewed["renewsAt"]) == \
            (first["renewsAt"], later(first["renewsAt"], 30))

        stack.advance(31 * DAY)  # no payment by renewsAt: grace, and a new invoice
        grace = await until_subscription(http, status="grace")
        assert grace["features"]["priorityQueue"] is True
        assert "20.000000 USD" in (await bot.wait_for(2))[1].text  # the invoice of the day
        retry = (await until_open_invoice(http, renewal_after=invoice["invoiceId"]))
        paid = await stack.cryptopay.pay(
            stack.cryptopay.invoice_of_url(retry["openInvoice"]["checkoutUrl"]))
        assert paid.json()["outcome"] == "granted"
        back = await subscription(http)  # a successful retry returns to active
        assert (back["status"], back["periodStart"]) == ("active", renewed["renewsAt"])

        upgrade = await change(http, "pro", status=202)  # paid by invoice, then at once
        assert upgrade["tier"] == "plus" and upgrade["openInvoice"]["purpose"] == "upgrade"
        paid = await stack.cryptopay.pay(
            stack.cryptopay.invoice_of_url(upgrade["openInvoice"]["checkoutUrl"]))
        assert paid.json()["outcome"] == "granted"
        assert (await subscription(http))["tier"] == "pro"

        canceled = await http.post("/me/subscription/cancel")
        assert canceled.status_code == 200, canceled.text
        body = canceled.json()
        assert (body["status"], body["tier"], body["renewsAt"], body["endsAt"]) == \
            ("canceled", "pro", back["renewsAt"], back["renewsAt"])
        assert body["features"]["premiumAgents"] is True  # kept until the period ends
        assert (await http.post("/me/subscription/cancel")).json() == body
        stack.advance(31 * DAY)
        lapsed = await until_subscription(http, tier="none")
        assert lapsed["status"] == "canceled" and not any(lapsed["features"].values())
        assert (lapsed["renewsAt"], lapsed["endsAt"]) == (back["renewsAt"], back["renewsAt"])
        again = await http.post("/subscriptions/checkout",
                                json={"tier": "plus", "provider": "crypto_bot"})
        assert again.status_code == 201


async def until_open_invoice(http: httpx.AsyncClient, renewal_after: str | None = None
                             ) -> dict[str, Any]:
    """The subscription once it shows an open renewal invoice (newer than one already seen)."""
    seen: dict[str, Any] = {}

    async def shown() -> bool:
        seen.update(await subscription(http))
        invoice = seen["openInvoice"]
        return invoice is not None and invoice["invoiceId"] != renewal_after

    await eventually(shown, timeout=15)
    return seen
