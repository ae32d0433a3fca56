"""The one_for_one supervisor: order, restarts with backoff, intensity, restart types.

Timing runs on ``MockClock(autojump_threshold=0)`` (pytest-trio's ``autojump_clock``):
sleeps take no real time and the clock readings are exact. Every test asks for that
clock as an argument (pytest-trio only installs a clock a test function receives).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
import trio
from trio.testing import MockClock

from runtime.actors import ActorSpec, Mailbox, Registry, RestartType, serve_mailbox
from runtime.config import SupervisorSettings
from runtime.errors import Unavailable
from runtime.metrics import Metrics
from runtime.supervisor import Supervisor

SETTINGS = SupervisorSettings(max_restarts=3, within_seconds=10, backoff_initial_seconds=0.1,
                              backoff_max_seconds=0.5)


@asynccontextmanager
async def supervising(settings: SupervisorSettings = SETTINGS
                      ) -> AsyncIterator[tuple[Supervisor, Registry, Metrics]]:
    registry, metrics = Registry(), Metrics()
    async with trio.open_nursery() as nursery:
        supervisor = Supervisor(nursery, settings, registry, metrics)
        yield supervisor, registry, metrics
        await supervisor.stop_all()


@pytest.fixture
def clock(autojump_clock: MockClock) -> MockClock:
    return autojump_clock


def _restarts(metrics: Metrics, name: str) -> float:
    value = metrics.registry.get_sample_value("flowsvc_actor_restarts_total", {"actor": name})
    return value or 0.0


def recorder(name: str, log: list[str]) -> ActorSpec:
    async def run(mailbox: Mailbox, *, task_status: trio.TaskStatus[Any] = trio.TASK_STATUS_IGNORED
                  ) -> None:
        log.append(f"start {name}")
        try:
            task_status.started()
            await trio.sleep_forever()
        finally:
            log.append(f"stop {name}")

    return ActorSpec(name=name, run=run)


def crasher(name: str, starts: list[float], *, restart: RestartType = "permanent",
            crash_after: float = 0.0, returns: bool = False, runs: int | None = None,
            ran: trio.Event | None = None) -> ActorSpec:
    """An actor that records when it starts, then crashes (or returns) after ``crash_after``.

    :param runs: after this many starts it stays up and sets ``ran``.
    """

    async def run(mailbox: Mailbox, *, task_status: trio.TaskStatus[Any] = trio.TASK_STATUS_IGNORED
                  ) -> None:
        starts.append(trio.current_time())
        task_status.started()
        if len(starts) == runs:
            assert ran is not None
            ran.set()
            await trio.sleep_forever()
        await trio.sleep(crash_after)
        if not returns:
            raise RuntimeError(f"{name} crashes")

    return ActorSpec(name=name, run=run, restart=restart)


async def test_children_start_in_order_and_stop_in_reverse(clock: MockClock) -> None:
    log: list[str] = []
    async with supervising() as (supervisor, registry, _):
        for name in ("a", "b", "c"):
            await supervisor.start(recorder(name, log))
        assert log == ["start a", "start b", "start c"]
        assert supervisor.running() == ["a", "b", "c"]
        assert registry.lookup("b").name == "b"
        await supervisor.stop_all()
        assert log[3:] == ["stop c", "stop b", "stop a"]
        assert supervisor.running() == []
        with pytest.raises(Unavailable):
            registry.lookup("a")


async def test_duplicate_names_are_refused(clock: MockClock) -> None:
    log: list[str] = []
    async with supervising() as (supervisor, registry, _):
        first = await supervisor.start(recorder("only", log))
        with pytest.raises(ValueError, match="'only' is already running"):
            await supervisor.start(recorder("only", log))
        assert log == ["start only"]
        assert registry.lookup("only") is first


async def test_a_boot_failure_reaches_the_starter_and_leaves_nothing(clock: MockClock) -> None:
    async def broken(mailbox: Mailbox, *,
                     task_status: trio.TaskStatus[Any] = trio.TASK_STATUS_IGNORED) -> None:
        raise OSError("cannot open the device")

    async with supervising() as (supervisor, registry, metrics):
        with pytest.raises(OSError, match="cannot open the device"):
            await supervisor.start(ActorSpec(name="broken", run=broken))
        assert supervisor.running() == []
        assert registry.get("broken") is None
        assert _restarts(metrics, "broken") == 0
        log: list[str] = []
        await supervisor.start(recorder("broken", log))  # the name is free again
        assert log == ["start broken"]


async def test_a_crashed_actor_is_restarted_with_exponential_backoff(clock: MockClock) -> None:
    starts: list[float] = []
    settings = SETTINGS.model_copy(update={"max_restarts": 10, "within_seconds": 100})
    async with supervising(settings) as (supervisor, _, metrics):
        ran = trio.Event()
        await supervisor.start(crasher("flaky", starts, runs=6, ran=ran))
        await ran.wait()
        gaps = [round(b - a, 6) for a, b in zip(starts, starts[1:], strict=False)]
        assert gaps == [0.1, 0.2, 0.4, 0.5, 0.5]  # doubling, capped at backoff_max_seconds
        assert _restarts(metrics, "flaky") == 5
        assert not supervisor.gave_up.is_set()


async def test_the_caller_of_a_crashing_actor_gets_unavailable_at_once(clock: MockClock) -> None:
    async def fragile(mailbox: Mailbox, *,
                      task_status: trio.TaskStatus[Any] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        async for envelope in mailbox:
            if envelope.message == "explode":
                raise RuntimeError("internal detail: password=hunter2")
            envelope.reply(f"ok {envelope.message}")

    async with supervising() as (supervisor, _, metrics):
        address = await supervisor.start(ActorSpec(name="fragile", run=fragile))
        began = trio.current_time()
        with pytest.raises(Unavailable) as caught:
            await address.call("explode", timeout=60)
        assert trio.current_time() == began  # not after the timeout: at once
        assert caught.value.message == "actor fragile crashed"  # the cause stays in the log
        assert await address.call("again", timeout=5) == "ok again"  # same address, restarted
        assert _restarts(metrics, "fragile") == 1


async def test_too_many_restarts_give_up_with_the_reason(clock: MockClock) -> None:
    starts: list[float] = []
    async with supervising() as (supervisor, registry, metrics):
        address = await supervisor.start(crasher("doomed", starts))
        with trio.fail_after(60):
            await supervisor.gave_up.wait()
        assert len(starts) == 4  # the first run and max_restarts=3 restarts
        assert supervisor.reason == "actor doomed crashed: more than 3 restarts within 10 s"
        assert _restarts(metrics, "doomed") == 3
        assert registry.get("doomed") is None
        with pytest.raises(Unavailable, match="doomed is stopped"):
            await address.call("anyone?", timeout=5)


async def test_restarts_spread_over_time_do_not_give_up(clock: MockClock) -> None:
    starts: list[float] = []
    async with supervising() as (supervisor, _, _metrics):
        await supervisor.start(crasher("rare", starts, crash_after=4))
        await trio.sleep(45)
        assert len(starts) >= 9
        assert not supervisor.gave_up.is_set()  # never more than 3 restarts within 10 s


async def test_backoff_starts_over_after_a_long_healthy_run(clock: MockClock) -> None:
    starts: list[float] = []
    settings = SETTINGS.model_copy(update={"max_restarts": 100})
    sixth = trio.Event()

    async def run(mailbox: Mailbox, *, task_status: trio.TaskStatus[Any] = trio.TASK_STATUS_IGNORED
                  ) -> None:
        starts.append(trio.current_time())
        task_status.started()
        if len(starts) == 6:
            sixth.set()
        await trio.sleep(0 if len(starts) < 5 else 60)  # a crash loop, then a long run
        raise RuntimeError("crash")

    async with supervising(settings) as (supervisor, _, _metrics):
        await supervisor.start(ActorSpec(name="recovering", run=run))
        await sixth.wait()
        assert starts[4] - starts[3] == pytest.approx(0.5)
        assert starts[5] - starts[4] == pytest.approx(60 + 0.1)


@pytest.mark.parametrize(("restart", "returns", "runs"), [
    ("permanent", True, 3),
    ("permanent", False, 3),
    ("transient", True, 1),
    ("transient", False, 3),
    ("temporary", True, 1),
    ("temporary", False, 1),
])
async def test_restart_types(restart: RestartType, returns: bool, runs: int,
                             clock: MockClock) -> None:
    starts: list[float] = []
    settings = SETTINGS.model_copy(update={"max_restarts": 100})
    async with supervising(settings) as (supervisor, registry, _):
        await supervisor.start(crasher("child", starts, restart=restart, crash_after=1,
                                       returns=returns))
        await trio.sleep(2.35)
        assert len(starts) == runs
        assert (registry.get("child") is not None) == (runs > 1)


async def test_stop_closes_the_address_and_fails_queued_callers(clock: MockClock) -> None:
    async def busy(mailbox: Mailbox, *,
                   task_status: trio.TaskStatus[Any] = trio.TASK_STATUS_IGNORED) -> None:
        async def handle(message: Any) -> Any:
            await trio.sleep(100)
            return message

        task_status.started()
        await serve_mailbox(mailbox, handle)

    failures: list[str] = []
    async with supervising() as (supervisor, registry, metrics):
        address = await supervisor.start(ActorSpec(name="busy", run=busy, mailbox_size=4))

        async def call() -> None:
            try:
                await address.call("job", timeout=1000)
            except Unavailable as exc:
                failures.append(exc.message)

        async with trio.open_nursery() as callers:
            for _ in range(3):
                callers.start_soon(call)
            await trio.sleep(1)
            assert metrics.registry.get_sample_value(
                "flowsvc_actor_mailbox_depth", {"actor": "busy"}) == 2
            began = trio.current_time()
            await supervisor.stop("busy")
        assert trio.current_time() == began
        assert failures == ["actor busy is stopped"] * 3
        assert registry.get("busy") is None
        assert metrics.registry.get_sample_value(
            "flowsvc_actor_mailbox_depth", {"actor": "busy"}) is None


async def test_stop_waits_at_most_the_shutdown_timeout(clock: MockClock) -> None:
    finished: list[float] = []

    async def stubborn(mailbox: Mailbox, *,
                       task_status: trio.TaskStatus[Any] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        try:
            await trio.sleep_forever()
        finally:
            with trio.CancelScope(shield=True):
                await trio.sleep(30)  # a slow cleanup
            finished.append(trio.current_time())

    async with supervising() as (supervisor, _, _metrics):
        await supervisor.start(ActorSpec(name="stubborn", run=stubborn, shutdown_timeout=2))
        began = trio.current_time()
        await supervisor.stop("stubborn")
        assert trio.current_time() - began == pytest.approx(2)
        assert supervisor.running() == []
    assert finished and finished[0] - began == pytest.approx(30)


async def test_stopping_is_not_a_crash_or_a_restart(clock: MockClock,
                                                    caplog: pytest.LogCaptureFixture) -> None:
    async def echo(mailbox: Mailbox, *,
                   task_status: trio.TaskStatus[Any] = trio.TASK_STATUS_IGNORED) -> None:
        async def handle(message: Any) -> Any:
            return message

        task_status.started()
        await serve_mailbox(mailbox, handle)  # returns when its mailbox closes

    async with supervising() as (supervisor, _, metrics):
        await supervisor.start(ActorSpec(name="echo", run=echo))
        await supervisor.stop_all()
        await trio.sleep(10)
        assert _restarts(metrics, "echo") == 0
    assert not [record for record in caplog.records if "echo" in record.getMessage()]


@pytest.mark.parametrize("outage", [
    Unavailable("the database is unavailable"), OSError("connection refused"),
    ExceptionGroup("grouped", [Unavailable("redis is unavailable"), OSError("reset")])],
    ids=["unavailable", "oserror", "group"])
async def test_an_outage_of_any_length_never_exhausts_the_intensity(
        clock: MockClock, outage: BaseException) -> None:
    starts: list[float] = []
    up = trio.Event()

    async def waiting(mailbox: Mailbox, *,
                      task_status: trio.TaskStatus[Any] = trio.TASK_STATUS_IGNORED) -> None:
        starts.append(trio.current_time())
        task_status.started()
        if len(starts) <= 50:  # the dependency is down for a while, then comes back
            raise outage
        up.set()
        await trio.sleep_forever()

    async with supervising() as (supervisor, _, metrics):
        await supervisor.start(ActorSpec(name="dependent", run=waiting))
        with trio.fail_after(600):
            await up.wait()
        assert not supervisor.gave_up.is_set()  # 50 outage restarts, intensity 3 in 10 s
        assert _restarts(metrics, "dependent") == 50
        assert max(b - a for a, b in zip(starts, starts[1:], strict=False)) == pytest.approx(0.5)


async def test_a_bug_after_outages_still_counts_against_the_intensity(clock: MockClock) -> None:
    starts: list[float] = []

    async def broken(mailbox: Mailbox, *,
                     task_status: trio.TaskStatus[Any] = trio.TASK_STATUS_IGNORED) -> None:
        starts.append(trio.current_time())
        task_status.started()
        if len(starts) <= 10:
            raise Unavailable("the database is unavailable")
        raise KeyError("a bug")

    async with supervising() as (supervisor, _, _metrics):
        await supervisor.start(ActorSpec(name="buggy", run=broken))
        with trio.fail_after(600):
            await supervisor.gave_up.wait()
        assert len(starts) == 10 + 4  # the outages, then the first run and 3 counted restarts
        assert supervisor.reason == "actor buggy crashed: more than 3 restarts within 10 s"
