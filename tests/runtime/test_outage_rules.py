"""Telling an outage from a bug, the backoff actors wait with, and outages as 503s.

The whole service through a minute of database and Redis outage is in
``tests/system/test_outage.py``; these are the rules it relies on, each fast.
"""

from __future__ import annotations

import logging

import pytest
import trio
from coredis.exceptions import ConnectionError as RedisConnectionError
from coredis.exceptions import ReadOnlyError, ResponseError, WrongTypeError
from trio.testing import MockClock

from runtime.backoff import Backoff, until_available
from runtime.errors import Unavailable, is_outage
from runtime.shared import open_shared_state
from tests.support.backends import redis_prefix
from tests.support.server import free_port

log = logging.getLogger("tests.outage")


@pytest.mark.parametrize("error", [
    Unavailable("the database is unavailable"), ConnectionRefusedError(), ConnectionResetError(),
    TimeoutError(), trio.TooSlowError(), RedisConnectionError("refused"),
    ReadOnlyError("READONLY You can't write against a read only replica."),
    ExceptionGroup("tasks", [RedisConnectionError("refused"), OSError("unreachable")])],
    ids=repr)
def test_a_dependency_that_is_down_is_an_outage(error: BaseException) -> None:
    assert is_outage(error)


@pytest.mark.parametrize("error", [
    KeyError("a bug"), ValueError("a bug"), ResponseError("ERR Error running script"),
    WrongTypeError("WRONGTYPE Operation against a key holding the wrong kind of value"),
    ExceptionGroup("tasks", [RedisConnectionError("refused"), KeyError("a bug")])],
    ids=repr)
def test_anything_else_is_a_bug(error: BaseException) -> None:
    assert not is_outage(error)


def test_backoff_doubles_to_its_cap_with_jitter_and_starts_over() -> None:
    backoff = Backoff(initial=0.1, maximum=5.0)
    delays = [backoff.next_delay() for _ in range(12)]
    ceilings = [min(0.1 * 2 ** n, 5.0) for n in range(12)]
    assert all(ceiling / 2 <= delay <= ceiling for delay, ceiling in zip(delays, ceilings,
                                                                         strict=True))
    assert len(set(delays)) == len(delays)  # jittered: no two processes retry in step
    backoff.reset()
    assert 0.05 <= backoff.next_delay() <= 0.1


async def test_until_available_waits_out_an_outage_and_returns_the_result(
        autojump_clock: MockClock, caplog: pytest.LogCaptureFixture) -> None:
    attempts: list[float] = []

    async def flaky() -> str:
        attempts.append(trio.current_time())
        if len(attempts) <= 25:  # down for about a minute of backoff
            raise Unavailable("the database is unavailable")
        return "written"

    assert await until_available(flaky, what="writing", log=log) == "written"
    gaps = [b - a for a, b in zip(attempts, attempts[1:], strict=False)]
    assert max(gaps) <= 5.0 and gaps[-1] >= 2.5  # capped at 5 s, and at its cap by then
    assert sum(gaps) >= 50  # each delay is at least half its ceiling
    assert "writing failed (Unavailable: the database is unavailable)" in caplog.text


async def test_until_available_lets_a_bug_through_at_once(autojump_clock: MockClock) -> None:
    attempts = 0

    async def broken() -> None:
        nonlocal attempts
        attempts += 1
        raise KeyError("a bug")

    with pytest.raises(KeyError):
        await until_available(broken, what="writing", log=log)
    assert attempts == 1


async def test_a_redis_that_is_down_answers_unavailable_from_every_call() -> None:
    nobody = f"redis://127.0.0.1:{free_port()}/0"  # a port nothing listens on
    async with open_shared_state(nobody, redis_prefix()) as shared:
        with trio.fail_after(30):
            for call in (lambda: shared.get("k"), lambda: shared.set("k", "v"),
                         lambda: shared.delete("k"), lambda: shared.publish("c", "m"),
                         lambda: shared.hit_window("bucket", 10, 60.0)):
                with pytest.raises(Unavailable):
                    await call()
