"""Nested supervision: a part (a plugin, one chain) past its restart intensity goes down, is
listed as failed and starts again after a long backoff while the rest runs; only the core's
supervisor giving up stops the service.

Timing runs on ``MockClock(autojump_threshold=0)``: sleeps take no real time and the clock
readings are exact.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
import trio
from trio.testing import MockClock

from runtime.actors import ActorSpec, Mailbox, PartSpec, Registry
from runtime.config import SupervisorSettings
from runtime.metrics import Metrics
from runtime.supervisor import Supervisor, current_supervisor

SETTINGS = SupervisorSettings(max_restarts=3, within_seconds=10, backoff_initial_seconds=0.1,
                              backoff_max_seconds=0.5, part_max_restarts=2,
                              part_retry_seconds=60, part_retry_max_seconds=200)


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


def steady(name: str, log: list[str]) -> ActorSpec:
    async def run(mailbox: Mailbox, *, task_status: trio.TaskStatus[Any] = trio.TASK_STATUS_IGNORED
                  ) -> None:
        log.append(f"start {name}")
        try:
            task_status.started()
            await trio.sleep_forever()
        finally:
            log.append(f"stop {name}")

    return ActorSpec(name=name, run=run)


def crashing(name: str, starts: list[float], *, healthy_after: int | None = None) -> ActorSpec:
    """Crashes 1 s after each start; from start number ``healthy_after`` on it stays up."""

    async def run(mailbox: Mailbox, *, task_status: trio.TaskStatus[Any] = trio.TASK_STATUS_IGNORED
                  ) -> None:
        starts.append(trio.current_time())
        task_status.started()
        if healthy_after is not None and len(starts) >= healthy_after:
            await trio.sleep_forever()
        await trio.sleep(1)
        raise RuntimeError(f"{name} crashes")

    return ActorSpec(name=name, run=run)


def _sample(metrics: Metrics, name: str, **labels: str) -> float | None:
    return metrics.registry.get_sample_value(name, labels)


async def test_a_part_past_its_intensity_goes_down_and_is_retried_after_a_long_backoff(
        clock: MockClock) -> None:
    starts: list[float] = []
    log: list[str] = []
    async with supervising() as (supervisor, registry, metrics):
        await supervisor.start(steady("core.keeper", log))
        await supervisor.start_part(PartSpec("billing", (steady("billing.ledger", log),
                                                         crashing("billing.poller", starts))))
        await supervisor.start_part(PartSpec("auth", (steady("auth.view", log),)))
        await trio.sleep(5)
        # 3 runs: the first and part_max_restarts=2 restarts, then the part is down.
        assert len(starts) == 3
        assert supervisor.failed_parts() == {
            "billing": "actor billing.poller crashed: more than 2 restarts within 10 s"}
        assert _sample(metrics, "flowsvc_part_failed", part="billing") == 1
        assert _sample(metrics, "flowsvc_part_failed", part="auth") == 0
        assert "stop billing.ledger" in log  # the whole part is down...
        assert registry.get("billing.ledger") is None and registry.get("billing.poller") is None
        assert registry.get("auth.view") is not None  # ...the rest runs
        assert registry.get("core.keeper") is not None
        assert not supervisor.gave_up.is_set()
        # Down at 3.3 s (crashes at 1, 2.1 and 3.3 after backoffs of 0.1 and 0.2 s).
        await trio.sleep(58)
        assert len(starts) == 3  # not before part_retry_seconds
        await trio.sleep(1)
        assert len(starts) == 4 and starts[3] == pytest.approx(3.3 + 60)
        assert log.count("start billing.ledger") == 2
        await trio.sleep(6)
        assert len(starts) == 6  # down again at 66.6 s: the next retry waits twice as long
        assert _sample(metrics, "flowsvc_part_failures_total", part="billing") == 2
        await trio.sleep(116)
        assert len(starts) == 6
        await trio.sleep(1)
        assert len(starts) == 7 and starts[6] == pytest.approx(66.6 + 120)
    assert log[-3:] == ["stop auth.view", "stop billing.ledger", "stop core.keeper"]


async def test_a_part_that_recovers_is_no_longer_listed(clock: MockClock) -> None:
    starts: list[float] = []
    async with supervising() as (supervisor, registry, metrics):
        await supervisor.start_part(PartSpec("flaky", (crashing("flaky.actor", starts,
                                                                healthy_after=4),)))
        await trio.sleep(5)
        assert set(supervisor.failed_parts()) == {"flaky"}
        await trio.sleep(60)
        assert len(starts) == 4 and supervisor.failed_parts() == {}
        assert _sample(metrics, "flowsvc_part_failed", part="flaky") == 0
        assert registry.get("flaky.actor") is not None


async def test_the_core_giving_up_stops_the_service_whatever_the_parts_do(
        clock: MockClock) -> None:
    starts: list[float] = []
    log: list[str] = []
    async with supervising() as (supervisor, _, _metrics):
        await supervisor.start_part(PartSpec("auth", (steady("auth.view", log),)))
        await supervisor.start(crashing("core.housekeeper", starts))
        with trio.fail_after(60):
            await supervisor.gave_up.wait()
        assert len(starts) == 4  # the core's own intensity: max_restarts=3
        assert supervisor.reason == ("actor core.housekeeper crashed: more than 3 restarts "
                                     "within 10 s")
        assert supervisor.failed_parts() == {}


async def test_a_nested_part_goes_down_alone(clock: MockClock) -> None:
    """A chain inside the chain plugin: one chain down, the plugin's other actors and the
    other chain run on."""
    starts: list[float] = []
    log: list[str] = []
    async with supervising() as (supervisor, registry, _):
        await supervisor.start_part(PartSpec("chain", (
            steady("chain.rpc", log),
            PartSpec("chain.bsc", (crashing("chain.indexer.bsc", starts),)),
            PartSpec("chain.base", (steady("chain.indexer.base", log),)))))
        await trio.sleep(5)
        assert supervisor.failed_parts() == {
            "chain.bsc": "actor chain.indexer.bsc crashed: more than 2 restarts within 10 s"}
        assert supervisor.running() == ["chain.rpc", "chain.indexer.base"]
        await supervisor.stop_all()
        assert log[-2:] == ["stop chain.indexer.base", "stop chain.rpc"]  # in reverse


async def test_a_boot_failure_of_a_part_fails_its_first_start_as_raised(
        clock: MockClock) -> None:
    async def broken(mailbox: Mailbox, *,
                     task_status: trio.TaskStatus[Any] = trio.TASK_STATUS_IGNORED) -> None:
        raise OSError("cannot open the device")

    log: list[str] = []
    async with supervising() as (supervisor, registry, _):
        with pytest.raises(OSError, match="cannot open the device"):  # not a group
            await supervisor.start_part(PartSpec("device", (
                steady("device.first", log), ActorSpec(name="device.broken", run=broken))))
        assert log == ["start device.first", "stop device.first"]
        assert registry.addresses() == [] and supervisor.running() == []
        await supervisor.start_part(PartSpec("device", (steady("device.first", log),)))
        assert supervisor.running() == ["device.first"]  # the name is free again


async def test_a_boot_failure_on_a_retry_keeps_the_part_down(clock: MockClock) -> None:
    starts: list[float] = []

    async def boots_once(mailbox: Mailbox, *,
                         task_status: trio.TaskStatus[Any] = trio.TASK_STATUS_IGNORED) -> None:
        starts.append(trio.current_time())
        if len(starts) > 1:
            raise OSError("the device is gone")
        task_status.started()
        await trio.sleep(1)
        raise RuntimeError("crash")

    settings = SETTINGS.model_copy(update={"part_max_restarts": 0})
    async with supervising(settings) as (supervisor, _, metrics):
        await supervisor.start_part(PartSpec("device", (ActorSpec("device.io", boots_once),)))
        await trio.sleep(2)
        assert "device" in supervisor.failed_parts()
        await trio.sleep(61)
        assert len(starts) == 2
        assert supervisor.failed_parts() == {"device": "it failed to start (OSError)"}
        assert _sample(metrics, "flowsvc_part_failures_total", part="device") == 2


async def test_the_retry_backoff_starts_over_after_a_long_healthy_run(clock: MockClock) -> None:
    starts: list[float] = []
    seventh = trio.Event()

    async def run(mailbox: Mailbox, *, task_status: trio.TaskStatus[Any] = trio.TASK_STATUS_IGNORED
                  ) -> None:
        starts.append(trio.current_time())
        task_status.started()
        if len(starts) == 7:
            seventh.set()
        # Every start crashes at once but the 4th, which runs 300 s (past part_retry_max).
        await trio.sleep(300 if len(starts) == 4 else 0)
        raise RuntimeError("crash")

    async with supervising() as (supervisor, _, _metrics):
        await supervisor.start_part(PartSpec("cyclic", (ActorSpec("cyclic.actor", run),)))
        with trio.fail_after(1000):
            await seventh.wait()
        # Down after start 3, retried 60 s later; start 4 is healthy 300 s, then it and two
        # restarts crash: down again, and retried 60 s later again, not 120 s.
        assert starts[3] - starts[2] == pytest.approx(60)
        assert starts[4] - starts[3] == pytest.approx(300 + 0.1)
        assert starts[6] - starts[5] == pytest.approx(60)


async def test_children_an_actor_starts_under_its_current_supervisor_stay_in_its_part(
        clock: MockClock) -> None:
    """An actor that starts actors of its own (the projects hub's broadcasters) starts them
    under ``current_supervisor()``: its part's, so their crash loop takes that part down and
    never the service."""
    starts: list[float] = []
    seen: list[Supervisor] = []

    def starter() -> ActorSpec:
        async def run(mailbox: Mailbox, *,
                      task_status: trio.TaskStatus[Any] = trio.TASK_STATUS_IGNORED) -> None:
            seen.append(current_supervisor())
            await current_supervisor().start(crashing("streams.one", starts))
            task_status.started()
            await trio.sleep_forever()

        return ActorSpec(name="streams.hub", run=run)

    async with supervising() as (supervisor, registry, _):
        await supervisor.start_part(PartSpec("streams", (starter(),)))
        await trio.sleep(5)
        assert seen[0] is not supervisor and seen[0].name == "streams"
        assert supervisor.failed_parts() == {
            "streams": "actor streams.one crashed: more than 2 restarts within 10 s"}
        assert registry.get("streams.hub") is None and not supervisor.gave_up.is_set()
    with pytest.raises(LookupError):
        current_supervisor()
