"""Wallet sign-in (SIWE): who can sign, and how the signature is made.

A signer is either a private key (``0x`` hex string or 32 bytes) or any eth-account style
account object with ``address`` and ``sign_message`` (``eth_account.Account.from_key(...)``,
a hardware or remote signer wrapped the same way). The service writes the EIP-4361 message;
the signer signs it unchanged with ``personal_sign`` (EIP-191).
"""

from __future__ import annotations

from typing import Any, Protocol

from eth_account import Account
from eth_account.messages import SignableMessage, encode_defunct


class MessageSigner(Protocol):
    """What eth-account's ``LocalAccount`` offers for signing a message."""

    @property
    def address(self) -> str: ...

    def sign_message(self, signable_message: SignableMessage) -> Any: ...


Signer = MessageSigner | str | bytes


def as_account(signer: Signer) -> MessageSigner:
    """The account of a private key, or the signer itself."""
    if isinstance(signer, str | bytes):
        account: MessageSigner = Account.from_key(signer)
        return account
    return signer


def sign_text(signer: MessageSigner, message: str) -> str:
    """The ``0x`` hex ``personal_sign`` signature of ``message``."""
    signature = signer.sign_message(encode_defunct(text=message)).signature
    text: str = signature.hex() if isinstance(signature, bytes) else str(signature.hex())
    return "0x" + text.removeprefix("0x")
