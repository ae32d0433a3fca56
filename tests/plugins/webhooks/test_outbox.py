"""The outbox on a real database: fan-out, claims and leases, settling, release and purge."""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator
from datetime import timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
import trio
from sqlalchemy import Connection, func, select, update

from plugins.webhooks.claims import claim_due
from plugins.webhooks.outbox import (
    Job,
    Outcome,
    give_back,
    purge_finished,
    release_claims,
    write_event,
)
from plugins.webhooks.settling import settle
from plugins.webhooks.subscriptions import (
    create_subscription,
    delete_subscription,
    list_subscriptions,
)
from plugins.webhooks.tables import attempts, deliveries, events
from runtime.bootstrap import open_service
from runtime.events import OutboundEvent
from runtime.service import Service
from runtime.users import create_user
from runtime.wire import as_utc, utcnow
from tests.support.events import emit_now
from tests.support.server import make_settings
from tests.support.webhooks import webhook_env


@pytest.fixture
async def service(tmp_path: Path, database_url: str) -> AsyncIterator[Service]:
    env = webhook_env(tmp_path / "var", database_url)
    async with open_service(make_settings(env), migrate=True, environ=env) as opened:
        yield opened


async def new_user(service: Service, *urls: tuple[str, list[str]]) -> int:
    def create(connection: Connection) -> int:
        user = create_user(connection, display_name="tester")
        for url, wanted in urls:
            host = url.split("/")[2]
            create_subscription(connection, user.id, url, host, wanted, limit=20)
        return user.id

    return await service.db.write(create)


async def emit(service: Service, user_id: int, count: int = 1, name: str = "payout.sent"
               ) -> list[str]:
    return [(await emit_now(service, user_id=user_id, name=name, data={"n": index})).id
            for index in range(count)]


async def claim(service: Service, owner: str, room: int, *, per_host: int = 10,
                lease: float = 30.0, host_room: dict[str, int] | None = None) -> list[Job]:
    result = await service.db.write(lambda c: claim_due(
        c, owner=owner, lease_seconds=lease, room=room, host_room=host_room or {},
        per_host=per_host))
    return result.jobs


def outcome(job: Job, error: str | None = None, *, permanent: bool = False) -> Outcome:
    return Outcome(job=job, started_at=utcnow(), duration_ms=3, status_code=None if error else 200,
                   error=error, permanent=permanent)


async def delivery_row(service: Service, job: Job) -> Any:
    return await service.db.read(lambda c: c.execute(
        select(deliveries).where(deliveries.c.id == job.delivery_id)).one())


async def test_an_event_fans_out_to_the_subscriptions_that_want_it_inside_the_emitters_transaction(
        service: Service) -> None:
    user = await new_user(service, ("https://a.example/1", []),
                          ("https://a.example/2", ["payout.sent"]),
                          ("https://b.example/3", ["payout.failed"]))
    [sent] = await emit(service, user)

    def emit_then_fail(connection: Connection) -> None:
        service.emit_event(connection, user_id=user, name="payout.failed", data={})
        raise RuntimeError("the change that caused the event fails")

    with pytest.raises(RuntimeError):
        await service.db.write(emit_then_fail)
    with pytest.raises(ValueError, match="decimals"):  # an amount it cannot send exactly
        await emit_now(service, user_id=user, name="payout.failed",
                             data={"amount_flow": Decimal("0.0000001")})
    rows = await service.db.read(lambda c: c.execute(
        select(deliveries.c.event_id, deliveries.c.subscription_id, deliveries.c.state,
               deliveries.c.retries_left)).all())
    stored = await service.db.read(lambda c: c.execute(select(events.c.id)).scalars().all())

    subscriptions = await service.db.read(list_subscriptions, user)
    assert sorted((row.event_id, row.subscription_id) for row in rows) == \
        [(sent, subscriptions[0].id), (sent, subscriptions[1].id)]
    assert {(row.state, row.retries_left) for row in rows} == {("pending", 3)}
    assert stored == [sent]  # the rolled-back event and the refused one left nothing


