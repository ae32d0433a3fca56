"""Actors: addresses, request/reply, bounded mailboxes and the registry."""

from __future__ import annotations

from typing import Any

import pytest
import trio
import trio.testing

from runtime.actors import Address, Mailbox, Registry, open_mailbox, serve_mailbox
from runtime.errors import InvalidRequest, Unavailable


async def _doubler(message: Any) -> Any:
    if message == "bad":
        raise InvalidRequest("bad message")
    return message * 2


async def test_request_reply_through_the_registry_by_name() -> None:
    registry = Registry()
    address, mailbox = open_mailbox("math.doubler", 8)
    registry.register(address)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(serve_mailbox, mailbox, _doubler)
        found = registry.lookup("math.doubler")
        assert found is address
        assert await found.call(21) == 42
        assert await found.call("ab") == "abab"
        nursery.cancel_scope.cancel()
    assert registry.get("math.doubler") is address
    assert [a.name for a in registry.addresses()] == ["math.doubler"]


async def test_a_failed_request_reaches_its_caller_and_the_actor_goes_on() -> None:
    address, mailbox = open_mailbox("math.doubler", 8)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(serve_mailbox, mailbox, _doubler)
        with pytest.raises(InvalidRequest, match="bad message"):
            await address.call("bad")
        assert await address.call(2) == 4
        nursery.cancel_scope.cancel()


def test_registry_refuses_duplicates_and_unknown_names() -> None:
    registry = Registry()
    first, _ = open_mailbox("same", 1)
    second, _ = open_mailbox("same", 1)
    registry.register(first)
    with pytest.raises(ValueError, match="'same' is already registered"):
        registry.register(second)
    assert registry.lookup("same") is first
    with pytest.raises(Unavailable, match="actor missing is not running"):
        registry.lookup("missing")
    assert registry.get("missing") is None
    registry.unregister("same")
    with pytest.raises(Unavailable):
        registry.lookup("same")


async def test_mailbox_is_bounded(autojump_clock: trio.testing.MockClock) -> None:
    address, _mailbox = open_mailbox("slowpoke", 2)
    assert address.try_cast("one") and address.try_cast("two")
    assert address.depth == 2
    assert not address.try_cast("three")
    with trio.move_on_after(5) as waited:
        await address.cast("three")  # waits for room that never comes
    assert waited.cancelled_caught
    began = trio.current_time()
    with pytest.raises(Unavailable, match="did not answer within 3 s"):
        await address.call("four", timeout=3)
    assert trio.current_time() - began == pytest.approx(3)
    assert address.depth == 2


async def test_a_silent_actor_makes_call_time_out(autojump_clock: trio.testing.MockClock) -> None:
    address, mailbox = open_mailbox("silent", 4)

    async def ignore(mailbox: Mailbox) -> None:
        async for _envelope in mailbox:
            pass  # never replies

    async with trio.open_nursery() as nursery:
        nursery.start_soon(ignore, mailbox)
        with pytest.raises(Unavailable, match="silent did not answer within 0.5 s"):
            await address.call("hello?", timeout=0.5)
        nursery.cancel_scope.cancel()


async def test_cast_is_fire_and_forget() -> None:
    address, mailbox = open_mailbox("sink", 4)
    await address.cast("a")
    assert address.try_cast("b")
    first = await mailbox.receive()
    first.reply("ignored")  # a cast has no reply slot: replying is a no-op
    first.fail(RuntimeError("ignored too"))
    assert first.message == "a"
    assert mailbox.current is first
    assert (await mailbox.receive()).message == "b"


async def test_mailbox_remembers_the_envelope_in_hand_for_the_supervisor() -> None:
    address, mailbox = open_mailbox("crashy", 4)
    outcome: list[BaseException] = []

    async def caller() -> None:
        try:
            await address.call("work", timeout=30)
        except Unavailable as exc:
            outcome.append(exc)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(caller)
        async for envelope in mailbox:
            assert mailbox.current is envelope
            break  # the actor "crashes" with the envelope in hand
        mailbox.fail_current(Unavailable("actor crashy crashed"))
        assert mailbox.current is None
    assert [str(exc) for exc in outcome] == ["actor crashy crashed"]


async def test_a_closed_address_fails_every_caller_at_once() -> None:
    address, mailbox = open_mailbox("closing", 1)
    failures: list[str] = []

    async def call(message: str) -> None:
        try:
            await address.call(message, timeout=60)
        except Unavailable as exc:
            failures.append(exc.message)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(call, "queued")
        await trio.testing.wait_all_tasks_blocked()
        nursery.start_soon(call, "waiting for room")
        await trio.testing.wait_all_tasks_blocked()
        address.close()
        mailbox.fail_pending("actor closing is stopped")
    assert sorted(failures) == ["actor closing is stopped", "actor closing is stopped"]
    with pytest.raises(Unavailable, match="closing is stopped"):
        await address.call("late")
    with pytest.raises(Unavailable, match="closing is stopped"):
        await address.cast("late")
    assert not address.try_cast("late")


def test_address_hides_the_actor() -> None:
    address, _ = open_mailbox("private", 1)
    assert isinstance(address, Address)
    assert {name for name in vars(address) if not name.startswith("_")} == {"name"}
