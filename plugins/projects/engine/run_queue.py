"""The run queue actor: runs wait here for a slot, by priority, one queue per process.

``run_slots`` runs execute at once; runs of users with ``dedicatedRuntime`` may also use
one of ``dedicated_slots`` reserved for them, so they never wait behind the others;
``priorityQueue`` runs go ahead of the rest. Within a priority, first come first served.

The queue owns the runs it accepted: it renews their leases while they wait or run, and
ends them ``failed`` if the service stops first. It also ends the runs of processes that
stopped without doing so (expired leases; in the embedded default, every run of an
earlier process at once). Cancellation requests arrive on the shared ``projects.cancel``
channel, so the process holding the run hears them whichever process took the request.

A draining process (``runtime.drain``: it was asked to stop) starts no run: a new one is
refused with 503 ``draining`` (the client's retry reaches another process), the queued ones
are ended ``failed`` at once, and the runs in progress hold the drain until they end (or
until ``service.drain_seconds``, after which the stopping queue ends them).

Outages stop no run: a run taken while the database is down waits for it to start, a run
executing waits at its next commit (``engine.run_publisher``), leases are renewed at the
next interval, and a Redis outage makes the queue resubscribe to cancellations with
backoff (a cancellation published in the seconds before it has resubscribed is lost: the
owner asks again).
"""

from __future__ import annotations

import heapq
import itertools
import logging
import secrets
from typing import Any

import trio
from prometheus_client import Gauge
from sqlalchemy import Connection

from plugins.projects.engine import run_rows
from plugins.projects.engine.ending import RunEnding
from plugins.projects.engine.execute import end_with, execute_run, publisher_for
from plugins.projects.engine.submit import QUEUE, Job, RunRequest, SubmitRun
from plugins.projects.records.notifier import Notify
from plugins.projects.records.projects import set_project_status
from plugins.projects.settings import ProjectsSettings
from runtime.actors import ActorSpec, Mailbox, serve_mailbox
from runtime.backoff import Backoff, outage_cause, until_available
from runtime.contracts.runs import Prepare
from runtime.errors import Draining, Unavailable, is_outage
from runtime.service import Service

log = logging.getLogger("flowsvc.projects.queue")
CANCEL_CHANNEL = "projects.cancel"
ORPHAN_REASON = "the service process holding the run stopped"
NOT_STARTED_REASON = "the service stopped before the run started"
DEDICATED = 2


class Backlog:
    """Queued jobs by priority, and the slots they may take (no I/O: the queue's policy).

    :param shared_slots: slots any run may use.
    :param dedicated_slots: extra slots only ``dedicatedRuntime`` runs (priority 2) use.
    """

    def __init__(self, shared_slots: int, dedicated_slots: int) -> None:
        self._heap: list[tuple[int, int, Job]] = []
        self._free = {"shared": shared_slots, "dedicated": dedicated_slots}

    def __len__(self) -> int:
        return len(self._heap)

    def run_ids(self) -> list[str]:
        return [job.run_id for _, _, job in self._heap]

    def push(self, job: Job) -> None:
        heapq.heappush(self._heap, (-job.priority, job.order, job))

    def remove(self, run_id: str) -> Job | None:
        for index, (_, _, job) in enumerate(self._heap):
            if job.run_id == run_id:
                self._heap.pop(index)
                heapq.heapify(self._heap)
                return job
        return None

    def drain(self) -> list[Job]:
        jobs = [job for _, _, job in sorted(self._heap)]
        self._heap.clear()
        return jobs

    def startable(self) -> list[Job]:
        """Pop the jobs that may start now, each with its ``lane`` set."""
        started = []
        while self._heap:
            job = self._heap[0][2]
            if job.priority >= DEDICATED and self._free["dedicated"] > 0:
                job.lane = "dedicated"
            elif self._free["shared"] > 0:
                job.lane = "shared"
            else:
                break
            self._free[job.lane] -= 1
            heapq.heappop(self._heap)
            started.append(job)
        return started

    def release(self, lane: str) -> None:
        self._free[lane] += 1


