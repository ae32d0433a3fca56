"""Shared state, in memory and in Redis: windows, keys with a TTL, fan-out, locks."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

import pytest
import redis
import trio

from runtime.errors import Unavailable
from runtime.shared import (
    MemorySharedState,
    RedisSharedState,
    SharedState,
    open_shared_state,
    window_key,
)
from tests.support.backends import redis_prefix
from tests.support.server import free_port


@pytest.fixture
async def shared(redis_url: str) -> AsyncIterator[SharedState]:
    async with open_shared_state(redis_url, redis_prefix()) as state:
        yield state


async def test_kind_names_the_backend(shared: SharedState, redis_url: str) -> None:
    assert shared.kind == ("redis" if redis_url else "memory")


async def test_window_is_exact_under_concurrency(shared: SharedState) -> None:
    allowed: list[bool] = []

    async def hit() -> None:
        allowed.append((await shared.hit_window("burst", 50, 60)).allowed)

    async with trio.open_nursery() as nursery:
        for _ in range(200):
            nursery.start_soon(hit)
    assert len(allowed) == 200
    assert allowed.count(True) == 50


async def test_window_counts_down_and_says_when_to_retry(shared: SharedState) -> None:
    began = time.time()
    decisions = [await shared.hit_window("countdown", 3, 60) for _ in range(4)]
    assert [d.allowed for d in decisions] == [True, True, True, False]
    assert [d.remaining for d in decisions] == [2, 1, 0, 0]
    assert [d.retry_after for d in decisions[:3]] == [0, 0, 0]
    refused = decisions[3]
    assert 59 <= refused.retry_after <= 60
    # reset_at: when the oldest counted hit leaves the window.
    assert began + 60 - 0.01 <= refused.reset_at <= time.time() + 60
    assert all(d.reset_at == pytest.approx(decisions[0].reset_at, abs=0.01) for d in decisions)


async def test_window_slides(shared: SharedState) -> None:
    assert (await shared.hit_window("slide", 2, 1)).allowed
    assert (await shared.hit_window("slide", 2, 1)).allowed
    refused = await shared.hit_window("slide", 2, 1)
    assert not refused.allowed and refused.retry_after == 1  # whole seconds, at least 1
    await trio.sleep(1.05)
    again = await shared.hit_window("slide", 2, 1)
    assert again.allowed and again.remaining == 1
    assert (await shared.hit_window("other-key", 2, 1)).remaining == 1


async def test_an_empty_window_resets_now(shared: SharedState) -> None:
    before = time.time()
    refused = await shared.hit_window("closed", 0, 60)
    assert not refused.allowed
    assert refused.remaining == 0
    assert before - 0.01 <= refused.reset_at <= time.time() + 0.01


async def test_values_with_ttl(shared: SharedState) -> None:
    assert await shared.get("greeting") is None
    assert await shared.set("greeting", "hello", ttl=1)
    assert await shared.get("greeting") == "hello"
    assert await shared.set("forever", "stays")
    await trio.sleep(1.1)
    assert await shared.get("greeting") is None
    assert await shared.get("forever") == "stays"
    await shared.delete("forever")
    assert await shared.get("forever") is None


async def test_set_only_if_absent(shared: SharedState) -> None:
    assert await shared.set("claim", "first", only_if_absent=True, ttl=30)
    assert not await shared.set("claim", "second", only_if_absent=True, ttl=30)
    assert await shared.get("claim") == "first"
    await shared.delete("claim")
    assert await shared.set("claim", "third", only_if_absent=True)
    assert await shared.get("claim") == "third"


async def test_publish_reaches_every_subscriber_of_the_channel(shared: SharedState) -> None:
    received: dict[str, list[str]] = {"a": [], "b": [], "other": []}

    async def listen(name: str, channel: str, count: int,
                     task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with shared.subscribe(channel) as messages:
            task_status.started()
            async for message in messages:
                received[name].append(message)
                if len(received[name]) == count:
                    return

    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            await nursery.start(listen, "a", "news", 3)
            await nursery.start(listen, "b", "news", 3)
            await nursery.start(listen, "other", "sports", 1)
            for message in ("one", "two", "three"):
                await shared.publish("news", message)
            await shared.publish("sports", "goal")
    assert received == {"a": ["one", "two", "three"], "b": ["one", "two", "three"],
                        "other": ["goal"]}


async def test_lock_excludes(shared: SharedState) -> None:
    inside: list[str] = []
    overlaps: list[str] = []

    async def work(name: str) -> None:
        async with shared.lock("critical", ttl=10):
            if inside:
                overlaps.append(f"{name} entered while {inside} inside")
            inside.append(name)
            await trio.sleep(0.05)
            inside.remove(name)

    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            for index in range(5):
                nursery.start_soon(work, f"worker-{index}")
    assert overlaps == []
    async with shared.lock("critical"):  # released: it can be taken again at once
        pass


async def test_two_clients_share_one_window_only_through_redis(redis_url: str) -> None:
    prefix = redis_prefix()
    async with open_shared_state(redis_url, prefix) as one, \
            open_shared_state(redis_url, prefix) as two:
        allowed = 0
        for _ in range(10):
            allowed += (await one.hit_window("together", 10, 60)).allowed
            allowed += (await two.hit_window("together", 10, 60)).allowed
        if redis_url:
            assert isinstance(one, RedisSharedState) and isinstance(two, RedisSharedState)
            assert one._client is not two._client  # two processes' own connections
            assert allowed == 10
            assert await one.set("shared-key", "v") and await two.get("shared-key") == "v"
        else:
            assert allowed == 20  # in-process state is per process: that is why workers need Redis


async def test_redis_keys_carry_the_prefix(redis_url: str) -> None:
    prefix = redis_prefix()
    async with open_shared_state(redis_url, prefix) as state:
        await state.set("name", "value")
        await state.hit_window("window", 5, 60)
        if isinstance(state, RedisSharedState):
            assert state.key("name") == prefix + "name"
            keys = {key.decode() for key in redis.Redis.from_url(redis_url).keys(prefix + "*")}
            assert keys == {prefix + "name", prefix + window_key("window")}
        else:
            assert await state.get("name") == "value"


async def test_ping(shared: SharedState) -> None:
    await shared.ping()


async def test_an_unreachable_redis_is_unavailable() -> None:
    async with open_shared_state(f"redis://127.0.0.1:{free_port()}/0") as state:
        with pytest.raises(Unavailable, match="redis is unavailable"):
            await state.ping()


async def test_memory_forgets_idle_windows_and_expired_values() -> None:
    """One window per client IP must not stay for the life of the embedded process."""
    state = MemorySharedState(sweep_seconds=0)
    for index in range(100):
        await state.hit_window(f"ip:10.0.0.{index}", 5, 0.05)
        await state.set(f"session:{index}", "x", ttl=0.05)
    await state.set("kept", "forever")
    await trio.sleep(0.1)
    assert (await state.hit_window("ip:10.0.0.1", 5, 0.05)).remaining == 4  # fresh window
    assert await state.set("another", "y", ttl=60)
    assert set(state._windows) == {"ip:10.0.0.1"}
    assert set(state._values) == {"kept", "another"}
