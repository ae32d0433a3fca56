"""``usdt_bep20``: a USDT (BEP-20) transfer of an exact amount to the treasury.

The service holds no private key. Each invoice gets an amount of its own: the price plus a
unique suffix below 0.1 USDT (``invoices.reserve_token_amount``), so the amount alone says
which invoice a transfer pays. The ``checkoutUrl`` is an EIP-681 payment request
(``ethereum:<token>@<chain>/transfer?address=<treasury>&uint256=<amount>``) and the checkout
answer spells the transfer out (``payment``). Payment is seen by the chain plugin's indexer
once final and reaches ``plugins.billing.chain`` through ``flowsvc_chain_transfer``; there
is no HTTP callback and nothing can be charged off-session.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from plugins.billing.providers import ChargeDeclined, Confirmation, Opened, Order, Payment
from runtime.errors import NotFound
from runtime.wire import format_units


class UsdtBep20:
    name = "usdt_bep20"
    off_session = False
    callbacks = False

    def __init__(self, chain_id: int, token: str, treasury: str, decimals: int) -> None:
        self.chain_id = chain_id
        self.token = token
        self.treasury = treasury
        self.decimals = decimals

    async def checkout(self, order: Order) -> Opened:
        assert order.token_amount is not None, "a usdt_bep20 invoice reserves its amount"
        url = (f"ethereum:{self.token}@{self.chain_id}/transfer?address={self.treasury}"
               f"&uint256={order.token_amount}")
        return Opened(reference=None, url=url, payment=self.describe(order.token_amount))

    def describe(self, amount: int) -> dict[str, Any]:
        """The transfer that pays an invoice of ``amount`` base units."""
        return {"chainId": self.chain_id, "token": self.token, "address": self.treasury,
                "amount": format_units(amount, self.decimals)}

    def verify_callback(self, headers: Mapping[str, str], body: bytes, now: float
                        ) -> Confirmation:
        raise NotFound(f"{self.name} payments are confirmed on chain, not by a callback")

    async def charge(self, order: Order, customer_ref: str) -> Payment:
        raise ChargeDeclined(f"{self.name} cannot charge off-session")
