"""Project rows: creation, reads and status transitions.

Every function takes an open connection, so callers compose them into one transaction.
Status values and their transitions (``docs/projects.md`` has the table):

- ``idle``: created, never started. ``queued``: a run waits for a slot. ``running``.
- ``completed``, ``failed``, ``cancelled``: the end statuses of a run (and ``cancelled``
  also of an idle project). A project in an end status can be started again.

A project is *active* until it reaches an end status; a token has at most one active
project, held by the unique ``active_token`` column.
"""

from __future__ import annotations

import re
import secrets
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, insert, select, update
from sqlalchemy.exc import IntegrityError

from plugins.projects.errors import ProjectLocked, TokenNoMatch
from plugins.projects.tables import projects
from runtime.contracts.tokens import TokenRegistry
from runtime.errors import Conflict, NotFound
from runtime.wire import as_utc, iso, utcnow

END_STATUSES = ("completed", "failed", "cancelled")
STARTABLE_STATUSES = ("idle", *END_STATUSES)
_SLUG_ATTEMPTS = 5


@dataclass(frozen=True)
class Project:
    id: int
    slug: str
    token_slug: str
    owner_id: int
    title: str
    brief: str
    agent_template: str
    private: bool
    status: str
    last_run_id: str | None
    created_at: datetime
    updated_at: datetime

    @property
    def stream(self) -> str:
        """The key of the project's event stream."""
        return project_stream(self.id)

    def summary(self) -> dict[str, Any]:
        """The answer of ``POST /projects``."""
        return {"id": str(self.id), "slug": self.slug, "tokenSlug": self.token_slug,
                "status": self.status, "createdAt": iso(self.created_at)}

    def public(self) -> dict[str, Any]:
        """The Project resource (without its run)."""
        return {**self.summary(), "title": self.title, "brief": self.brief,
                "agentTemplate": self.agent_template, "private": self.private,
                "ownerId": str(self.owner_id), "updatedAt": iso(self.updated_at)}


def project_stream(project_id: int) -> str:
    return f"project-{project_id}"


def _project(row: Any) -> Project:
    return Project(id=row.id, slug=row.slug, token_slug=row.token_slug, owner_id=row.owner_id,
                   title=row.title, brief=row.brief, agent_template=row.agent_template,
                   private=row.private, status=row.status, last_run_id=row.last_run_id,
                   created_at=as_utc(row.created_at), updated_at=as_utc(row.updated_at))


def get_project(connection: Connection, slug: str) -> Project | None:
    row = connection.execute(select(projects).where(projects.c.slug == slug)).first()
    return _project(row) if row else None


def get_project_by_id(connection: Connection, project_id: int) -> Project | None:
    row = connection.execute(select(projects).where(projects.c.id == project_id)).first()
    return _project(row) if row else None


def list_owned(connection: Connection, owner_id: int, before: int | None, limit: int
               ) -> list[Project]:
    """Up to ``limit`` of ``owner_id``'s projects with an id below ``before`` (all when None),
    newest first (ids grow with creation)."""
    query = select(projects).where(projects.c.owner_id == owner_id)
    if before is not None:
        query = query.where(projects.c.id < before)
    return [_project(row) for row in
            connection.execute(query.order_by(projects.c.id.desc()).limit(limit))]


def slugify(title: str) -> str:
    """``"Luigi's Pizza Site!"`` -> ``"luigi-s-pizza-site"`` (at most 48 characters)."""
    slug = re.sub(r"[^a-z0-9]+", "-", title.lower()).strip("-")[:48].strip("-")
    return slug or "project"


def _free_slug(connection: Connection, base: str) -> str:
    """``base``, or ``base-2``, ``base-3``... whichever is free now."""
    taken = set(connection.execute(select(projects.c.slug).where(
        projects.c.slug.like(f"{base}%"))).scalars())
    if base not in taken:
        return base
    number = 2
    while f"{base}-{number}" in taken:
        number += 1
    return f"{base}-{number}"


