"""What the keys plugin keeps per service: its settings, directory, meter and usage log.

One ``KeysState`` per ``Service``, made at first use and forgotten with the service (a
weak map, so tests that run many services in one process leak nothing). The actors own
the background work; the request path reads the directory and meters through this.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field

from plugins.keys.directory import KeyDirectory
from plugins.keys.meter import MeterBackend
from plugins.keys.meter_memory import MemoryMeter
from plugins.keys.meter_redis import RedisMeter
from plugins.keys.settings import KeysSettings
from plugins.keys.usage import UsageLog
from runtime.service import Service
from runtime.shared import RedisSharedState
from runtime.storage import Database


@dataclass(frozen=True)
class KeysState:
    settings: KeysSettings
    db: Database
    directory: KeyDirectory
    meter: MeterBackend
    usage: UsageLog
    route_costs: dict[tuple[str, str], tuple[int, float]] = field(default_factory=dict)


_states: weakref.WeakKeyDictionary[Service, KeysState] = weakref.WeakKeyDictionary()


def keys_state(service: Service) -> KeysState:
    """The keys plugin's state for ``service`` (made on the first call)."""
    state = _states.get(service)
    if state is None:
        settings = service.plugin_settings("keys", KeysSettings)
        meter: MeterBackend
        if isinstance(service.shared, RedisSharedState):
            meter = RedisMeter(service.shared, settings.meter_max_batch,
                               settings.meter_timeout_seconds)
        else:
            meter = MemoryMeter(service.shared)
        state = _states[service] = KeysState(
            settings=settings, db=service.db,
            directory=KeyDirectory(service.db, settings.cache_size, settings.cache_ttl_seconds),
            meter=meter, usage=UsageLog(settings.usage_buffer, service.metrics.registry))
    return state
