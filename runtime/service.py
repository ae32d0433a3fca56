"""The service: settings, plugins, storage, shared state and actors of one process.

``runtime.bootstrap.open_service`` builds a ``Service`` (plugin manager, plugin settings,
database, shared state, registries collected from hooks); ``Service.start_actors`` then
starts the actors in a nursery the caller owns: the core's under the root supervisor, each
plugin's as a part under a supervisor of its own (``runtime.supervisor``). The service also owns
each plugin's state (``Service.state``), the contracts plugins provide to each other
(``Service.contract``) and the process's drain on shutdown (``Service.drain``,
``runtime.drain``).
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Generic, TypeVar, cast

import pluggy
import trio
from sqlalchemy import Connection, MetaData

from runtime.actors import ActorSpec, PartSpec, Registry
from runtime.agents import AgentTemplate, Tool
from runtime.config import ConfigError, Section, Settings, validate_section
from runtime.contracts import Contract, Provision
from runtime.drain import Drain
from runtime.errors import Unavailable
from runtime.events import EventType, OutboundEvent
from runtime.metrics import Metrics
from runtime.sandbox import Sandbox
from runtime.shared import SharedState
from runtime.storage import Database
from runtime.supervisor import CORE, Supervisor

if TYPE_CHECKING:
    from pathlib import Path

S = TypeVar("S", bound=Section)
T = TypeVar("T")


class StateSlot(Generic[T]):
    """The typed key of one plugin's state in a service, with the factory that makes it.

    A plugin declares one at module level (``STATE = StateSlot("keys", KeysState.create)``)
    and reads it with ``service.state(STATE)``: made on first use, once per service, and
    gone with the service (tests run many services in one process).
    """

    __slots__ = ("name", "factory")

    def __init__(self, name: str, factory: Callable[[Service], T]) -> None:
        self.name = name
        self.factory = factory

    def __repr__(self) -> str:
        return f"StateSlot({self.name!r})"


def _unique(kind: str, items: Sequence[Any]) -> dict[str, Any]:
    by_name: dict[str, Any] = {}
    for item in items:
        if item.name in by_name:
            raise ConfigError(f"two plugins declare the {kind} {item.name!r}")
        by_name[item.name] = item
    return by_name


def _flatten(results: list[list[Any] | None]) -> list[Any]:
    return [item for result in results if result for item in result]


class Service:
    """Everything one service process owns. Plugins receive it in their hooks.

    :param environ: where plugin settings overrides are read (default ``os.environ``).
    :raises ConfigError: a plugin's settings are invalid, or two plugins declare the same
        event, template, tool or contract.
    """

    def __init__(self, settings: Settings, pm: pluggy.PluginManager, db: Database,
                 shared: SharedState, environ: Mapping[str, str] | None = None) -> None:
        self.settings = settings
        self.pm = pm
        self.db = db
        self.shared = shared
        self.registry = Registry()
        self.metrics = Metrics()
        self.sandbox = Sandbox(settings.sandbox)  # probed by open_service
        self.supervisor: Supervisor | None = None
        self.drain = Drain()
        self._states: dict[StateSlot[Any], Any] = {}
        self._plugin_settings = self._validate_plugin_settings(
            os.environ if environ is None else environ)
        self.event_types: dict[str, EventType] = _unique(
            "webhook event", _flatten(pm.hook.flowsvc_webhook_events()))
        self.templates: dict[str, AgentTemplate] = _unique(
            "agent template", _flatten(pm.hook.flowsvc_agent_templates()))
        self.tools: dict[str, Tool] = _unique(
            "agent tool", _flatten(pm.hook.flowsvc_agent_tools(service=self)))
        self._contracts: dict[Contract[Any], Any] = {}
        for provided in _flatten(pm.hook.flowsvc_provides(service=self)):
            assert isinstance(provided, Provision)
            if provided.contract in self._contracts:
                raise ConfigError(f"two plugins provide the contract {provided.contract.name}")
            self._contracts[provided.contract] = provided.implementation

    def plugin_models(self) -> dict[str, type[Section]]:
        """The settings model of every enabled plugin that has settings, by plugin name."""
        return {config.name: config.model for config in self.pm.hook.flowsvc_plugin_config()
                if config is not None}

    def _validate_plugin_settings(self, environ: Mapping[str, str]) -> dict[str, Section]:
        validated: dict[str, Section] = {}
        for config in self.pm.hook.flowsvc_plugin_config():
            if config is None:
                continue
            table = self.settings.plugin_table(config.name)
            validated[config.name] = validate_section(
                config.model, table, ("plugins", config.name), environ,
                f"[plugins.{config.name}]")
        return validated

    def plugin_settings(self, name: str, model: type[S]) -> S:
        """The validated ``[plugins.<name>]`` settings of an enabled plugin."""
        settings = self._plugin_settings[name]
        assert isinstance(settings, model)
        return settings

    def state(self, slot: StateSlot[T]) -> T:
        """The plugin state kept under ``slot``, made by its factory on first use."""
        try:
            value: T = self._states[slot]
        except KeyError:
            value = self._states[slot] = slot.factory(self)
        return value

    def contract(self, contract: Contract[T]) -> T:
        """The implementation of ``contract`` an enabled plugin provides.

        :raises Unavailable: no enabled plugin provides it (the consumer should have
            declared the provider in ``flowsvc_requires``).
        """
        try:
            implementation: T = self._contracts[contract]
        except KeyError:
            raise Unavailable(f"no enabled plugin provides {contract.name}") from None
        return implementation

    def metadata(self) -> list[MetaData]:
        """The ``MetaData`` of the core and every enabled plugin."""
        return [m for m in self.pm.hook.flowsvc_tables() if m is not None]

    def migration_folders(self) -> list[Path]:
        return [p for p in self.pm.hook.flowsvc_migrations() if p is not None]

    async def features(self, user_id: int) -> dict[str, bool]:
        """The user's feature flags, OR-ed over every plugin."""
        flags: dict[str, bool] = {}
        for result in await gather_hook(self.pm.hook.flowsvc_user_features, service=self,
                                        user_id=user_id):
            for name, value in (result or {}).items():
                flags[name] = flags.get(name, False) or bool(value)
        return flags

    def emit_event(self, connection: Connection, *, user_id: int, name: str,
                   data: Mapping[str, Any]) -> OutboundEvent:
        """Emit the account event ``name`` for ``user_id`` inside the transaction of
        ``connection``: it exists exactly when that transaction commits (the
        ``flowsvc_event_emitted`` hook runs on it).

        :raises ValueError: ``name`` is not in the catalogue (a programming error).
        """
        if name not in self.event_types:
            raise ValueError(f"event {name!r} is not declared by any enabled plugin")
        event = OutboundEvent.new(name, user_id, data)
        self.pm.hook.flowsvc_event_emitted(service=self, connection=connection, event=event)
        return event

    async def start_actors(self, nursery: trio.Nursery) -> Supervisor:
        """Start the root supervisor in ``nursery`` and, in plugin order, the core's actors
        under it and each plugin's actors as a part of their own (named after the plugin):
        a plugin that keeps crashing is taken down and retried, the core stops the service.

        :raises: a boot failure of any actor (the service does not start).
        """
        self.supervisor = Supervisor(nursery, self.settings.supervisor, self.registry,
                                     self.metrics)
        # Implementations in plugin (registration) order, with the plugin each belongs to.
        for hookimpl in self.pm.hook.flowsvc_actors.get_hookimpls():
            returned = cast("list[ActorSpec | PartSpec] | None",
                            hookimpl.function(service=self))
            specs = tuple(returned or ())
            if hookimpl.plugin_name == CORE:
                for spec in specs:
                    await self.supervisor.start_child(spec)
            elif specs:
                await self.supervisor.start_part(PartSpec(hookimpl.plugin_name, specs))
        return self.supervisor


async def gather_hook(hook: Any, **kwargs: Any) -> list[Any]:
    """Call a hook whose implementations may be async; await each awaitable result."""
    results = []
    for result in hook(**kwargs):
        results.append(await result if inspect.isawaitable(result) else result)
    return results
