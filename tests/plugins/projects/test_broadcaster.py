"""The ring, its readers, and the run queue's policy (no I/O)."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio
import trio.testing
from prometheus_client import CollectorRegistry

from plugins.projects.engine.run_queue import Backlog
from plugins.projects.engine.submit import Job, RunRequest, priority_of
from plugins.projects.engine.templates import builtin_templates
from plugins.projects.live.event_log import StreamEvent
from plugins.projects.live.queued import GRACE_SECONDS, QueuedBytes, pieces
from plugins.projects.live.ring import Lagged, Ring, Subscription


def event(seq: int, run: str = "run_a") -> StreamEvent:
    return StreamEvent(seq, run, "message", f'{{"role":"assistant","text":"{seq}"}}')


def ring_with(count: int, capacity: int = 10, run: str = "run_a") -> Ring:
    ring = Ring(capacity)
    for seq in range(1, count + 1):
        ring.append(event(seq, run))
    return ring


def seqs(frames: list[bytes]) -> list[int]:
    return [int(line[4:]) for line in b"".join(frames).decode().splitlines()
            if line.startswith("id: ")]


async def test_the_ring_keeps_the_newest_events_as_frames() -> None:
    ring = ring_with(25)
    assert (ring.first_seq, ring.last_seq) == (16, 25)
    assert seqs(ring.frames_after(15)) == list(range(16, 26))
    assert seqs(ring.frames_after(23)) == [24, 25]
    assert ring.frames_after(25) == []
    with pytest.raises(Lagged):
        ring.frames_after(14)
    assert ring.frames_after(24) == [b'id: 25\nevent: message\n'
                                     b'data: {"role":"assistant","text":"25"}\n\n']
    reloaded = Ring(10)
    reloaded.reset([event(seq) for seq in range(16, 26)], 25)
    assert reloaded.frames_after(15) == ring.frames_after(15)
    empty = Ring(10)
    empty.reset([], 40)
    assert (empty.first_seq, empty.last_seq) == (41, 40)


async def test_where_readers_start() -> None:
    ring = ring_with(25)
    assert ring.start_cursor("20", None) == (20, None)
    assert ring.start_cursor("15", None) == (15, None)  # every later event is held
    assert ring.start_cursor("25", None) == (25, None)
    for lost in ("14", "3", "26", "-1", "abc", ""):
        assert ring.start_cursor(lost, None) == (15, "15"), lost
    assert ring_with(5).start_cursor("9", None) == (0, "-1")
    for seq in range(26, 29):
        ring.append(event(seq, "run_b"))
    assert ring.start_cursor(None, "run_b") == (25, None)
    assert ring.start_cursor(None, "run_c") == (28, None)  # has not published yet
    assert ring.start_cursor(None, None) == (28, None)
    assert ring_with(30, run="run_a").start_cursor(None, "run_a") == (20, None)


async def test_a_reader_takes_everything_pending_at_once() -> None:
    ring = ring_with(3, capacity=100)
    with Subscription(ring, 0, max_lag=5, heartbeat_seconds=15) as reader:
        assert ring.readers == 1
        assert seqs(reader.take()) == [1, 2, 3]  # the replay is not lag
        assert reader.take() == []
        for seq in range(4, 9):
            ring.append(event(seq))
        assert seqs(reader.take()) == [4, 5, 6, 7, 8]
        for seq in range(9, 15):
            ring.append(event(seq))
        with pytest.raises(Lagged, match="more than 5 events behind"):
            reader.take()
    assert ring.readers == 0
    old = Subscription(ring_with(30), 2, max_lag=1000, heartbeat_seconds=15)
    with pytest.raises(Lagged):
        old.take()


async def test_readers_wake_when_the_ring_grows() -> None:
    ring = ring_with(1)
    reader = Subscription(ring, 1, max_lag=10, heartbeat_seconds=15)
    woken: list[list[bytes]] = []

    async def wait_then_take() -> None:
        await reader.wait()
        woken.append(reader.take())

    async with trio.open_nursery() as nursery:
        nursery.start_soon(wait_then_take)
        await trio.sleep(0.01)
        assert woken == []
        ring.append(event(2))
        ring.append(event(3))
        ring.wake()
    assert [seqs(chunk) for chunk in woken] == [[2, 3]]
    ring.close()
    await reader.wait()
    assert reader.closed


async def test_readers_share_the_frames_of_the_ring() -> None:
    ring = ring_with(8, capacity=10)
    with Subscription(ring, 0, 100, 15) as one, Subscription(ring, 3, 100, 15) as two:
        first, second = one.take(), two.take()
    assert seqs(first) == list(range(1, 9)) and seqs(second) == list(range(4, 9))
    # Every reader's backlog holds the ring's own bytes objects: nothing is copied.
    assert all(mine is theirs for mine, theirs in zip(first[3:], second, strict=True))
    assert all(mine is held for mine, held in zip(first, ring.frames_after(0), strict=True))


def test_a_backlog_goes_out_in_bounded_writes() -> None:
    small, big = b"s" * 100, b"b" * 1000
    frames = [small] * 5 + [big] + [small] * 3
    written = list(pieces(frames, limit=350))
    assert [len(piece) for piece in written] == [300, 200, 1000, 300]
    assert written[2] is big  # a frame as large as a write goes alone, unjoined
    assert b"".join(written) == b"".join(frames)
    assert list(pieces([])) == []


async def test_the_budget_holds_writes_back_and_cuts_the_most_behind() -> None:
    queued = QueuedBytes(budget=1000, registry=CollectorRegistry())
    ring = ring_with(10, capacity=10)
    far, near, recent, waiting, further = (Subscription(ring, cursor, 100, 15)
                                           for cursor in (2, 8, 5, 4, 0))
    await queued.acquire(far, 400)
    await queued.acquire(near, 300)
    await queued.acquire(recent, 200)
    now = trio.current_time()
    assert queued.total == 900 and queued.over_budget(now) == []  # nobody waits
    far.writing_since = near.writing_since = now - GRACE_SECONDS / 2
    later = now + GRACE_SECONDS
    recent.writing_since = later - GRACE_SECONDS / 2

    async with trio.open_nursery() as nursery:
        nursery.start_soon(queued.acquire, waiting, 500)
        await trio.testing.wait_all_tasks_blocked()
        assert set(queued.waiting) == {waiting} and waiting.queued == 0
        # Nobody has been writing or waiting long: a burst, not a reader that stopped.
        assert queued.over_budget(now) == []
        # 400 bytes too many: the reader furthest behind goes first, and is enough.
        assert far.bytes_behind() > waiting.bytes_behind() > recent.bytes_behind() > \
            near.bytes_behind()
        assert queued.over_budget(later) == [far] and far.dropped is not None
        assert queued.over_budget(later) == []  # its write is being cut
        queued.release(far)
    assert (queued.total, waiting.queued, queued.waiting) == (1000, 500, {})
    assert near.dropped is None and recent.dropped is None

    # A waiting reader further behind than every writer is the one cut off.
    refused: list[str] = []

    async def wait_for_room() -> None:
        try:
            await queued.acquire(further, 500)
        except Lagged as lagged:
            refused.append(str(lagged))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(wait_for_room)
        await trio.testing.wait_all_tasks_blocked()
        assert queued.over_budget(later + GRACE_SECONDS) == [further]
    assert refused == ["the process's readers hold 1000 bytes of writes"]
    assert queued.total == 1000 and not queued.waiting and further.queued == 0
    for reader in (near, recent, waiting):
        queued.release(reader)
    assert queued.total == 0 and not queued.writing
    alone = Subscription(ring, 0, 100, 15)
    await queued.acquire(alone, 5000)  # alone, a write larger than the budget goes through
    assert queued.total == 5000


async def test_the_budget_never_cuts_a_reader_while_one_further_behind_is_young() -> None:
    # Seen in CI: readers that had just begun stuck writes filled the budget, and a reader
    # with three events to catch up on, waiting for room longer than them, was cut instead.
    queued = QueuedBytes(budget=1000, registry=CollectorRegistry())
    ring = ring_with(10, capacity=10)
    behind, near_the_head = Subscription(ring, 0, 100, 15), Subscription(ring, 7, 100, 15)
    await queued.acquire(behind, 1000)
    now = trio.current_time()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(queued.acquire, near_the_head, 100)
        await trio.testing.wait_all_tasks_blocked()
        behind.writing_since = now + GRACE_SECONDS  # its write began long after the wait
        assert behind.bytes_behind() > near_the_head.bytes_behind()
        assert queued.over_budget(now + 1.5 * GRACE_SECONDS) == []
        assert near_the_head.dropped is None
        # Once its write has lasted the grace too, the reader further behind is cut.
        assert queued.over_budget(now + 2 * GRACE_SECONDS) == [behind]
        queued.release(behind)
    assert near_the_head.queued == 100 and near_the_head.dropped is None


def job(run_id: str, priority: int, order: int) -> Job:
    template = builtin_templates()[0]
    request = RunRequest(owner_id=1, template=template, brief="b", workspace=Path("w"),
                         stream="s")
    return Job(run_id, request, priority, order)


def test_the_backlog_orders_by_priority_and_reserves_dedicated_slots() -> None:
    assert [priority_of(f) for f in ({}, {"priorityQueue": True},
                                     {"dedicatedRuntime": True, "priorityQueue": True})] == \
        [0, 1, 2]
    backlog = Backlog(shared_slots=1, dedicated_slots=1)
    for index, (run_id, priority) in enumerate([("a", 0), ("b", 0), ("c", 1), ("d", 2),
                                                ("e", 2)]):
        backlog.push(job(run_id, priority, index))
    started = backlog.startable()
    assert [(j.run_id, j.lane) for j in started] == [("d", "dedicated"), ("e", "shared")]
    assert backlog.startable() == []
    backlog.release("shared")
    assert [j.run_id for j in backlog.startable()] == ["c"]
    assert backlog.remove("b") is not None and backlog.remove("zz") is None
    backlog.release("dedicated")
    assert backlog.startable() == []  # a dedicated slot is not for plain runs
    backlog.release("shared")
    assert [j.run_id for j in backlog.startable()] == ["a"] and len(backlog) == 0
