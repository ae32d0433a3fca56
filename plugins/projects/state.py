"""What the projects plugin keeps per service: its settings and where workspaces live.

``PROJECTS_STATE`` is made once per service, on first use (``service.state(PROJECTS_STATE)``):
the views, the contracts' implementations and the actors' specs all read it there.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from plugins.projects.settings import ProjectsSettings
from runtime.service import Service, StateSlot


@dataclass(frozen=True)
class ProjectsState:
    """:param workspaces: the root of every run's workspace (``ProjectsSettings.workspaces``)."""

    settings: ProjectsSettings
    workspaces: Path

    @classmethod
    def create(cls, service: Service) -> ProjectsState:
        settings = service.plugin_settings("projects", ProjectsSettings)
        return cls(settings, settings.workspaces(service.settings.service.var_dir))

    def project_workspace(self, project_id: int) -> Path:
        """The workspace of project ``project_id`` (its own git repository)."""
        return self.workspaces / str(project_id)


PROJECTS_STATE: StateSlot[ProjectsState] = StateSlot("projects", ProjectsState.create)
