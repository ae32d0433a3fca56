"""Sign-in helpers for tests: a real wallet key signs the SIWE message the service returns."""

from __future__ import annotations

import httpx
from eth_account import Account
from eth_account.messages import encode_defunct
from eth_account.signers.local import LocalAccount


def new_wallet() -> LocalAccount:
    account: LocalAccount = Account.create()
    return account


def sign(wallet: LocalAccount, message: str) -> str:
    signature = wallet.sign_message(encode_defunct(text=message)).signature.hex()
    return "0x" + signature.removeprefix("0x")


async def sign_in(http: httpx.AsyncClient, wallet: LocalAccount | None = None
                  ) -> tuple[LocalAccount, dict[str, object]]:
    """Sign in with SIWE; the client keeps the session cookie. Returns the wallet and user."""
    wallet = wallet or new_wallet()
    address = wallet.address.lower()
    issued = await http.post("/auth/nonce", json={"address": address})
    assert issued.status_code == 200, issued.text
    message = issued.json()["message"]
    verified = await http.post("/auth/verify", json={
        "address": address, "message": message, "signature": sign(wallet, message)})
    assert verified.status_code == 200, verified.text
    return wallet, verified.json()["user"]
