"""Hook implementations of the projects plugin.

Only the settings are imported with this module; each hook imports what it uses, so that
``flowsvc --help``, which loads every plugin's hooks for their commands, loads no web stack.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from plugins.projects.settings import ProjectsSettings
from runtime.hookspecs import hookimpl
from runtime.plugin_kit import standard_hooks

if TYPE_CHECKING:
    from quart import Blueprint

    from runtime.actors import ActorSpec
    from runtime.agents import AgentTemplate, Tool
    from runtime.contracts import Provision
    from runtime.events import EventType
    from runtime.service import Service

flowsvc_plugin_config, flowsvc_tables, flowsvc_migrations = standard_hooks(
    "projects", ProjectsSettings, "plugins.projects.tables", Path(__file__).parent / "migrations")


@hookimpl
def flowsvc_requires() -> list[str]:
    """The chain plugin's token registry: projects attach to its tokens."""
    return ["chain"]


@hookimpl
def flowsvc_provides(service: Service) -> list[Provision[Any]]:
    from plugins.projects.provided import EngineRuns, ProjectSources
    from plugins.projects.state import PROJECTS_STATE
    from runtime.contracts import provision
    from runtime.contracts.projects import PROJECTS
    from runtime.contracts.runs import AGENT_RUNS

    return [provision(AGENT_RUNS, EngineRuns(service, service.state(PROJECTS_STATE))),
            provision(PROJECTS, ProjectSources())]


@hookimpl
def flowsvc_blueprints(service: Service) -> list[Blueprint]:
    from plugins.projects import routes

    return [routes.blueprint]


@hookimpl
def flowsvc_actors(service: Service) -> list[ActorSpec]:
    from functools import partial

    from plugins.projects.engine.run_queue import queue_spec
    from plugins.projects.live.hub import hub_spec
    from plugins.projects.records.notifier import notifier_spec, notify_later
    from plugins.projects.state import PROJECTS_STATE

    settings = service.state(PROJECTS_STATE).settings
    # Started in this order and stopped in reverse: the queue stops first, so the runs it
    # ends on the way out still reach the stream hub and the notifier.
    return [hub_spec(service, settings), notifier_spec(service),
            queue_spec(service, settings, partial(notify_later, service))]


@hookimpl
def flowsvc_webhook_events() -> list[EventType]:
    from plugins.projects.engine.ending import EVENT_TYPES

    return EVENT_TYPES


@hookimpl
def flowsvc_agent_templates() -> list[AgentTemplate]:
    from plugins.projects.engine.templates import builtin_templates

    return builtin_templates()


@hookimpl
def flowsvc_agent_tools(service: Service) -> list[Tool]:
    from plugins.projects.engine.fetch_tool import fetch_url_tool
    from plugins.projects.engine.sandboxed_tools import sandboxed_tools
    from plugins.projects.engine.tools import builtin_tools

    return [*builtin_tools(), *sandboxed_tools(),
            fetch_url_tool(service.plugin_settings("projects", ProjectsSettings))]
