"""Contract: a finished project an agent can be made from (provided by the projects plugin).

The marketplace turns a project whose last run completed into a draft agent; it reads
the project through ``service.contract(PROJECTS).completed_project`` inside the
transaction that creates the agent.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from runtime.contracts import Contract

if TYPE_CHECKING:
    from sqlalchemy import Connection


@dataclass(frozen=True)
class ProjectSource:
    """What an agent takes from the project it is made from."""

    slug: str
    title: str
    brief: str
    agent_template: str
    token_slug: str


class ProjectCatalog(Protocol):
    def completed_project(self, connection: Connection, slug: str, user_id: int
                          ) -> ProjectSource:
        """The caller's project ``slug`` whose last run completed, read on ``connection``.

        :raises NotFound: no such project, or a private project of someone else.
        :raises Forbidden: the caller does not own the project.
        :raises Conflict: the project's last run did not complete (or it never ran).
        """
        ...


PROJECTS: Contract[ProjectCatalog] = Contract("projects")
