"""Headless Chromium (Debian's ``chromium``) driven over the DevTools protocol on a pipe.

``--remote-debugging-pipe`` makes the browser read NUL-terminated JSON commands on its fd 3
and write answers and events on its fd 4: no TCP port, no WebSocket library. Tests use it
where a page must be loaded with a cookie already set, then inspected.
"""

from __future__ import annotations

import fcntl
import itertools
import json
import os
import shutil
import signal
import subprocess
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import trio

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


class Browser:
    """One browser and one page (a target attached in flat mode)."""

    def __init__(self, send: trio.lowlevel.FdStream, receive: trio.lowlevel.FdStream) -> None:
        self._send = send
        self._receive = receive
        self._ids = itertools.count(1)
        self._answers: dict[int, dict[str, Any]] = {}
        self._arrived = trio.Event()
        self._sending = trio.Lock()  # commands from several tasks go out one at a time
        self.events: list[dict[str, Any]] = []
        self.session: str | None = None

    async def read_forever(self) -> None:
        buffer = b""
        while chunk := await self._receive.receive_some(65536):
            buffer += chunk
            *messages, buffer = buffer.split(b"\0")
            for message in messages:
                decoded = json.loads(message)
                if "id" in decoded:
                    self._answers[decoded["id"]] = decoded
                else:
                    self.events.append(decoded)
            self._arrived.set()
            self._arrived = trio.Event()

    async def call(self, method: str, params: dict[str, Any] | None = None, *,
                   page: bool = True) -> dict[str, Any]:
        """Send a command (to the page's session unless ``page`` is false); its result."""
        number = next(self._ids)
        command: dict[str, Any] = {"id": number, "method": method, "params": params or {}}
        if page:
            assert self.session is not None
            command["sessionId"] = self.session
        async with self._sending:
            await self._send.send_all(json.dumps(command).encode() + b"\0")
        while number not in self._answers:
            await self._arrived.wait()
        answer = self._answers.pop(number)
        assert "error" not in answer, (method, answer["error"])
        result: dict[str, Any] = answer["result"]
        return result

    async def open_page(self) -> None:
        target = await self.call("Target.createTarget", {"url": "about:blank"}, page=False)
        attached = await self.call("Target.attachToTarget",
                                   {"targetId": target["targetId"], "flatten": True}, page=False)
        self.session = attached["sessionId"]
        await self.call("Page.enable")
        await self.call("Network.enable")

    async def navigate(self, url: str) -> None:
        """Load ``url`` and wait for its load event."""
        seen = len(self.events)
        await self.call("Page.navigate", {"url": url})
        while not any(event.get("method") == "Page.loadEventFired"
                      for event in self.events[seen:]):
            await self._arrived.wait()

    async def evaluate(self, expression: str) -> Any:
        """The value of ``expression`` in the page (awaited if it is a promise)."""
        answer = await self.call("Runtime.evaluate", {"expression": expression,
                                                      "returnByValue": True,
                                                      "awaitPromise": True})
        return answer["result"].get("value")

    async def wait_for(self, expression: str, seconds: float = 30) -> Any:
        """Poll ``expression`` until it is truthy (the page tells nothing else); its value.

        An evaluation that fails because the page is being replaced counts as falsy.
        """
        with trio.fail_after(seconds):
            while True:
                try:
                    value = await self.evaluate(expression)
                except AssertionError:  # "Execution context was destroyed": a navigation
                    value = None
                if value:
                    return value
                await trio.sleep(0.05)

    async def load_by(self, expression: str, seconds: float = 30) -> None:
        """Evaluate ``expression`` (a click, a form submit) and wait for the page it loads."""
        seen = len(self.events)
        # Run after this evaluation has answered: a navigation it starts at once can leave
        # the command unanswered.
        await self.evaluate(f"setTimeout(() => {{ {expression}; }}, 0)")
        with trio.fail_after(seconds):
            while not any(event.get("method") == "Page.loadEventFired"
                          for event in self.events[seen:]):
                await self._arrived.wait()

    def requested_urls(self) -> list[str]:
        """Every URL the page has requested so far (the Network domain's events)."""
        return [event["params"]["request"]["url"] for event in self.events
                if event.get("method") == "Network.requestWillBeSent"]


def _pipe_end_above_4() -> tuple[int, int]:
    """A pipe whose ends are not fds 3 or 4, which bash below rewires for Chromium."""
    read, write = os.pipe()
    ends = tuple(fcntl.fcntl(end, fcntl.F_DUPFD_CLOEXEC, 10) for end in (read, write))
    os.close(read)
    os.close(write)
    return ends[0], ends[1]


@asynccontextmanager
async def chromium(profile: Path, *flags: str) -> AsyncIterator[Browser]:
    """A headless Chromium with a fresh profile and one open page; killed at the end.

    ``flags`` are added to the command line; tests pass ``--host-resolver-rules`` so that no
    name resolves but the ones they serve, and nothing leaves the machine.
    """
    assert CHROMIUM is not None, "chromium not found: install the Debian package chromium"
    commands_read, commands_write = _pipe_end_above_4()
    answers_read, answers_write = _pipe_end_above_4()
    argv = ["bash", "-c", f'exec 3<&{commands_read} 4>&{answers_write} '
            f'{commands_read}<&- {answers_write}>&- "$@"', "sh", CHROMIUM,
            "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
            "--disable-background-networking", "--disable-component-update",
            f"--user-data-dir={profile}", "--remote-debugging-pipe", *flags]
    process = await trio.lowlevel.open_process(
        argv, pass_fds=(commands_read, answers_write), stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    os.close(commands_read)
    os.close(answers_write)
    browser = Browser(trio.lowlevel.FdStream(commands_write),
                      trio.lowlevel.FdStream(answers_read))
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(browser.read_forever)
            with trio.fail_after(60):
                await browser.open_page()
            yield browser
            nursery.cancel_scope.cancel()
    finally:
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        with trio.CancelScope(shield=True):
            await process.wait()
