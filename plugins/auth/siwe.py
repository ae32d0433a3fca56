"""EIP-4361 (Sign-In with Ethereum) messages: built by the server, verified by signature.

The server writes the whole message, so verification compares the submitted message
with the stored one byte for byte and recovers the signer with EIP-191
(``personal_sign``); no client-side field is ever trusted.
"""

from __future__ import annotations

import re
import secrets
from dataclasses import dataclass
from datetime import datetime, timedelta

from eth_account import Account
from eth_account.messages import encode_defunct
from eth_utils.address import to_checksum_address

from runtime.wire import iso

_NONCE_LINE = re.compile(r"^Nonce: ([A-Za-z0-9]{8,32})$", re.MULTILINE)


@dataclass(frozen=True)
class SiweParams:
    domain: str
    uri: str
    chain_id: int
    statement: str


def new_nonce() -> str:
    """32 hex characters (EIP-4361 wants at least 8 alphanumerics)."""
    return secrets.token_hex(16)


def build_message(params: SiweParams, address: str, nonce: str, issued_at: datetime,
                  expires_at: datetime) -> str:
    """The exact message the wallet signs; the address in EIP-55 checksum form."""
    return (
        f"{params.domain} wants you to sign in with your Ethereum account:\n"
        f"{to_checksum_address(address)}\n"
        f"\n"
        f"{params.statement}\n"
        f"\n"
        f"URI: {params.uri}\n"
        f"Version: 1\n"
        f"Chain ID: {params.chain_id}\n"
        f"Nonce: {nonce}\n"
        f"Issued At: {iso(issued_at)}\n"
        f"Expiration Time: {iso(expires_at)}"
    )


def nonce_of(message: str) -> str | None:
    """The nonce a message carries, or None when it has no valid nonce line."""
    match = _NONCE_LINE.search(message)
    return match.group(1) if match else None


def recover_signer(message: str, signature: str) -> str | None:
    """The lowercase address that signed ``message`` (EIP-191), or None if unrecoverable."""
    try:
        signer: str = Account.recover_message(encode_defunct(text=message), signature=signature)
    except Exception:  # malformed signatures raise many different errors in eth-account
        return None
    return signer.lower()


def expiry(issued_at: datetime, ttl_seconds: int) -> datetime:
    return issued_at + timedelta(seconds=ttl_seconds)
