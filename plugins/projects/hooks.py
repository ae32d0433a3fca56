"""Hook implementations of the projects plugin."""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Any

from quart import Blueprint

from plugins.projects import routes, tables
from plugins.projects.engine.ending import EVENT_TYPES
from plugins.projects.engine.run_queue import queue_spec
from plugins.projects.engine.templates import builtin_templates
from plugins.projects.engine.tools import builtin_tools
from plugins.projects.live.hub import hub_spec
from plugins.projects.provided import EngineRuns, ProjectSources
from plugins.projects.records.notifier import notifier_spec, notify_later
from plugins.projects.settings import ProjectsSettings
from plugins.projects.state import PROJECTS_STATE
from runtime.actors import ActorSpec
from runtime.agents import AgentTemplate, Tool
from runtime.contracts import Provision, provision
from runtime.contracts.projects import PROJECTS
from runtime.contracts.runs import AGENT_RUNS
from runtime.events import EventType
from runtime.hookspecs import hookimpl
from runtime.plugin_kit import standard_hooks
from runtime.service import Service

flowsvc_plugin_config, flowsvc_tables, flowsvc_migrations = standard_hooks(
    "projects", ProjectsSettings, tables.metadata, Path(__file__).parent / "migrations")


@hookimpl
def flowsvc_requires() -> list[str]:
    """The chain plugin's token registry: projects attach to its tokens."""
    return ["chain"]


@hookimpl
def flowsvc_provides(service: Service) -> list[Provision[Any]]:
    return [provision(AGENT_RUNS, EngineRuns(service, service.state(PROJECTS_STATE))),
            provision(PROJECTS, ProjectSources())]


@hookimpl
def flowsvc_blueprints(service: Service) -> list[Blueprint]:
    return [routes.blueprint]


@hookimpl
def flowsvc_actors(service: Service) -> list[ActorSpec]:
    settings = service.state(PROJECTS_STATE).settings
    # Started in this order and stopped in reverse: the queue stops first, so the runs it
    # ends on the way out still reach the stream hub and the notifier.
    return [hub_spec(service, settings), notifier_spec(service),
            queue_spec(service, settings, partial(notify_later, service))]


@hookimpl
def flowsvc_webhook_events() -> list[EventType]:
    return EVENT_TYPES


@hookimpl
def flowsvc_agent_templates() -> list[AgentTemplate]:
    return builtin_templates()


@hookimpl
def flowsvc_agent_tools(service: Service) -> list[Tool]:
    return builtin_tools()
