"""The service's one sandbox: commands and a browser under bubblewrap, never a plain shell.

The service makes one :class:`Sandbox` from ``[sandbox]`` and probes it at start-up; tools
of any plugin reach it through ``ToolContext.sandbox``. When the probe fails, the reason is
logged once, shown in ``/readyz`` and ``flowsvc doctor``, the tools that need the sandbox
are not offered, and :meth:`Sandbox.run` refuses: there is no fall-back. What it promises
and what it does not is docs/agent-runtime.md.
"""

from __future__ import annotations

import functools
import logging
import os
import shutil
import tempfile
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any, Literal

import trio

from runtime.config import SandboxSettings
from runtime.errors import PayloadTooLarge, Unavailable
from runtime.sandbox.browser import CHROMIUM, Picture, take_picture
from runtime.sandbox.dev_server import DevServer, with_dev_server
from runtime.sandbox.jail import Identity, Limits, closed_parent, identity_for
from runtime.sandbox.proxy import PROXY_SOCKET, RegistryProxy
from runtime.sandbox.runner import Outcome, hand_over, run_sandboxed

__all__ = ["DevServer", "Limits", "Outcome", "Picture", "Sandbox"]

log = logging.getLogger("flowsvc.sandbox")
Need = Literal["commands", "browser"]
_PROBE_WORD = b"sandbox-ok"


class Sandbox:
    """Runs commands and takes screenshots in bubblewrap, as a non-root uid, within limits.

    ``reasons`` holds, per need (``commands``, ``browser``), why it is unavailable; an
    absent key means available. Before :meth:`probe` nothing is.
    """

    def __init__(self, settings: SandboxSettings) -> None:
        self.settings = settings
        self.limits = Limits.from_settings(settings)
        self.reasons: dict[Need, str] = {"commands": "not probed yet",
                                         "browser": "not probed yet"}

    def offers(self, need: Need) -> bool:
        """Whether tools that need ``need`` may be offered."""
        return need not in self.reasons

    def health(self) -> dict[str, Any]:
        """The ``/readyz`` entry: never a readiness failure, since the service serves
        without it; the tools that need it are simply not offered."""
        return {"ok": True, **{need: self.reasons.get(need, "available")
                               for need in ("commands", "browser")},
                "cgroups": self.limits.cgroups}

    async def probe(self) -> None:
        """Check that a sandbox can be set up here; log one line saying what is offered."""
        reasons: dict[Need, str] = {}
        commands = await self._probe_commands()
        if commands is not None:
            reasons["commands"] = commands
        browser = commands or (None if await trio.Path(CHROMIUM).is_file() else
                               "chromium not found: install the Debian package chromium")
        if browser is not None:
            reasons["browser"] = browser
        self.reasons = reasons
        if self.reasons:
            for need, reason in self.reasons.items():
                log.warning("sandbox: %s not offered: %s", need, reason)
        else:
            log.info("sandbox: commands and browser available")

    async def _probe_commands(self) -> str | None:
        if not self.settings.active:
            return "turned off by [sandbox] active = false"
        for program, package in (("bwrap", "bubblewrap"), ("prlimit", "util-linux")):
            if shutil.which(program) is None:
                return f"{program} not found: install the Debian package {package}"
        scratch = Path(await trio.to_thread.run_sync(tempfile.mkdtemp, "", "flowsvc-probe-"))
        try:
            outcome = await self.run(["echo", _PROBE_WORD.decode()], scratch,
                                     limits=replace(self.limits, wall_seconds=20), probing=True)
        except OSError as exc:
            return f"the sandbox could not be started: {exc}"
        finally:
            await trio.to_thread.run_sync(shutil.rmtree, scratch)
        if outcome.exit_code == 0 and outcome.output.strip() == _PROBE_WORD:
            return None
        detail = outcome.output.decode("utf-8", "replace").strip().splitlines()
        return ("bwrap cannot set up a sandbox here (user namespaces?): "
                f"{detail[0] if detail else f'exit status {outcome.exit_code}'}")

    async def run(self, argv: Sequence[str], work_tree: Path, *, limits: Limits | None = None,
                  probing: bool = False) -> Outcome:
        """Run ``argv`` in a sandbox whose one writable mount is ``work_tree``.

        :param limits: default: the ``[sandbox]`` settings.
        :raises Unavailable: the probe failed (or has not run).
        :raises PayloadTooLarge: the work tree is already over its size cap.
        """
        if not probing and not self.offers("commands"):
            raise Unavailable(f"the sandbox is unavailable: {self.reasons['commands']}")
        limits = limits or self.limits
        identity = await self._prepare(work_tree, limits)
        if probing or not self.settings.registries:
            return await run_sandboxed(argv, work_tree, identity, limits)
        proxy = RegistryProxy(frozenset(host.lower() for host in self.settings.registries))
        async with self._bridge(identity) as bridge, trio.open_nursery() as nursery:
            await nursery.start(proxy.serve, str(bridge / PROXY_SOCKET))
            outcome = await run_sandboxed(argv, work_tree, identity, limits, bridge)
            nursery.cancel_scope.cancel()
        return outcome

    @asynccontextmanager
    async def _bridge(self, identity: Identity) -> AsyncIterator[Path]:
        """A folder of the sandbox uid's alone, shared with a sandbox at ``/run/bridge``."""
        bridge = Path(await trio.to_thread.run_sync(tempfile.mkdtemp, "", "flowsvc-bridge-"))
        try:
            if identity.switch:
                os.chown(bridge, identity.uid, identity.gid)
            yield bridge
        finally:
            await trio.to_thread.run_sync(shutil.rmtree, bridge)

    async def screenshot(self, work_tree: Path, url: str, *, width: int = 1280,
                         height: int = 800, server: DevServer | None = None) -> Picture:
        """A PNG of ``url`` in a network-less browser sandbox: a ``file:///workspace/...``
        page of the work tree, or with ``server`` an ``http://127.0.0.1:<port>/...`` page of
        that dev server, started in a command sandbox first and killed after. A page that
        never settles is shot again with scripts off, all within ``browser_seconds`` (plus
        up to a third of it for the server to answer).

        :raises Unavailable: no browser sandbox here, the server did not answer, or no
            picture within the bound.
        :raises InvalidRequest: the page could not be loaded.
        """
        if not self.offers("browser"):
            raise Unavailable(f"the browser sandbox is unavailable: {self.reasons['browser']}")
        seconds = self.settings.browser_seconds
        limits = replace(self.limits, memory_bytes=None, wall_seconds=seconds)
        identity = await self._prepare(work_tree, limits)
        if server is None:
            return await take_picture(work_tree, identity, limits, url, width, height)
        async with self._bridge(identity) as bridge:
            return await with_dev_server(
                server, work_tree, identity, replace(self.limits, wall_seconds=seconds * 2),
                bridge, seconds / 3, functools.partial(
                    take_picture, work_tree, identity, limits, url, width, height, server,
                    bridge))

    async def _prepare(self, work_tree: Path, limits: Limits) -> Identity:
        identity = identity_for(work_tree, self.settings)
        if identity.switch:
            closed = await trio.to_thread.run_sync(closed_parent, work_tree)
            if closed is not None:
                raise Unavailable(f"the sandbox uid cannot reach the work tree: {closed} is "
                                  "not searchable by others (chmod o+x)")
        size = await trio.to_thread.run_sync(hand_over, work_tree, identity)
        if size > limits.workspace_bytes:
            raise PayloadTooLarge(f"the work tree holds {size} bytes, over its cap of "
                                  f"{limits.workspace_bytes}: delete files before running more")
        return identity
