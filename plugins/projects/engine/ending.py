"""How a run's end is recorded: the run row, its project, and the webhook event.

All of it happens in the transaction that stores the run's last events (``done``
included), so a ``project.completed`` or ``project.failed`` event exists exactly when
the run's end committed.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import quote

from sqlalchemy import Connection

from plugins.projects.engine.run_rows import RunRecord, end_run, get_run
from plugins.projects.records.projects import get_project_by_id, set_project_status
from runtime.events import EventType
from runtime.service import Service

PROJECT_COMPLETED = "project.completed"
PROJECT_FAILED = "project.failed"
EVENT_TYPES = [
    EventType(PROJECT_COMPLETED, "A project's agent run completed; data: slug, artifact_url "
              "(a zip of the workspace as the run left it), preview_url (the work tree, live, "
              "scripts running in a sandbox), run_id, sha."),
    EventType(PROJECT_FAILED, "A project's agent run failed (an agent or model error, a "
              "crash, a timeout or a stopped service); data: slug, reason, run_id."),
]


@dataclass(frozen=True)
class RunEnding:
    """How a run ends: ``completed``, ``failed`` (with the reason) or ``cancelled``."""

    status: str
    reason: str | None = None
    sha: str | None = None


@dataclass(frozen=True)
class Ended:
    """A recorded end: the run, and for a project run its slug, artifact and preview URLs."""

    run: RunRecord
    project_slug: str | None = None
    artifact_url: str | None = None
    preview_url: str | None = None

    def done_data(self) -> dict[str, str]:
        """The data of the run's ``done`` event (``previewUrl`` for a project run)."""
        data = {"runId": self.run.id, "finalStatus": self.run.status}
        return data if self.preview_url is None else {**data, "previewUrl": self.preview_url}


def artifact_url(public_url: str, slug: str, sha: str | None) -> str:
    """Where the built workspace downloads as a zip (at ``sha`` when given)."""
    url = f"{public_url.rstrip('/')}/projects/{quote(slug)}/artifact"
    return f"{url}?ref={sha}" if sha else url


def preview_url(public_url: str, slug: str) -> str:
    """Where the work tree is seen live (``plugins.projects.preview``); without the private
    capability token, which only the owner is given, by redirect."""
    return f"{public_url.rstrip('/')}/projects/{quote(slug)}/preview/"


def record_end(service: Service, connection: Connection, run_id: str,
               ending: RunEnding) -> Ended | None:
    """End the run (once: None when it had already ended) and, for a project run, move the
    project to the end status and emit its webhook event."""
    run = end_run(connection, run_id, ending.status, ending.reason, ending.sha)
    if run is None:
        return None
    project = get_project_by_id(connection, run.project_id) if run.project_id else None
    if project is None or project.last_run_id != run.id:
        return Ended(run)
    set_project_status(connection, project.id, ending.status)
    url = artifact_url(service.settings.service.public_url, project.slug, ending.sha)
    preview = preview_url(service.settings.service.public_url, project.slug)
    if ending.status == "completed":
        service.emit_event(connection, user_id=project.owner_id, name=PROJECT_COMPLETED,
                           data={"slug": project.slug, "artifact_url": url,
                                 "preview_url": preview, "run_id": run.id, "sha": ending.sha})
    elif ending.status == "failed":
        service.emit_event(connection, user_id=project.owner_id, name=PROJECT_FAILED,
                           data={"slug": project.slug, "reason": ending.reason,
                                 "run_id": run.id})
    return Ended(run, project.slug, url, preview)


def recorded_end(service: Service, connection: Connection, run_id: str,
                 ending: RunEnding) -> Ended | None:
    """The end ``record_end`` recorded for ``ending`` in a transaction whose outcome the
    caller could not know, read back without recording anything; None if the run has not
    ended."""
    run = get_run(connection, run_id)
    if run is None or run.ended_at is None:
        return None
    project = get_project_by_id(connection, run.project_id) if run.project_id else None
    if project is None or project.last_run_id != run.id:
        return Ended(run)
    public_url = service.settings.service.public_url
    return Ended(run, project.slug, artifact_url(public_url, project.slug, ending.sha),
                 preview_url(public_url, project.slug))