async def test_claims_honour_room_per_host_caps_and_other_owners_leases(
        service: Service) -> None:
    user = await new_user(service, ("https://a.example/1", []), ("https://a.example/2", []),
                          ("https://b.example/3", []))
    await emit(service, user, 4)  # 12 deliveries: 8 to a.example, 4 to b.example

    first = await claim(service, "one", room=5, per_host=2)
    second = await claim(service, "two", room=10, per_host=3)
    only_b = await claim(service, "three", room=10, host_room={"a.example": 0})
    rest = await claim(service, "four", room=50)

    assert sorted(job.host for job in first) == ["a.example"] * 2 + ["b.example"] * 2
    assert sorted(job.host for job in second) == ["a.example"] * 3 + ["b.example"] * 2
    assert [job.host for job in only_b] == []  # b.example's 4 went to one and two
    assert len(rest) == 3 and {job.host for job in rest} == {"a.example"}
    claimed = [job.delivery_id for job in first + second + rest]
    assert len(claimed) == len(set(claimed)) == 12  # nobody got a delivery twice
    assert all(job.body.startswith(b'{"id":"evt_') for job in rest)
    assert await claim(service, "five", room=50) == []


async def lease_runs_out(service: Service, job: Job) -> None:
    """Move ``job``'s lease end into the past, as time passing would (no wall-clock race)."""
    await service.db.write(lambda c: c.execute(update(deliveries).where(
        deliveries.c.id == job.delivery_id).values(claimed_until=utcnow() - timedelta(seconds=1))))


async def test_a_lease_that_runs_out_comes_back_and_a_released_one_at_once(
        service: Service) -> None:
    user = await new_user(service, ("https://a.example/1", []))
    await emit(service, user, 2)

    short = await claim(service, "crashed", room=1)
    kept = await claim(service, "stopping", room=1)
    assert await claim(service, "other", room=5) == []
    await lease_runs_out(service, short[0])
    taken_over = await claim(service, "other", room=5)
    released = await service.db.write(release_claims, "stopping")
    again = await claim(service, "other", room=5)
    stale = await service.db.write(lambda c: settle(
        c, [outcome(short[0])], owner="crashed", max_retries=3, retry_delay=lambda n: 0.0))

    assert [job.delivery_id for job in taken_over] == [short[0].delivery_id]
    assert released == 1 and [job.delivery_id for job in again] == [kept[0].delivery_id]
    assert stale == ["stale"]  # the crashed owner's late outcome changes nothing
    assert (await delivery_row(service, short[0])).claim_owner == "other"


async def test_a_claim_given_back_unsent_leaves_no_attempt_and_is_claimable_at_once(
        service: Service) -> None:
    """A dispatcher hands back what it claimed ahead but never sent: the lease goes, the
    attempt is uncounted and its ``unknown`` row deleted; a claim it no longer holds is left
    alone."""
    user = await new_user(service, ("https://a.example/1", []))
    await emit(service, user, 2)
    unsent, lost = await claim(service, "one", room=2)
    await lease_runs_out(service, lost)
    [taken_over] = await claim(service, "other", room=1)

    given = await service.db.write(give_back, [unsent, lost], "one")
    [again] = await claim(service, "other", room=1)
    history = await service.db.read(lambda c: c.execute(
        select(attempts.c.delivery_id, attempts.c.number, attempts.c.outcome)).all())

    assert given == 1 and taken_over.delivery_id == lost.delivery_id
    assert (again.delivery_id, again.number) == (unsent.delivery_id, 1)
    assert sorted(tuple(row) for row in history) == sorted([
        (unsent.delivery_id, 1, "unknown"), (lost.delivery_id, 1, "unknown"),
        (lost.delivery_id, 2, "unknown")])


