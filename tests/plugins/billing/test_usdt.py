"""``usdt_bep20``: final transfers reach billing the way the chain indexer will deliver them
(``flowsvc_chain_transfer`` inside a database transaction): an exact transfer activates,
short, late, duplicate and unknown ones are recorded and reported, never granted.

The end-to-end test with anvil and the real indexer comes with the chain plugin's indexer.
"""

from __future__ import annotations

import secrets
from datetime import datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy import Connection

from runtime.contracts.chain import FinalTransfer, TransferWatch
from runtime.service import Service
from tests.support.billing import INTERNAL, TREASURY, USDT_TOKEN, billing_stack, subscription
from tests.support.server import client
from tests.support.wallet import sign_in


async def index(service: Service, amount: int, sender: str, *, block_time: datetime,
                tx_hash: str | None = None, recipient: str = TREASURY,
                token: str = USDT_TOKEN) -> FinalTransfer:
    """Deliver one final transfer as the indexer does: the hook, in its transaction."""
    transfer = FinalTransfer(chain_id=56, token=token, sender=sender, recipient=recipient,
                             amount=amount, tx_hash=tx_hash or "0x" + secrets.token_hex(32),
                             log_index=3, block_number=40_000_000, block_hash="0x" + "ab" * 32,
                             block_time=block_time)

    def deliver(connection: Connection) -> None:
        service.pm.hook.flowsvc_chain_transfer(service=service, connection=connection,
                                               transfer=transfer)

    await service.db.write(deliver)
    return transfer


async def checkout(http: httpx.AsyncClient, tier: str) -> tuple[int, datetime]:
    """A ``usdt_bep20`` checkout: its exact amount in base units and its expiry."""
    started = await http.post("/subscriptions/checkout",
                              json={"tier": tier, "provider": "usdt_bep20"})
    assert started.status_code == 201, started.text
    body = started.json()
    expires = datetime.fromisoformat(body["expiresAt"].replace("Z", "+00:00"))
    return int(Decimal(body["payment"]["amount"]) * 10**18), expires


async def outcomes(http: httpx.AsyncClient) -> list[str]:
    payments: list[dict[str, Any]] = (await http.get("/me/subscription/payments")).json()[
        "payments"]
    return [payment["outcome"] for payment in payments]


async def test_final_transfers_activate_exactly_and_report_the_rest(
        tmp_path: Path, database_url: str) -> None:
    async with billing_stack(tmp_path / "var", database_url) as stack, \
            client(stack.running) as payer, client(stack.running) as short, \
            client(stack.running) as operator:
        service = stack.service
        watches = service.pm.hook.flowsvc_chain_watches(service=service)
        assert [watch for found in watches for watch in found or []] == [
            TransferWatch(56, USDT_TOKEN, TREASURY)]
        payer_wallet, _ = await sign_in(payer)
        short_wallet, _ = await sign_in(short)
        now = stack.clock.now()

        amount, _ = await checkout(payer, "max")
        exact = await index(service, amount, payer_wallet.address.lower(), block_time=now)
        active = await subscription(payer)
        assert (active["tier"], active["status"], active["provider"]) == \
            ("max", "active", "usdt_bep20")
        assert active["features"]["dedicatedRuntime"] is True
        await index(service, amount, payer_wallet.address.lower(), block_time=now,
                    tx_hash=exact.tx_hash)  # the same transfer again: nothing new
        await index(service, amount, payer_wallet.address.lower(), block_time=now)
        assert await outcomes(payer) == ["duplicate", "granted"]
        received = stack.named("payment.received")
        assert [event["outcome"] for event in received] == ["granted", "duplicate"]
        assert received[0]["amount_usd"] == f"{Decimal(amount) / 10**18:.6f}"

        amount, expires = await checkout(short, "plus")
        await index(service, amount - 10**12, short_wallet.address.lower(), block_time=now)
        await index(service, amount, short_wallet.address.lower(),
                    block_time=expires + timedelta(seconds=1))
        assert await outcomes(short) == ["late", "short"]
        assert (await subscription(short))["tier"] == "none"  # never silently granted

        stranger = "0x" + "12" * 20
        await index(service, 5 * 10**18, stranger, block_time=now)
        await index(service, amount, stranger, block_time=now, recipient="0x" + "34" * 20)
        await index(service, amount, stranger, block_time=now, token="0x" + "56" * 20)
        unmatched = await operator.get("/internal/billing/payments?outcome=unmatched",
                                       headers=INTERNAL)
        assert unmatched.status_code == 200, unmatched.text
        [payment] = unmatched.json()["payments"]
        assert (payment["sender"], payment["amountUsd"], payment["userId"]) == \
            (stranger, "5.000000", None)
        everything = await operator.get("/internal/billing/payments", headers=INTERNAL)
        assert len(everything.json()["payments"]) == 5  # other recipients and tokens ignored