def _submit(connection: Connection, job: Job, prepare: Prepare | None, worker: str,
            lease_seconds: float) -> None:
    request = job.request
    run_rows.insert_run(
        connection, run_id=job.run_id, stream=request.stream, project_id=request.project_id,
        owner_id=request.owner_id, template=request.template.name, key_id=request.key_id,
        priority=job.priority, worker=worker, lease_seconds=lease_seconds)
    if prepare is not None:
        prepare(connection, job.run_id)


def _take(connection: Connection, run_id: str) -> bool:
    run = run_rows.mark_running(connection, run_id)
    if run is not None and run.project_id is not None:
        set_project_status(connection, run.project_id, "running")
    return run is not None


class RunQueue:
    """The state of the queue actor of one process; its methods run in the actor's task
    and in the run tasks it starts (one Trio thread, so no locks are needed)."""

    def __init__(self, service: Service, settings: ProjectsSettings, notify: Notify) -> None:
        self.service = service
        self.settings = settings
        self.notify = notify
        self.worker = secrets.token_hex(8)
        self.backlog = Backlog(settings.run_slots, settings.dedicated_slots)
        self.running: dict[str, Job] = {}
        self._order = itertools.count()
        self._nursery: trio.Nursery | None = None

    async def end_unrun(self, stream: str, run_id: str, project_id: int | None,
                        ending: RunEnding) -> None:
        """End a run that never executed here (cancelled while queued, or orphaned).

        A failure is logged, not raised: the run's lease then expires and the next sweep
        (in any process) ends it.
        """
        publisher = publisher_for(self.service, self.settings, stream, run_id, project_id,
                                  self.notify)
        try:
            await end_with(publisher, ending)
        except Exception:
            log.exception("could not end run %s; it is left to the lease sweep", run_id)

    async def _run_job(self, job: Job) -> None:
        try:
            with self.service.drain.hold():
                await self._take_and_execute(job)
        finally:
            self.running.pop(job.run_id, None)
            self.backlog.release(job.lane)
            self.dispatch()

    async def _take_and_execute(self, job: Job) -> None:
        try:
            if await until_available(lambda: self.service.db.write(_take, job.run_id),
                                     what=f"starting run {job.run_id}", log=log):
                await execute_run(self.service, self.settings, job, self.notify)
        except Exception:  # one run's failure must not take the queue and its runs down
            log.exception("run %s failed outside its agent; it is left to the lease sweep",
                          job.run_id)

    def dispatch(self) -> None:
        """Start every queued job a free slot can take (none while draining)."""
        assert self._nursery is not None
        if self.service.drain.draining:
            return
        for job in self.backlog.startable():
            self.running[job.run_id] = job
            self._nursery.start_soon(self._run_job, job)

    def cancel(self, run_id: str) -> bool:
        """Cancel a run this process holds; False when it holds no such run."""
        assert self._nursery is not None
        job = self.backlog.remove(run_id)
        if job is not None:
            self._nursery.start_soon(self.end_unrun, job.request.stream, run_id,
                                     job.request.project_id,
                                     RunEnding("cancelled", "cancelled by the owner"))
            return True
        if run_id in self.running:
            self.running[run_id].cancel_scope.cancel()
            return True
        return False

    async def submit(self, request: RunRequest, prepare: Prepare | None, priority: int) -> str:
        if self.service.drain.draining:
            raise Draining("this process is shutting down and starts no run; retry")
        job = Job(run_rows.new_run_id(), request, priority, next(self._order))
        await self.service.db.write(_submit, job, prepare, self.worker,
                                    self.settings.lease_seconds)
        self.backlog.push(job)
        self.dispatch()
        return job.run_id

    async def handle(self, message: object) -> str:
        if not isinstance(message, SubmitRun):
            raise TypeError(f"{QUEUE} does not understand {message!r}")
        return await self.submit(message.request, message.prepare, message.priority)

    async def sweep(self, *, any_other_worker: bool) -> None:
        """End the live runs of processes that stopped without ending them."""
        for run in await self.service.db.read(run_rows.orphaned_runs, self.worker,
                                              any_other_worker):
            log.warning("ending run %s of a stopped process (worker %s)", run.id, run.worker)
            await self.end_unrun(run.stream, run.id, run.project_id,
                                 RunEnding("failed", ORPHAN_REASON))

    async def keep_leases(self) -> None:
        while True:
            await trio.sleep(self.settings.lease_seconds / 3)
            held = [*self.backlog.run_ids(), *self.running]
            try:
                await self.service.db.write(run_rows.renew_leases, held,
                                            self.settings.lease_seconds)
                await self.sweep(any_other_worker=False)
            except Unavailable:
                log.warning("could not renew run leases: the database is unavailable")

    async def end_queued_on_drain(self) -> None:
        """Once the drain begins, end the runs still queued: none will start here."""
        drain = self.service.drain
        await drain.began.wait()
        with drain.hold():
            for job in self.backlog.drain():
                await self.end_unrun(job.request.stream, job.run_id, job.request.project_id,
                                     RunEnding("failed", NOT_STARTED_REASON))

    async def listen_for_cancels(self, *, task_status: trio.TaskStatus[None]) -> None:
        """Cancel the runs named on ``projects.cancel``; ready once the first subscription
        was tried, resubscribing with backoff after a Redis outage."""
        backoff = Backoff()
        while True:
            try:
                async with self.service.shared.subscribe(CANCEL_CHANNEL) as messages:
                    task_status.started()
                    task_status = trio.TASK_STATUS_IGNORED  # started once, whatever comes
                    backoff.reset()
                    async for run_id in messages:
                        self.cancel(run_id)
            except Exception as exc:
                if not is_outage(exc):
                    raise
                task_status.started()
                task_status = trio.TASK_STATUS_IGNORED
                delay = backoff.next_delay()
                log.warning("cancellations: %s; resubscribing in %.1f s", outage_cause(exc),
                            delay)
                await trio.sleep(delay)

    async def run(self, mailbox: Mailbox, *,
                  task_status: trio.TaskStatus[Any] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            await self.sweep(any_other_worker=self.service.settings.embedded)
            await nursery.start(self.listen_for_cancels)
            nursery.start_soon(self.keep_leases)
            nursery.start_soon(self.end_queued_on_drain)
            task_status.started()
            try:
                await serve_mailbox(mailbox, self.handle)
            finally:
                with trio.CancelScope(shield=True), trio.move_on_after(5):
                    for job in self.backlog.drain():
                        await self.end_unrun(job.request.stream, job.run_id,
                                             job.request.project_id,
                                             RunEnding("failed", NOT_STARTED_REASON))
            nursery.cancel_scope.cancel()


def queue_spec(service: Service, settings: ProjectsSettings, notify: Notify) -> ActorSpec:
    """The run queue actor (``projects.queue``), and its gauge ``flowsvc_project_runs``.

    Message: ``SubmitRun`` (its reply is the run id). Cancellations arrive on the shared
    ``projects.cancel`` channel instead, from whichever process took the request.
    """
    queue = RunQueue(service, settings, notify)
    try:
        gauge = Gauge("flowsvc_project_runs", "Agent runs this process holds, by state",
                      ["state"], registry=service.metrics.registry)
    except ValueError:
        pass  # the spec was built before for this service (``flowsvc plugins`` lists it)
    else:
        gauge.labels(state="queued").set_function(lambda: len(queue.backlog))
        gauge.labels(state="running").set_function(lambda: len(queue.running))
    return ActorSpec(name=QUEUE, run=queue.run, shutdown_timeout=15.0, mailbox_size=256)