async def test_every_claimed_attempt_is_in_the_history_until_settled_and_after(
        service: Service) -> None:
    """An attempt is recorded when it is claimed, so one whose process dies after sending is
    still in the history (``unknown``); a late answer from a lost lease is recorded but moves
    nothing; an owner never takes its own expired lease back (it still holds the attempt)."""
    user = await new_user(service, ("https://a.example/1", []))
    await emit(service, user)
    [first] = await claim(service, "died", room=1)
    await lease_runs_out(service, first)
    assert await claim(service, "died", room=1) == []
    [second] = await claim(service, "other", room=1)
    results = [await service.db.write(lambda c, job=job, owner=owner, error=error: settle(
        c, [outcome(job, error)], owner=owner, max_retries=3, retry_delay=lambda n: 0.0))
        for job, owner, error in ((second, "other", "HTTP 503"), (first, "died", None))]
    [third] = await claim(service, "other", room=1)
    in_flight = await service.db.read(lambda c: c.execute(
        select(attempts.c.number, attempts.c.outcome, attempts.c.status_code)
        .where(attempts.c.delivery_id == first.delivery_id).order_by(attempts.c.number)).all())

    assert (first.number, second.number, third.number) == (1, 2, 3)
    assert results == [["retry"], ["stale"]]
    assert [tuple(row) for row in in_flight] == \
        [(1, "unknown", 200), (2, "retry", None), (3, "unknown", None)]


async def test_settling_retries_with_the_next_backoff_index_then_fails_and_records_last_error(
        service: Service) -> None:
    user = await new_user(service, ("https://a.example/1", []))
    [event_id] = await emit(service, user)
    asked: list[int] = []
    results: list[str] = []

    def retry_delay(index: int) -> float:
        asked.append(index)
        return 0.0

    for _ in range(4):
        [job] = await claim(service, "one", room=1)
        results += await service.db.write(lambda c, job=job: settle(
            c, [outcome(job, "HTTP 500")], owner="one", max_retries=3,
            retry_delay=retry_delay))
        row = await delivery_row(service, job)
    [subscription] = await service.db.read(list_subscriptions, user)

    assert asked == [0, 1, 2] and results == ["retry", "retry", "retry", "failed"]
    assert row.state == "failed" and row.attempts == 4 and row.claim_owner is None
    assert subscription.last_error == f"HTTP 500 (event {event_id}, attempt 4)"


async def test_the_retry_waits_the_delay_drawn_for_its_index(service: Service) -> None:
    user = await new_user(service, ("https://a.example/1", []))
    await emit(service, user)
    [job] = await claim(service, "one", room=1)

    before = utcnow()
    await service.db.write(lambda c: settle(c, [outcome(job, "HTTP 500")], owner="one",
                                            max_retries=3, retry_delay=lambda n: 7.5))
    after = utcnow()
    due = as_utc((await delivery_row(service, job)).next_attempt_at)

    assert before + timedelta(seconds=7.5) <= due <= after + timedelta(seconds=7.5)
    assert await claim(service, "one", room=1) == []  # not due before its time


async def test_a_permanent_failure_is_not_retried_and_success_delivers(service: Service) -> None:
    user = await new_user(service, ("https://a.example/1", []))
    await emit(service, user, 2)
    refused, fine = await claim(service, "one", room=2)

    results = await service.db.write(lambda c: settle(
        c, [outcome(refused, "refused: host is loopback", permanent=True), outcome(fine)],
        owner="one", max_retries=3, retry_delay=lambda n: 0.0))

    assert results == ["failed", "delivered"]
    assert (await delivery_row(service, refused)).state == "failed"
    delivered = await delivery_row(service, fine)
    assert delivered.state == "delivered" and delivered.finished_at is not None


