"""``flowsvc dev-wallet``: a development wallet that signs in without a browser wallet.

For the embedded default only (SQLite, no Redis, not production): it keeps a private key in
``<var_dir>/dev-wallet.key`` (created on first use, mode 0600, reused after), signs in with
it over SIWE against the running service (``service.public_url``, the same
``POST /auth/nonce`` and ``/auth/verify`` a browser wallet goes through, with the
``flowsvc_client`` package), optionally registers a token it owns (``PUT
/internal/tokens/<slug>`` with the internal token) and creates an API key, and prints shell
``export`` lines for ``flowsvc_client.Client.from_env()``::

    eval "$(.venv/bin/flowsvc dev-wallet --token moon)"

It lives in the auth plugin because it needs what only the service's side knows (the
deployment's kind, ``var/``, the internal token) and refuses everywhere else; the HTTP part
is the client's own sign-in, so there is one SIWE client, the one integrators use.
"""

from __future__ import annotations

import argparse
import logging
import shlex
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import trio

from runtime.dev_wallet import (
    DEV_TEMPLATE,
    KEY_FILE,
    available,
    placeholder_instance,
    wallet_key,
)
from runtime.hooktypes import Command

if TYPE_CHECKING:
    from runtime.service import Service



@dataclass(frozen=True)
class DevSignIn:
    """What to do: the service's address, the internal token, and the options."""

    url: str
    internal_token: str
    key_path: Path
    chain_id: int
    token_slug: str | None
    api_key_name: str | None
    wait_seconds: float


def _wait_until_serving(url: str, seconds: float) -> None:
    import httpx

    deadline = time.monotonic() + seconds
    announced = False
    while True:
        try:
            if httpx.get(f"{url}/healthz", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        if time.monotonic() >= deadline:
            raise ConnectionError(f"no service answers at {url}: start it with `make serve`")
        if not announced:
            print(f"waiting for the service at {url} ...", file=sys.stderr)
            announced = True
        time.sleep(0.25)


def sign_in(plan: DevSignIn) -> list[tuple[str, str]]:
    """Sign the wallet in (and register its token, create its key): the variables to export.

    Blocking (HTTP); run it in a thread. :raises ConnectionError: nothing answers at the
    URL. :raises flowsvc_client.ApiError: the service refused a step.
    """
    from flowsvc_client import Client
    from flowsvc_client.client import API_KEY_VARIABLE, SESSION_VARIABLE, URL_VARIABLE

    logging.getLogger("httpx").setLevel(logging.WARNING)  # stderr keeps to what matters
    _wait_until_serving(plan.url, plan.wait_seconds)
    with Client(plan.url) as flow:
        user = flow.sign_in_with_wallet(wallet_key(plan.key_path))
        address = str(user["address"])
        print(f"dev wallet {address} signed in at {plan.url} (user {user['id']})",
              file=sys.stderr)
        if plan.token_slug is not None:
            flow.send("PUT", f"/internal/tokens/{plan.token_slug}",
                      headers={"authorization": f"Bearer {plan.internal_token}"},
                      json={"ownerAddress": address, "template": DEV_TEMPLATE,
                            "chainId": plan.chain_id,
                            "instance": placeholder_instance(plan.token_slug)})
            print(f"token {plan.token_slug!r} is registered to it", file=sys.stderr)
        exports = [(URL_VARIABLE, plan.url)]
        if plan.api_key_name is not None:
            key = flow.create_api_key(plan.api_key_name)
            return [*exports, (API_KEY_VARIABLE, str(key["raw_key"]))]
        assert flow.session_token is not None
        return [*exports, (SESSION_VARIABLE, flow.session_token)]


def _add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--token", metavar="SLUG",
                        help="also register a token with this slug owned by the wallet")
    parser.add_argument("--api-key", metavar="NAME",
                        help="print a new API key with this name instead of the session")
    parser.add_argument("--wait", type=float, default=90.0, metavar="SECONDS",
                        help="how long to wait for the service to answer (default 90)")


async def _run(service: Service, args: argparse.Namespace) -> int:
    from flowsvc_client import ApiError

    from plugins.auth.state import AUTH

    settings = service.settings
    if not available(settings):
        print("flowsvc dev-wallet: refused: only for the embedded default (SQLite, no Redis, "
              "not production)", file=sys.stderr)
        return 2
    plan = DevSignIn(url=settings.service.public_url.rstrip("/"),
                     internal_token=settings.internal.token,
                     key_path=settings.service.var_dir / KEY_FILE,
                     chain_id=service.state(AUTH).settings.siwe_chain_id,
                     token_slug=args.token, api_key_name=args.api_key, wait_seconds=args.wait)
    try:
        exports = await trio.to_thread.run_sync(sign_in, plan)
    except (ConnectionError, ApiError) as exc:
        print(f"flowsvc dev-wallet: {exc}", file=sys.stderr)
        return 1
    for name, value in exports:
        print(f"export {name}={shlex.quote(value)}")
    return 0


DEV_WALLET = Command(name="dev-wallet",
                     help="sign in with a local development wallet (embedded default only)",
                     add_arguments=_add_arguments, run=_run)
