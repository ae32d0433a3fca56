"""What the keys plugin keeps per service: ``KEYS``.

Its settings, the key directory, the meter backend and the usage log, made once per
service. The actors own the background work; the request path reads the directory and
meters through this.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from plugins.keys.directory import KeyDirectory
from plugins.keys.meter_memory import MemoryMeter
from plugins.keys.meter_redis import RedisMeter
from plugins.keys.metering import MeterBackend
from plugins.keys.settings import KeysSettings
from plugins.keys.usage import UsageLog
from runtime.service import Service, StateSlot
from runtime.storage import Database


@dataclass(frozen=True)
class KeysState:
    settings: KeysSettings
    db: Database
    directory: KeyDirectory
    meter: MeterBackend
    usage: UsageLog
    route_costs: dict[tuple[str, str], tuple[int, float]] = field(default_factory=dict)

    @classmethod
    def create(cls, service: Service) -> KeysState:
        settings = service.plugin_settings("keys", KeysSettings)
        redis = service.shared.redis
        directory = KeyDirectory(service.db, settings.cache_size, settings.cache_ttl_seconds)
        meter: MeterBackend = MemoryMeter(service.shared) if redis is None else \
            RedisMeter(redis, settings.meter_max_batch, settings.meter_timeout_seconds,
                       forget_records=directory.clear)
        return cls(settings=settings, db=service.db, directory=directory,
                   meter=meter, usage=UsageLog(settings.usage_buffer, service.metrics.registry))


KEYS: StateSlot[KeysState] = StateSlot("keys", KeysState.create)
