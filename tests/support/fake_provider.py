"""Serving a fake payment provider (a small Quart app) on a loopback port in the test's run.

The fakes in ``fake_cryptopay`` and ``fake_gateway`` are Quart apps served by hypercorn, the
same server flowsvc runs on; ``serve_fake`` starts one on a free port and gives its base URL.
Their signatures are computed from the providers' published formats, independently of
``plugins.billing``, so that a test of the plugin is not the plugin checking itself.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Protocol, TypeVar

import httpx
import trio
from hypercorn.config import Config
from hypercorn.trio import serve
from quart_trio import QuartTrio

from tests.support.server import tls_context


@asynccontextmanager
async def serve_fake(app: QuartTrio) -> AsyncIterator[str]:
    """Serve ``app`` on 127.0.0.1 until the block ends; yields ``http://127.0.0.1:PORT``."""
    config = Config()
    config.bind = ["127.0.0.1:0"]
    config.accesslog = None
    config.errorlog = None
    stop = trio.Event()
    async with trio.open_nursery() as nursery:
        binds = await nursery.start(lambda task_status: serve(
            app, config, shutdown_trigger=stop.wait, task_status=task_status))
        try:
            yield str(binds[0])
        finally:
            stop.set()


class Fake(Protocol):
    base_url: str

    def app(self) -> QuartTrio: ...


F = TypeVar("F", bound=Fake)


@asynccontextmanager
async def running_fake(fake: F) -> AsyncIterator[F]:
    """``fake`` served on a free loopback port, its ``base_url`` set, until the block ends."""
    async with serve_fake(fake.app()) as base_url:
        fake.base_url = base_url
        yield fake


async def deliver(url: str, body: bytes, headers: dict[str, str]) -> httpx.Response:
    """POST a callback to the service, as the provider would."""
    async with httpx.AsyncClient(timeout=30, verify=tls_context()) as http:
        return await http.post(url, content=body,
                               headers={"content-type": "application/json", **headers})
