"""Contract: final token transfers to watched addresses (the chain plugin's indexer).

A plugin that takes payment on chain (billing's ``usdt_bep20``) returns the transfers it
wants to hear of from ``flowsvc_chain_watches``; the chain plugin's indexer calls
``flowsvc_chain_transfer`` for every matching ERC-20 ``Transfer`` once its block is final
(the chain's finality depth), inside the indexer's transaction, so what the hook writes
commits together with the indexer's cursor: each transfer is seen exactly once, across
restarts and several service processes.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime


@dataclass(frozen=True)
class TransferWatch:
    """Transfers of ``token`` to ``recipient`` on chain ``chain_id``.

    :param token: an ERC-20 address, or ``"usdt"`` for the chain's configured USDT.
    :param recipient: the receiving address (a treasury), lowercase.
    """

    chain_id: int
    token: str
    recipient: str


@dataclass(frozen=True)
class FinalTransfer:
    """One final ERC-20 ``Transfer`` matching a watch; ``amount`` in the token's base
    units (an integer, 18 decimals for BSC's USDT)."""

    chain_id: int
    token: str
    sender: str
    recipient: str
    amount: int
    tx_hash: str
    log_index: int
    block_number: int
    block_hash: str
    block_time: datetime
