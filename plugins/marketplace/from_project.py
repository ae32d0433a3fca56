"""Agents made from a project whose run completed, linked to the project's token.

The projects plugin owns projects and runs; this module only reads them (``get_project``,
``get_run``) inside the transaction that creates the agent.
"""

from __future__ import annotations

from dataclasses import replace

from sqlalchemy import Connection

from plugins.marketplace.catalog import Agent, AgentDraft, create_agent
from plugins.projects.runstore import get_run
from plugins.projects.store import get_project
from runtime.errors import Conflict, Forbidden, NotFound
from runtime.wire import utcnow


def create_from_project(connection: Connection, project_slug: str, user_id: int,
                        draft: AgentDraft) -> Agent:
    """Create a draft agent from the caller's project whose last run completed.

    Unset parts of ``draft`` come from the project: the name from its title, the
    description from its brief, the template from its ``agentTemplate``; the agent is
    linked to the project's token.

    :raises NotFound: no such project, or a private project of someone else.
    :raises Forbidden: the caller does not own the project.
    :raises Conflict: the project's last run did not complete (or it never ran).
    """
    project = get_project(connection, project_slug)
    if project is None or (project.private and project.owner_id != user_id):
        raise NotFound(f"no project {project_slug!r}")
    if project.owner_id != user_id:
        raise Forbidden(f"only the owner of project {project_slug!r} can make an agent of it")
    run = get_run(connection, project.last_run_id) if project.last_run_id else None
    if run is None or run.status != "completed":
        raise Conflict(f"project {project_slug!r} has no completed run to make an agent from")
    return create_agent(connection, user_id, replace(
        draft, name=draft.name or project.title[:100],
        description=draft.description or project.brief,
        agent_template=project.agent_template, linked_token=project.token_slug,
        source_project=project.slug), utcnow())