async def test_purge_deletes_old_finished_events_with_their_deliveries_but_nothing_pending(
        service: Service) -> None:
    user = await new_user(service, ("https://a.example/1", []))
    old_done, old_pending, recent = await emit(service, user, 3)
    [job] = [job for job in await claim(service, "one", room=3) if job.event_id == old_done]
    await service.db.write(lambda c: settle(c, [outcome(job)], owner="one", max_retries=3,
                                            retry_delay=lambda n: 0.0))
    long_ago = utcnow() - timedelta(days=40)
    await service.db.write(lambda c: c.execute(update(events).where(
        events.c.id.in_([old_done, old_pending])).values(created_at=long_ago)))

    purged = await service.db.write(purge_finished, utcnow() - timedelta(days=30))
    left = await service.db.read(lambda c: c.execute(select(events.c.id)).scalars().all())
    rows = await service.db.read(lambda c: c.execute(
        select(func.count()).select_from(deliveries)).scalar_one())

    assert purged == 1 and sorted(left) == sorted([old_pending, recent]) and rows == 2


async def test_a_subscription_read_for_a_fan_out_cannot_be_deleted_before_the_insert(
        service: Service) -> None:
    """``fan_out`` reads the subscriptions with ``lock=True`` and then inserts deliveries that
    reference them; a delete committed in between would fail the emitter's own transaction on
    the foreign key. The emitter here lingers exactly between those two steps."""
    user = await new_user(service, ("https://a.example/1", []))
    [subscription] = await service.db.read(list_subscriptions, user)
    read, proceed = threading.Event(), threading.Event()
    deleted = trio.Event()
    event = OutboundEvent(id=f"evt_{'0' * 32}", name="payout.sent", user_id=user,
                          created_at=utcnow(), data={})

    def read_linger_insert(connection: Connection) -> None:
        wanted = [found.id for found in list_subscriptions(connection, user, lock=True)]
        read.set()
        proceed.wait(10)
        write_event(connection, event, wanted, retries=3)

    async def delete() -> None:
        await service.db.write(delete_subscription, user, subscription.id)
        deleted.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(service.db.write, read_linger_insert)
        await trio.to_thread.run_sync(read.wait, 10)
        nursery.start_soon(delete)
        await trio.sleep(0.3)
        waited = not deleted.is_set()
        proceed.set()
    left = await service.db.read(lambda c: c.execute(
        select(func.count()).select_from(deliveries)).scalar_one())

    assert waited  # the delete waited for the emitter, whose insert then succeeded...
    assert deleted.is_set() and left == 0  # ...and went after it, taking the delivery along


async def test_a_settled_batch_fills_in_every_attempt_row_of_the_history(
        service: Service) -> None:
    """One statement records a whole batch's answers: each row gets its own status, error
    and outcome, including a batch whose statuses are all missing (connection errors)."""
    user = await new_user(service, ("https://a.example/1", []))
    await emit(service, user, 5)
    fine, broken, busy, lost, timed_out = await claim(service, "one", room=5)
    answered = [outcome(fine), outcome(broken, "connection refused"),
                Outcome(job=busy, started_at=utcnow(), duration_ms=9, status_code=503,
                        error="HTTP 503")]
    no_status = [outcome(lost, "connection reset"), outcome(timed_out, "timed out")]

    results = await service.db.write(lambda c: settle(
        c, answered, owner="one", max_retries=3, retry_delay=lambda n: 0.0))
    results += await service.db.write(lambda c: settle(
        c, no_status, owner="one", max_retries=3, retry_delay=lambda n: 0.0))
    history = await service.db.read(lambda c: c.execute(
        select(attempts.c.delivery_id, attempts.c.number, attempts.c.status_code,
               attempts.c.error, attempts.c.outcome, attempts.c.duration_ms)).all())

    assert results == ["delivered", "retry", "retry", "retry", "retry"]
    assert sorted(tuple(row) for row in history) == sorted([
        (fine.delivery_id, 1, 200, None, "delivered", 3),
        (broken.delivery_id, 1, None, "connection refused", "retry", 3),
        (busy.delivery_id, 1, 503, "HTTP 503", "retry", 9),
        (lost.delivery_id, 1, None, "connection reset", "retry", 3),
        (timed_out.delivery_id, 1, None, "timed out", "retry", 3)])
