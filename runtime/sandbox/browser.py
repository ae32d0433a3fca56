"""Screenshots in Debian's chromium, itself inside a network-less sandbox.

Chromium runs headless as the work tree's sandbox uid with the work tree mounted
read-only, no network namespace of the host (its loopback is its own) and a fresh profile
in the sandbox's ``/tmp``. It is driven over the DevTools protocol on a pipe
(``--remote-debugging-pipe``: fd 3 in, fd 4 out, NUL-terminated JSON), so no port is
opened anywhere. A page whose script never yields blocks the renderer and every command
after it, and Chromium's own timeouts do not stop it: each attempt has a hard bound after
which the whole sandbox is killed, and the second attempt runs with scripts disabled.
"""

from __future__ import annotations

import base64
import functools
import json
import os
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import trio

from runtime.errors import InvalidRequest, ServiceError, Unavailable
from runtime.sandbox.dev_server import DevServer, browser_forwarding
from runtime.sandbox.jail import Identity, Limits
from runtime.sandbox.runner import launch

CHROMIUM = "/usr/lib/chromium/chromium"
# Wait this long for the load event before shooting whatever is drawn.
_SETTLE_SECONDS = 5.0
_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
          "--no-default-browser-check", "--disable-background-networking",
          "--disable-component-update", "--disable-sync", "--disable-quic",
          "--disable-breakpad", "--disable-crash-reporter", "--hide-scrollbars",
          "--mute-audio", "--user-data-dir=/tmp/profile", "--remote-debugging-pipe")
# Moves the protocol pipe from stdin/stdout (where it is passed in) to fds 3 and 4.
_ON_PIPE = 'exec "$@" 3<&0 4>&1 </dev/null >/dev/null 2>&1'


@dataclass(frozen=True)
class Picture:
    """A PNG of a page; ``scripts`` False when it was taken with scripts disabled because
    the page did not settle with them."""

    png: bytes
    scripts: bool
    duration_ms: int


class _BrowserGone(Exception):
    """The browser closed its protocol pipe (it exited or crashed)."""


class _DevTools:
    """A minimal DevTools protocol client over the two pipe ends (one call at a time)."""

    def __init__(self, send: trio.lowlevel.FdStream, receive: trio.lowlevel.FdStream) -> None:
        self._send = send
        self._receive = receive
        self._buffer = bytearray()
        self._next_id = 0
        self.events: list[str] = []

    async def call(self, method: str, params: dict[str, Any] | None = None,
                   session: str | None = None) -> dict[str, Any]:
        self._next_id += 1
        message: dict[str, Any] = {"id": self._next_id, "method": method,
                                   "params": params or {}}
        if session is not None:
            message["sessionId"] = session
        await self._send.send_all(json.dumps(message).encode() + b"\0")
        while True:
            reply = await self._message()
            if reply.get("id") == self._next_id:
                if "error" in reply:
                    raise Unavailable(f"the browser refused {method}: {reply['error']}")
                result: dict[str, Any] = reply.get("result", {})
                return result

    async def wait_for(self, event: str) -> None:
        while event not in self.events:
            await self._message()

    async def _message(self) -> dict[str, Any]:
        while b"\0" not in self._buffer:
            chunk = await self._receive.receive_some(65536)
            if not chunk:
                raise _BrowserGone
            self._buffer += chunk
        raw, _, rest = bytes(self._buffer).partition(b"\0")
        self._buffer = bytearray(rest)
        message: dict[str, Any] = json.loads(raw)
        if "method" in message:
            self.events.append(message["method"])
        return message


async def _shoot(tools: _DevTools, url: str, width: int, height: int, scripts: bool) -> bytes:
    target = await tools.call("Target.createTarget", {"url": "about:blank"})
    attached = await tools.call("Target.attachToTarget",
                                {"targetId": target["targetId"], "flatten": True})
    session = attached["sessionId"]
    await tools.call("Page.enable", session=session)
    await tools.call("Emulation.setDeviceMetricsOverride", {
        "width": width, "height": height, "deviceScaleFactor": 1, "mobile": False},
        session=session)
    if not scripts:
        await tools.call("Emulation.setScriptExecutionDisabled", {"value": True},
                         session=session)
    navigated = await tools.call("Page.navigate", {"url": url}, session=session)
    if navigated.get("errorText"):
        raise InvalidRequest(f"the page {url} could not be loaded: {navigated['errorText']}")
    with trio.move_on_after(_SETTLE_SECONDS):
        await tools.wait_for("Page.loadEventFired")
    shot = await tools.call("Page.captureScreenshot", {"format": "png"}, session=session)
    return base64.b64decode(shot["data"])


async def _attempt(work_tree: Path, identity: Identity, limits: Limits, url: str, width: int,
                   height: int, scripts: bool, server: DevServer | None,
                   bridge: Path | None) -> bytes | None:
    """One browser in one sandbox; None when it gave no picture within ``wall_seconds`` or
    exited before giving one."""
    browser_in, to_browser = os.pipe()
    from_browser, browser_out = os.pipe()
    # The browser's ends are closed here once it has them, so that its exit is seen as
    # the end of the pipe.
    sender = trio.lowlevel.FdStream(to_browser)
    receiver = trio.lowlevel.FdStream(from_browser)
    forwarding = browser_forwarding(server.port) if server is not None else ""
    argv = ["sh", "-c", forwarding + _ON_PIPE, "sh", CHROMIUM,
            *_FLAGS, f"--window-size={width},{height}", "about:blank"]
    picture: bytes | None = None
    failure: ServiceError | None = None
    try:
        with trio.move_on_after(limits.wall_seconds):
            async with trio.open_nursery() as nursery:
                await nursery.start(functools.partial(
                    launch, argv, work_tree, identity, limits, writable=False,
                    stdin=browser_in, stdout=browser_out, bridge=bridge))
                os.close(browser_in)
                os.close(browser_out)
                browser_in = browser_out = -1
                try:
                    picture = await _shoot(_DevTools(sender, receiver), url, width, height,
                                           scripts)
                except _BrowserGone:
                    pass  # seen with a page that never yields: no picture from this attempt
                except ServiceError as exc:  # carried out of the nursery as it is
                    failure = exc
                finally:
                    nursery.cancel_scope.cancel()  # the browser is never left running
    finally:
        for fd in (browser_in, browser_out):
            if fd >= 0:
                os.close(fd)
        await sender.aclose()
        await receiver.aclose()
    if failure is not None:
        raise failure
    return picture


async def take_picture(work_tree: Path, identity: Identity, limits: Limits, url: str,
                       width: int, height: int, server: DevServer | None = None,
                       bridge: Path | None = None) -> Picture:
    """Shoot ``url``; half the bound with scripts, the other half without when needed.

    With ``server`` (running, its socket in ``bridge``), the browser's loopback port of
    the server is forwarded to it.

    :raises Unavailable: no picture within ``limits.wall_seconds`` (or the browser exited).
    :raises InvalidRequest: the page could not be loaded.
    """
    started = time.monotonic()
    half = replace(limits, wall_seconds=limits.wall_seconds / 2)
    for scripts in (True, False):
        png = await _attempt(work_tree, identity, half, url, width, height, scripts, server,
                             bridge)
        if png is not None:
            return Picture(png, scripts, round((time.monotonic() - started) * 1000))
    raise Unavailable(f"no picture of {url} within {limits.wall_seconds:g} seconds, with "
                      "scripts or without (the browser hung or exited)")

