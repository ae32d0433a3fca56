"""A Trio run on a thread of its own, for what a test module shares: the topology's fakes, a
service that several tests talk to (each test has a Trio run of its own, and pytest-trio
fixtures cannot outlive one)."""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator
from contextlib import AbstractAsyncContextManager, contextmanager, nullcontext
from pathlib import Path
from typing import Any, TypeVar

import pytest
import trio

from runtime.server import Running
from tests.support.backends import DATABASES, postgres_schema
from tests.support.server import make_settings, running_server, settings_env

T = TypeVar("T")


class Background:
    """A Trio run on a thread of its own, holding async context managers open for a test
    module; ``call_soon`` has that run call a function (to set a ``trio.Event`` of it), from
    any thread or Trio run."""

    def __init__(self, token: trio.lowlevel.TrioToken) -> None:
        self.token = token

    def call_soon(self, function: Callable[[], object]) -> None:
        self.token.run_sync_soon(function)


@contextmanager
def in_background(opened: Callable[[Background], AbstractAsyncContextManager[T]]
                  ) -> Iterator[T]:
    """Enter ``opened(background)`` in a Trio run on a new thread; yield what it gives;
    exit it (and end the run) at the end of the block."""
    entered: queue.Queue[tuple[T, Background] | BaseException] = queue.Queue()
    stop = trio.Event()  # set from this thread through the run's token

    async def main() -> None:
        background = Background(trio.lowlevel.current_trio_token())
        try:
            async with opened(background) as value:
                entered.put((value, background))
                await stop.wait()
        except BaseException as exc:  # given to the caller, who raises it
            entered.put(exc)

    thread = threading.Thread(target=trio.run, args=(main,), name="background-trio",
                              daemon=True)
    thread.start()
    started = entered.get(timeout=60)
    if isinstance(started, BaseException):
        raise started
    value, background = started
    try:
        yield value
    finally:
        background.call_soon(stop.set)
        thread.join(timeout=30)


@contextmanager
def shared_service(database: str, folder: Path, plugins: list[str]) -> Iterator[Running]:
    """One service with ``plugins`` for the tests of a module, on ``database`` ("sqlite": a
    file in ``folder``; "postgres": a fresh schema), served by a Trio run on a thread of its
    own. For tests that only send requests, as nobody or each as a new user (a fresh
    wallet), so none depends on another's rows: the callers' rate limits are off, since the
    module's requests add up on one service."""
    with postgres_schema() if database == "postgres" else \
            nullcontext(f"sqlite:///{folder / 'flowsvc.db'}") as database_url:
        env = settings_env(folder / "var", database_url=database_url, plugins=plugins,
                           extra={"FLOWSVC_LIMITS_ANONYMOUS_RPM": "0",
                                  "FLOWSVC_LIMITS_AUTHENTICATED_RPM": "0"})
        with in_background(lambda _: running_server(make_settings(env), env)) as served:
            yield served


def shared_service_fixture(plugins: list[str]) -> Any:
    """A module-scoped fixture: ``shared_service`` with ``plugins``, once per database
    backend; a module assigns it to the name its tests take (``server = ...``)."""

    @pytest.fixture(scope="module", params=DATABASES)
    def served(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
               ) -> Iterator[Running]:
        with shared_service(request.param, tmp_path_factory.mktemp("shared"), plugins
                            ) as running:
            yield running

    return served
