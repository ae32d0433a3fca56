"""Run rows: one per agent run, with its status, its lease and how it ended.

A run is ``queued`` when submitted, ``running`` once a slot takes it, and ends
``completed``, ``failed`` or ``cancelled``. The process that queued it (``worker``)
renews its ``lease_until``; a run whose lease expired belongs to a process that stopped,
and any process may end it as failed. Ending is a compare-and-set on the status, so a run
ends exactly once however many processes try.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Connection, insert, select, update

from plugins.projects.tables import runs
from runtime.wire import as_utc, iso, utcnow

LIVE_STATUSES = ("queued", "running")


def new_run_id() -> str:
    return f"run_{secrets.token_hex(12)}"


@dataclass(frozen=True)
class RunRecord:
    id: str
    stream: str
    project_id: int | None
    owner_id: int
    template: str
    key_id: int | None
    priority: int
    status: str
    reason: str | None
    sha: str | None
    worker: str
    queued_at: datetime
    started_at: datetime | None
    ended_at: datetime | None

    def public(self) -> dict[str, Any]:
        """The run as ``GET /projects/<slug>`` shows it (``lastRun``)."""
        return {"runId": self.id, "status": self.status, "reason": self.reason,
                "sha": self.sha, "queuedAt": iso(self.queued_at),
                "startedAt": iso(self.started_at) if self.started_at else None,
                "endedAt": iso(self.ended_at) if self.ended_at else None}


def _record(row: Any) -> RunRecord:
    return RunRecord(
        id=row.id, stream=row.stream, project_id=row.project_id, owner_id=row.owner_id,
        template=row.template, key_id=row.key_id, priority=row.priority, status=row.status,
        reason=row.reason, sha=row.sha, worker=row.worker, queued_at=as_utc(row.queued_at),
        started_at=as_utc(row.started_at) if row.started_at else None,
        ended_at=as_utc(row.ended_at) if row.ended_at else None)


def get_run(connection: Connection, run_id: str) -> RunRecord | None:
    row = connection.execute(select(runs).where(runs.c.id == run_id)).first()
    return _record(row) if row else None


def insert_run(connection: Connection, *, run_id: str, stream: str, project_id: int | None,
               owner_id: int, template: str, key_id: int | None, priority: int, worker: str,
               lease_seconds: float) -> None:
    now = utcnow()
    connection.execute(insert(runs).values(
        id=run_id, stream=stream, project_id=project_id, owner_id=owner_id, template=template,
        key_id=key_id, priority=priority, status="queued", worker=worker,
        lease_until=now + timedelta(seconds=lease_seconds), queued_at=now))


def mark_running(connection: Connection, run_id: str) -> RunRecord | None:
    """Move a queued run to ``running``; None when it is not queued any more."""
    changed = connection.execute(
        update(runs).where(runs.c.id == run_id).where(runs.c.status == "queued")
        .values(status="running", started_at=utcnow())).rowcount
    return get_run(connection, run_id) if changed == 1 else None


def end_run(connection: Connection, run_id: str, status: str, reason: str | None,
            sha: str | None) -> RunRecord | None:
    """End a live run with ``status``; None when it had already ended (someone else did)."""
    changed = connection.execute(
        update(runs).where(runs.c.id == run_id).where(runs.c.status.in_(LIVE_STATUSES))
        .values(status=status, reason=reason, sha=sha, ended_at=utcnow())).rowcount
    return get_run(connection, run_id) if changed == 1 else None


def renew_leases(connection: Connection, run_ids: list[str], lease_seconds: float) -> None:
    """Extend the lease of the live runs ``run_ids`` (the ones a queue still holds: a run
    whose end could not be recorded is let go, and its lease expires)."""
    if run_ids:
        connection.execute(
            update(runs).where(runs.c.id.in_(run_ids)).where(runs.c.status.in_(LIVE_STATUSES))
            .values(lease_until=utcnow() + timedelta(seconds=lease_seconds)))


def orphaned_runs(connection: Connection, worker: str, any_other_worker: bool
                  ) -> list[RunRecord]:
    """Live runs no process looks after: their lease expired (or, when
    ``any_other_worker``, they belong to any other process: the embedded default has one)."""
    query = select(runs).where(runs.c.status.in_(LIVE_STATUSES)).where(runs.c.worker != worker)
    if not any_other_worker:
        query = query.where(runs.c.lease_until < utcnow())
    return [_record(row) for row in connection.execute(query.order_by(runs.c.queued_at))]
