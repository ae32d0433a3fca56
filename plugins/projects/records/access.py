"""Who may see or act on a project: every project route goes through these two checks."""

from __future__ import annotations

from plugins.projects.errors import PrivateForbidden
from plugins.projects.records.projects import Project, get_project
from runtime.context import current_principal, require_user
from runtime.errors import Forbidden, NotFound
from runtime.principal import Principal
from runtime.service import Service


async def find_project(service: Service, slug: str) -> Project:
    """:raises NotFound: no project has this slug."""
    project = await service.db.read(get_project, slug)
    if project is None:
        raise NotFound(f"no project with slug {slug!r}")
    return project


def _is_owner(principal: Principal | None, project: Project) -> bool:
    return principal is not None and principal.via != "internal" and \
        principal.user_id == project.owner_id


async def visible_project(service: Service, slug: str) -> Project:
    """The project, when the caller may see it: anyone for a public project, only its owner
    for a private one.

    :raises NotFound: no project has this slug.
    :raises PrivateForbidden: the project is private and the caller is not its owner.
    """
    project = await find_project(service, slug)
    if project.private and not _is_owner(current_principal(), project):
        raise PrivateForbidden(f"project {slug!r} is private; only its owner may see it")
    return project


async def owned_project(service: Service, slug: str) -> tuple[Project, Principal]:
    """The project and its owner, who is the caller.

    :raises Unauthenticated: no signed-in caller.
    :raises NotFound: no project has this slug.
    :raises PrivateForbidden: another user's private project.
    :raises Forbidden: another user's public project.
    """
    principal = require_user()
    project = await find_project(service, slug)
    if not _is_owner(principal, project):
        if project.private:
            raise PrivateForbidden(f"project {slug!r} is private; only its owner may see it")
        raise Forbidden(f"only the owner of project {slug!r} may do this")
    return project, principal