def _active_project_of(connection: Connection, token_slug: str) -> str | None:
    return connection.execute(select(projects.c.slug).where(
        projects.c.active_token == token_slug)).scalar()


def create_project(connection: Connection, tokens: TokenRegistry, *, owner_id: int,
                   owner_address: str | None, token_slug: str, title: str, brief: str,
                   agent_template: str, private: bool) -> Project:
    """Create an idle project attached to ``token_slug`` with a readable, unique slug.

    The token's owner is read from ``tokens`` (the registry contract) on ``connection``,
    so the check and the new project commit together.

    :raises NotFound: no token has this slug.
    :raises TokenNoMatch: the caller has no address, or their address does not own the
        token.
    :raises ProjectLocked: the token already has an active project.
    """
    token = tokens.get(connection, token_slug)
    if token is None:
        raise NotFound(f"no token with slug {token_slug!r}")
    if owner_address is None:
        raise TokenNoMatch(f"token {token_slug!r} is owned by an address and your account has "
                           "none: sign in with the wallet that owns it")
    if owner_address.lower() != token.owner_address:
        raise TokenNoMatch(f"token {token_slug!r} is not owned by your address")
    base = slugify(title)
    now = utcnow()
    for attempt in range(_SLUG_ATTEMPTS):
        active = _active_project_of(connection, token_slug)
        if active is not None:
            raise ProjectLocked(f"token {token_slug!r} already has an active project "
                                f"({active!r}); it must be completed, failed or cancelled first")
        slug = _free_slug(connection, base) if attempt < 2 else \
            f"{base[:40]}-{secrets.token_hex(3)}"
        try:
            with connection.begin_nested():
                project_id = connection.execute(insert(projects).values(
                    slug=slug, token_slug=token_slug, owner_id=owner_id, title=title,
                    brief=brief, agent_template=agent_template, private=private,
                    status="idle", active_token=token_slug, created_at=now,
                    updated_at=now)).inserted_primary_key[0]  # type: ignore[index]
        except IntegrityError:
            continue  # a concurrent create took the slug or the token: look again
        project = get_project_by_id(connection, int(project_id))
        assert project is not None
        return project
    raise Conflict("could not find a free slug for the project; try again")


def begin_run(connection: Connection, project_id: int, run_id: str) -> None:
    """Queue a run of the project: its status becomes ``queued`` and it is active again.

    :raises Conflict: a run of the project is already queued or running.
    :raises ProjectLocked: another project of the token became active in the meantime.
    """
    project = get_project_by_id(connection, project_id)
    assert project is not None
    if project.status not in STARTABLE_STATUSES:
        raise Conflict(f"project {project.slug!r} already has a {project.status} run")
    try:
        with connection.begin_nested():
            changed = connection.execute(
                update(projects).where(projects.c.id == project_id)
                .where(projects.c.status == project.status)
                .values(status="queued", active_token=project.token_slug, last_run_id=run_id,
                        updated_at=utcnow())).rowcount
    except IntegrityError:
        active = _active_project_of(connection, project.token_slug)
        raise ProjectLocked(f"token {project.token_slug!r} has another active project "
                            f"({active!r})") from None
    if changed != 1:
        raise Conflict(f"project {project.slug!r} changed while starting; try again")


def set_project_status(connection: Connection, project_id: int, status: str) -> None:
    """Record a run's progress on its project; an end status releases the token."""
    values: dict[str, Any] = {"status": status, "updated_at": utcnow()}
    if status in END_STATUSES:
        values["active_token"] = None
    connection.execute(update(projects).where(projects.c.id == project_id).values(**values))


def cancel_idle(connection: Connection, project_id: int) -> bool:
    """Cancel a project that was never started; False when it is not idle (any more)."""
    return connection.execute(
        update(projects).where(projects.c.id == project_id).where(projects.c.status == "idle")
        .values(status="cancelled", active_token=None, updated_at=utcnow())).rowcount == 1
