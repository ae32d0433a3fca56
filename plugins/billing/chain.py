"""``usdt_bep20`` payments: the treasury watch and the final transfers the indexer reports.

The chain plugin's indexer calls ``on_transfer`` (the ``flowsvc_chain_transfer`` hook)
inside its own transaction for each final transfer matching a watch; what is written here
commits with its cursor, so each transfer is handled once. A transfer pays the invoice that
reserved exactly its amount; one that matches no reserved amount is attributed, when its
sender is a user's sign-in address, to that user's newest ``usdt_bep20`` invoice (so a
short or excessive payment shows in their history), and recorded as ``unmatched``
otherwise. Lateness is judged by the block's time. Nothing here raises for an unexpected
transfer: raising would stop the chain's indexer.
"""

from __future__ import annotations

from sqlalchemy import Connection

from plugins.billing import invoices, payments
from plugins.billing.providers import Payment
from plugins.billing.providers.usdt_bep20 import UsdtBep20
from plugins.billing.state import BILLING
from runtime.contracts.chain import FinalTransfer, TransferWatch
from runtime.service import Service
from runtime.users import find_user


def _provider(service: Service) -> UsdtBep20 | None:
    provider = service.state(BILLING).providers.get(UsdtBep20.name)
    return provider if isinstance(provider, UsdtBep20) else None


def watches(service: Service) -> list[TransferWatch]:
    """The treasury's USDT, when ``usdt_bep20`` is enabled."""
    provider = _provider(service)
    if provider is None:
        return []
    return [TransferWatch(provider.chain_id, provider.token, provider.treasury)]


def on_transfer(service: Service, connection: Connection, transfer: FinalTransfer) -> str | None:
    """Record a final transfer to the treasury and grant what it pays; its outcome (None for
    a transfer that is not billing's)."""
    provider = _provider(service)
    if provider is None or transfer.chain_id != provider.chain_id \
            or transfer.recipient.lower() != provider.treasury \
            or transfer.token.lower() != provider.token:
        return None
    sender = transfer.sender.lower()
    invoice = invoices.by_reserved_amount(connection, transfer.amount)
    user = find_user(connection, address=sender)
    if invoice is None and user is not None:
        invoice = invoices.latest_of(connection, user.id, provider.name)
    return payments.settle(service, connection, Payment(
        provider=provider.name,
        reference=f"{transfer.chain_id}:{transfer.tx_hash.lower()}:{transfer.log_index}",
        invoice_id=invoice.id if invoice is not None else None,
        amount_micro=transfer.amount // 10 ** (provider.decimals - 6),
        paid_at=transfer.block_time, token_amount=str(transfer.amount), sender=sender),
        user_id=user.id if user is not None else None)
