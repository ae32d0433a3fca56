"""The publisher of one run: events are committed in order, then fanned out.

``emit`` only queues an event, so the agent never waits for the database; a writer task
commits whatever is queued in one transaction and only then hands the committed events
to the local broadcaster, the Redis Stream (other processes) and the notifier. An event
is therefore never seen before it is durable, and a restart loses none that anyone saw.
``finish`` commits the last events, ``done`` and the run's end together.

A database outage (``runtime.errors.is_outage``) pauses the run rather than failing it:
events stay queued, in order, and the commit is retried with backoff (``runtime.backoff``)
until the database is back; once ``_MAX_QUEUED`` events wait, the agent waits too. A
commit that failed may still have committed (the connection broke during ``COMMIT``), so
the retry first looks for the run's events past the last ones it knows were committed:
if they are there, that batch (and the run's end with it) committed, and it is fanned out
instead of written again. The stream never holds an event twice. A Redis
outage does not stop the run either: the events are committed and delivered to this
process's subscribers; the Redis mirror misses them (``live.event_log``).

A ``commit`` event of a project run is stored with the commit's files
(``engine.commit_store``), in the transaction that stores the event: what the stream
announces is downloadable from every host. So is a ``screenshot`` event's picture: its file
is read from the workspace and stored (``commit_store.store_screenshot``) with the event.
"""

from __future__ import annotations

import logging
from typing import Any

import trio
from sqlalchemy import Connection

from plugins.projects.engine.agent_loop import SCREENSHOT_PATH
from plugins.projects.engine.commit_store import (
    Snapshot,
    SnapshotReader,
    store_screenshot,
    store_snapshot,
)
from plugins.projects.engine.ending import Ended, RunEnding, record_end, recorded_end
from plugins.projects.engine.workspace import Workspace
from plugins.projects.live import event_log
from plugins.projects.live.event_log import StreamEvent
from plugins.projects.live.hub import deliver_local
from plugins.projects.records.notifier import Milestone, Notify
from runtime.backoff import Backoff, outage_cause
from runtime.errors import is_outage
from runtime.service import Service

log = logging.getLogger("flowsvc.projects.publisher")
_MAX_QUEUED = 500
_FAN_OUT_SECONDS = 10.0
MILESTONE_EVENTS = ("plan", "commit")


class _AlreadyEnded(Exception):
    """The run was ended by someone else (the lease sweeper): its transaction rolls back."""


