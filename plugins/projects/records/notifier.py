"""The notifier actor: tells a project's subscribers about its milestones through the bot.

Milestones are a run's plan, each commit and its end. For each, the notifier reads the
project's title and subscribers and hands one ``MessageUser`` to the messenger
(``runtime.contracts.messenger``, the auth plugin's bot), which skips users without a
linked messaging identity and retries failed sends. Runs only drop milestones into the
notifier's mailbox without waiting (a full mailbox drops the milestone, with a warning),
so notifying never slows or fails a run. A database outage holds milestones in the mailbox
(``runtime.backoff``) until the database answers, rather than dropping them.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import trio
from sqlalchemy import Connection

from plugins.projects.records.projects import Project, get_project_by_id
from plugins.projects.records.subscribers import subscriber_ids
from runtime.actors import ActorSpec, Mailbox
from runtime.backoff import until_available
from runtime.contracts.messenger import MESSENGER_ACTOR, MessageUser
from runtime.service import Service

log = logging.getLogger("flowsvc.projects.notifier")
NOTIFIER = "projects.notifier"
_PLAN_STEPS_SHOWN = 10


@dataclass(frozen=True)
class Milestone:
    """What the notifier tells a project's subscribers: a plan, a commit or the end."""

    project_id: int
    kind: str
    data: dict[str, Any]


Notify = Callable[[Milestone], None]


def milestone_text(title: str, milestone: Milestone) -> str:
    """The message a subscriber gets for ``milestone`` of the project titled ``title``."""
    data = milestone.data
    if milestone.kind == "plan":
        steps = [str(step) for step in data.get("steps", [])]
        lines = [f"{number}. {step}" for number, step in
                 enumerate(steps[:_PLAN_STEPS_SHOWN], start=1)]
        if len(steps) > _PLAN_STEPS_SHOWN:
            lines.append(f"... and {len(steps) - _PLAN_STEPS_SHOWN} more")
        return f"{title}: the agent planned {len(steps)} steps\n" + "\n".join(lines)
    if milestone.kind == "commit":
        files = data.get("files", [])
        return (f"{title}: commit {str(data.get('sha', ''))[:7]} {data.get('message', '')} "
                f"({len(files)} file{'s' if len(files) != 1 else ''})")
    status = data.get("finalStatus")
    if status == "completed":
        return f"{title}: the build completed. Download it: {data.get('artifactUrl')}"
    if status == "failed":
        return f"{title}: the build failed: {data.get('reason')}"
    return f"{title}: the build was cancelled."


def notify_later(service: Service, milestone: Milestone) -> None:
    """Drop a milestone into the notifier's mailbox without waiting (what runs call)."""
    address = service.registry.get(NOTIFIER)
    if address is not None and not address.try_cast(milestone):
        log.warning("notifier mailbox full: milestone %s of project %s dropped",
                    milestone.kind, milestone.project_id)


def _recipients(connection: Connection, project_id: int) -> tuple[Project | None, list[int]]:
    return get_project_by_id(connection, project_id), subscriber_ids(connection, project_id)


def notifier_spec(service: Service) -> ActorSpec:
    """The notifier actor (``projects.notifier``); messages are :class:`Milestone` casts.
    Without a messenger (the auth plugin disabled) milestones are dropped."""

    async def handle(milestone: Milestone) -> None:
        messenger = service.registry.get(MESSENGER_ACTOR)
        if messenger is None:
            return
        project, user_ids = await until_available(
            lambda: service.db.read(_recipients, milestone.project_id),
            what=f"reading the subscribers of project {milestone.project_id}", log=log)
        if project is None or not user_ids:
            return
        if not messenger.try_cast(MessageUser(tuple(user_ids),
                                              milestone_text(project.title, milestone))):
            log.warning("messenger mailbox full: milestone %s of project %s dropped",
                        milestone.kind, milestone.project_id)

    async def run(mailbox: Mailbox, *,
                  task_status: trio.TaskStatus[Any] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        async for envelope in mailbox:
            milestone = envelope.message
            if not isinstance(milestone, Milestone):
                raise TypeError(f"{NOTIFIER} does not understand {milestone!r}")
            try:
                await handle(milestone)
            except Exception:  # a milestone that cannot be sent must not stop the rest
                log.exception("milestone of project %s not sent", milestone.project_id)

    return ActorSpec(name=NOTIFIER, run=run, mailbox_size=1024)
