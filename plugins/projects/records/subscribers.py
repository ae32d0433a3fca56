"""Subscribers of a project's milestones (the notifier tells them through the bot).

Every function takes an open connection, so callers compose them into one transaction.
"""

from __future__ import annotations

from sqlalchemy import Connection, delete, insert, select
from sqlalchemy.exc import IntegrityError

from plugins.projects.tables import subscribers
from runtime.wire import utcnow


def subscribe(connection: Connection, project_id: int, user_id: int) -> None:
    """Subscribe the user to the project's milestones (again is a no-op)."""
    try:
        with connection.begin_nested():
            connection.execute(insert(subscribers).values(
                project_id=project_id, user_id=user_id, created_at=utcnow()))
    except IntegrityError:
        pass


def unsubscribe(connection: Connection, project_id: int, user_id: int) -> None:
    connection.execute(delete(subscribers).where(subscribers.c.project_id == project_id)
                       .where(subscribers.c.user_id == user_id))


def subscriber_ids(connection: Connection, project_id: int) -> list[int]:
    """The users subscribed to the project's milestones."""
    query = (select(subscribers.c.user_id).where(subscribers.c.project_id == project_id)
             .order_by(subscribers.c.user_id))
    return [int(user_id) for user_id in connection.execute(query).scalars()]
