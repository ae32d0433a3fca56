"""Console tests' browser helpers: a test EIP-1193 wallet and form filling.

The wallet is ``window.ethereum`` injected before any page script runs. It answers
``eth_requestAccounts`` with a known address and forwards ``personal_sign`` to the test over
a DevTools binding; ``serve_wallet`` signs with the account's key (eth-account, as a real
wallet would) and resolves the page's promise. No key material enters the page.
"""

from __future__ import annotations

import json
import os
import socket
import struct
from typing import Any

import trio
from eth_account.messages import encode_defunct
from eth_account.signers.local import LocalAccount

from tests.support.chromium import Browser

BINDING = "flowsvcTestWalletSign"
_RESET_ON_CLOSE = struct.pack("ii", 1, 0)  # SO_LINGER on, 0 s: close() sends RST
_WALLET = """
(() => {
  const pending = new Map();
  let next = 0;
  window.__flowsvcWalletAnswer = (id, signature) => {
    pending.get(id)(signature);
    pending.delete(id);
  };
  window.ethereum = {
    isFlowsvcTestWallet: true,
    request: ({method, params}) => {
      if (method === "eth_requestAccounts" || method === "eth_accounts") {
        return Promise.resolve([ADDRESS]);
      }
      if (method === "personal_sign") {
        return new Promise((resolve) => {
          const id = ++next;
          pending.set(id, resolve);
          window.BINDING(JSON.stringify({id: id, message: params[0], address: params[1]}));
        });
      }
      return Promise.reject(new Error("unsupported method " + method));
    },
  };
})();
"""


async def inject_wallet(browser: Browser, account: LocalAccount) -> None:
    """Make every page of ``browser`` see the test wallet of ``account``."""
    await browser.call("Runtime.enable")
    await browser.call("Runtime.addBinding", {"name": BINDING})
    source = _WALLET.replace("ADDRESS", json.dumps(account.address.lower())).replace(
        "BINDING", BINDING)
    await browser.call("Page.addScriptToEvaluateOnNewDocument", {"source": source})


async def serve_wallet(browser: Browser, account: LocalAccount,
                       task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
    """Answer the page's ``personal_sign`` requests, forever (cancel to stop)."""
    task_status.started()
    answered = 0
    while True:
        calls = [event["params"] for event in browser.events
                 if event.get("method") == "Runtime.bindingCalled"
                 and event["params"]["name"] == BINDING]
        for call in calls[answered:]:
            request: dict[str, Any] = json.loads(call["payload"])
            assert request["address"] == account.address.lower()
            signed = account.sign_message(encode_defunct(hexstr=request["message"]))
            signature = "0x" + signed.signature.hex().removeprefix("0x")
            await browser.evaluate(
                f"window.__flowsvcWalletAnswer({request['id']}, {json.dumps(signature)})")
        answered = len(calls)
        await trio.sleep(0.05)


def fill(selector: str, values: dict[str, str]) -> str:
    """An expression setting the named fields of the form at ``selector``, then submitting it."""
    sets = "".join(f"form.elements[{json.dumps(name)}].value = {json.dumps(value)};"
                   for name, value in values.items())
    return (f"(() => {{ const form = document.querySelector({json.dumps(selector)}); {sets} "
            "form.requestSubmit(); })()")


def foreign_requests(browser: Browser, base_url: str) -> list[str]:
    """The URLs the page requested from anywhere but the service (``data:`` URLs, such as
    Chromium's own form-control icons, never leave the browser)."""
    return [url for url in browser.requested_urls()
            if not url.startswith((base_url + "/", "data:"))]


def reset_connections_to(port: int) -> int:
    """Reset every TCP connection this process serves on ``port`` (the in-process test
    server's): what a network drop does to a browser's open streams. How many were reset."""
    reset = 0
    for name in os.listdir("/proc/self/fd"):
        try:
            if not os.readlink(f"/proc/self/fd/{name}").startswith("socket:"):
                continue
            sock = socket.socket(fileno=int(name))
        except (OSError, ValueError):
            continue
        try:
            if sock.family in (socket.AF_INET, socket.AF_INET6) \
                    and sock.type == socket.SOCK_STREAM and sock.getsockname()[1] == port:
                sock.getpeername()  # the listener has no peer: OSError
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _RESET_ON_CLOSE)
                sock.shutdown(socket.SHUT_RDWR)
                reset += 1
        except OSError:
            pass  # the listener, or gone
        finally:
            sock.detach()
    return reset