class RunPublisher:
    """Commits and fans out the events of one run of ``stream``; owned by the run's task.

    :param notify: called (without waiting) with each milestone of a project run.
    :param workspace: the run's workspace, whose commits are stored with their events (a
        project run's).
    """

    def __init__(self, service: Service, *, stream: str, run_id: str, project_id: int | None,
                 keep: int, notify: Notify | None = None,
                 workspace: Workspace | None = None) -> None:
        self._service = service
        self._stream = stream
        self._run_id = run_id
        self._project_id = project_id
        self._keep = keep
        self._notify = notify
        self._queued: list[tuple[str, dict[str, Any]]] = []
        self._wakeup = trio.Event()
        self._lock = trio.Lock()
        self.last_commit_sha: str | None = None
        self.error_emitted = False
        self._last_seq = 0  # the number of this run's newest event known to be committed
        # A failed commit that may have committed all the same: how many queued events
        # it held, and whether it held the run's end.
        self._unsure: tuple[int, bool] | None = None
        self._snapshots: dict[str, Snapshot] = {}  # by sha: the queued commits' snapshots
        self._reader = SnapshotReader(workspace) \
            if workspace is not None and project_id is not None else None

    async def emit(self, name: str, data: dict[str, Any]) -> None:
        """Queue an event of the spec's Project stream (the agent loop's ``emit``)."""
        self._queued.append((name, data))
        if name == "commit":
            self.last_commit_sha = str(data["sha"])
        elif name == "error":
            self.error_emitted = True
        self._wakeup.set()
        if len(self._queued) >= _MAX_QUEUED:
            await self.flush()  # the database is behind: the run waits rather than grow

    async def write_continuously(self) -> None:
        """Commit queued events as they come, until cancelled."""
        while True:
            await self._wakeup.wait()
            self._wakeup = trio.Event()
            await self.flush()

    async def flush(self, ending: RunEnding | None = None) -> Ended | None:
        """Commit every queued event (and, with ``ending``, ``done`` and the run's end),
        then fan them out.

        :return: the recorded end, or None (no ending, or the run had already ended).
        """
        async with self._lock:
            if not self._queued and ending is None:
                return None
            backoff = Backoff()
            while True:
                batch = list(self._queued)
                snapshots = await self._snapshots_of(batch)
                pictures = await self._screenshots_of(batch)
                items = [(name, event_log.encode_data(_published(data))) for name, data in batch]
                try:
                    # A commit under way finishes even if the run is being cancelled, so
                    # that what was committed is also fanned out (no hole in the stream).
                    with trio.CancelScope(shield=True):
                        events, ended, replayed = await self._service.db.write(
                            self._commit, items, snapshots, pictures, ending,
                            self._unsure)
                except _AlreadyEnded:
                    del self._queued[:len(batch)]
                    log.warning("run %s had already ended; %d events dropped", self._run_id,
                                len(items))
                    return None
                except Exception as exc:
                    if not is_outage(exc):
                        raise
                    self._unsure = (len(self._queued), ending is not None)
                    # The events stay queued: waiting here (cancellable) loses none.
                    delay = backoff.next_delay()
                    log.warning("run %s: %d events wait for the database (%s); retrying in "
                                "%.1f s", self._run_id, len(items), outage_cause(exc), delay)
                    await trio.sleep(delay)
                    continue
                with_end = ending is not None if replayed is None else replayed[1]
                taken = len(batch) if replayed is None else replayed[0]
                committed = self._queued[:taken]
                del self._queued[:taken]
                for name, data in committed:
                    if name == "commit":
                        self._snapshots.pop(str(data["sha"]), None)
                self._unsure = None
                if events:
                    self._last_seq = events[-1].seq
                with trio.CancelScope(shield=True), trio.move_on_after(_FAN_OUT_SECONDS):
                    await self._fan_out(events, committed, ended)
                if replayed and (self._queued or (ending is not None and not with_end)):
                    continue  # the failed attempt committed part of this flush: the rest now
                return ended

    async def finish(self, ending: RunEnding) -> Ended | None:
        """Commit the last events, ``done`` and the run's end in one transaction."""
        return await self.flush(ending)

    async def _snapshots_of(self, batch: list[tuple[str, dict[str, Any]]]) -> list[Snapshot]:
        """The snapshots of the commits in ``batch``, read from the workspace once each.

        A commit that cannot be read (its workspace gone) is logged and published without
        its files rather than holding the run's events back for ever.
        """
        if self._reader is None:
            return []
        for name, data in batch:
            sha = str(data.get("sha", ""))
            if name == "commit" and sha not in self._snapshots:
                try:
                    self._snapshots[sha] = await self._reader.read(sha)
                except Exception:
                    log.exception("run %s: the files of commit %s could not be read; it "
                                  "will not be downloadable", self._run_id, sha)
        return [self._snapshots[str(data["sha"])] for name, data in batch
                if name == "commit" and str(data["sha"]) in self._snapshots]

    async def _screenshots_of(self, batch: list[tuple[str, dict[str, Any]]]
                              ) -> list[tuple[str, bytes]]:
        """The work-tree path and content of each screenshot in ``batch``; one that cannot
        be read is logged and published all the same (served where its file is)."""
        if self._reader is None:
            return []
        pictures = []
        for name, data in batch:
            path = data.get(SCREENSHOT_PATH)
            if name == "screenshot" and isinstance(path, str):
                try:
                    content = await trio.Path(self._reader.workspace.resolve(path)).read_bytes()
                except Exception:
                    log.exception("run %s: screenshot %s could not be read; only its host "
                                  "will serve it", self._run_id, path)
                    continue
                pictures.append((path, content))
        return pictures

    def _commit(self, connection: Connection, items: list[tuple[str, str]],
                snapshots: list[Snapshot], pictures: list[tuple[str, bytes]],
                ending: RunEnding | None,
                unsure: tuple[int, bool] | None
                ) -> tuple[list[StreamEvent], Ended | None, tuple[int, bool] | None]:
        """Store ``items`` with the ``snapshots`` of their commits (and the end); or, when
        the failed attempt ``unsure`` did commit, nothing: its events are returned, with
        ``unsure`` (how many queued events it held and whether it held the end) as the
        third value, None otherwise."""
        if unsure is not None:
            written = event_log.run_events_after(connection, self._stream, self._run_id,
                                                 self._last_seq)
            if written:  # one transaction: all of that attempt committed
                ended = recorded_end(self._service, connection, self._run_id, ending) \
                    if unsure[1] and ending is not None else None
                return written, ended, unsure
        for snapshot in snapshots:
            assert self._project_id is not None  # a reader exists for project runs only
            store_snapshot(connection, self._project_id, self._run_id, snapshot)
        for path, content in pictures:
            assert self._project_id is not None
            store_screenshot(connection, self._project_id, self._run_id, path, content)
        ended = None
        if ending is not None:
            ended = record_end(self._service, connection, self._run_id, ending)
            if ended is None:
                raise _AlreadyEnded(self._run_id)
            # ``done`` follows the run's end in the same transaction: it names what the end
            # recorded (the preview of a project run).
            items = [*items, ("done", event_log.encode_data(ended.done_data()))]
        events = event_log.append_events(connection, self._stream, self._run_id, items,
                                        self._keep)
        return events, ended, None

    async def _fan_out(self, events: list[StreamEvent], batch: list[tuple[str, dict[str, Any]]],
                       ended: Ended | None) -> None:
        service = self._service
        await deliver_local(service, self._stream, events)
        if service.shared.redis is not None:
            await event_log.mirror_to_redis(service.shared.redis, self._stream, events,
                                           self._keep)
        if self._notify is None or self._project_id is None:
            return
        for name, data in batch:
            if name in MILESTONE_EVENTS:
                self._notify(Milestone(self._project_id, name, data))
        if ended is not None:
            self._notify(Milestone(self._project_id, "end", {
                "finalStatus": ended.run.status, "reason": ended.run.reason,
                "artifactUrl": ended.artifact_url}))


def _published(data: dict[str, Any]) -> dict[str, Any]:
    """An event's data as the stream publishes it: without a screenshot's work-tree path."""
    return {key: value for key, value in data.items() if key != SCREENSHOT_PATH}
