"""Agents made from a project whose run completed, linked to the project's token.

The projects plugin owns projects and runs; this module reads the project through the
``runtime.contracts.projects`` contract inside the transaction that creates the agent.
"""

from __future__ import annotations

from dataclasses import replace

from sqlalchemy import Connection

from plugins.marketplace.catalog import Agent, AgentDraft, create_agent
from runtime.contracts.projects import ProjectCatalog
from runtime.wire import utcnow


def create_from_project(connection: Connection, projects: ProjectCatalog, project_slug: str,
                        user_id: int, draft: AgentDraft) -> Agent:
    """Create a draft agent from the caller's project whose last run completed.

    Unset parts of ``draft`` come from the project: the name from its title, the
    description from its brief, the template from its ``agentTemplate``; the agent is
    linked to the project's token.

    :raises NotFound: no such project, or a private project of someone else.
    :raises Forbidden: the caller does not own the project.
    :raises Conflict: the project's last run did not complete (or it never ran).
    """
    project = projects.completed_project(connection, project_slug, user_id)
    return create_agent(connection, user_id, replace(
        draft, name=draft.name or project.title[:100],
        description=draft.description or project.brief,
        agent_template=project.agent_template, linked_token=project.token_slug,
        source_project=project.slug), utcnow())
