"""The key directory: key records cached in the process, invalidated on every process.

A known key costs no database round trip: ``lookup`` answers from an LRU cache keyed
by the key's hash (misses are loaded once, however many requests wait for them, and
unknown hashes are cached as such for a minute). Every change to a key (PATCH, DELETE)
drops it from the cache of the process that made it at once and is published on the
shared channel ``keys.changed``; the ``keys.directory`` actor drops it on every other
process when the message arrives, and polls the database every
``invalidation_poll_seconds`` (1 s) for changes a lost message would hide, and forgets
every cached key whenever it (re)subscribes (``runtime.follow``). A revocation is
therefore effective everywhere within about one second, usually within milliseconds.
"""

from __future__ import annotations

import enum
import logging
import time
from collections import OrderedDict
from datetime import timedelta
from typing import Any, Literal

import trio

from plugins.keys.records import KeyRecord, changed_since, load_by_hash, load_by_id
from runtime.actors import ActorSpec, Mailbox
from runtime.follow import ChangeFeed, follow_changes
from runtime.shared import SharedState
from runtime.storage import Database
from runtime.wire import utcnow

log = logging.getLogger("flowsvc.keys")
CHANGED_CHANNEL = "keys.changed"
DIRECTORY_ACTOR = "keys.directory"
_UNKNOWN_TTL_SECONDS = 60.0


class Miss(enum.Enum):
    """What ``KeyDirectory.cached`` answers when it does not know a hash."""

    MISS = "miss"


class KeyDirectory:
    """The cache of key records of one process.

    :param db: where records are loaded from on a miss.
    :param size: how many records (known or unknown hashes) are kept, least recently used
        dropped first.
    :param ttl: seconds a record is trusted without being re-read, a bound on staleness
        even if every invalidation were lost.
    """

    def __init__(self, db: Database, size: int, ttl: float) -> None:
        self._db = db
        self._size = size
        self._ttl = ttl
        self._by_hash: OrderedDict[str, tuple[KeyRecord | None, float]] = OrderedDict()
        self._hash_of: dict[int, str] = {}
        self._loading: dict[str, trio.Event] = {}
        # Bumped by every invalidation: a load that started before one must not cache
        # what it read, which may be the state before the change.
        self._generation = 0

    def cached(self, key_hash: str) -> KeyRecord | None | Literal[Miss.MISS]:
        """The cached record of ``key_hash`` (None: known not to exist), or ``Miss.MISS``."""
        entry = self._by_hash.get(key_hash)
        if entry is None or entry[1] <= time.monotonic():
            return Miss.MISS
        self._by_hash.move_to_end(key_hash)
        return entry[0]

    async def lookup(self, key_hash: str) -> KeyRecord | None:
        """The record of ``key_hash`` (revoked ones included), None when there is none."""
        found = self.cached(key_hash)
        if found is not Miss.MISS:
            return found
        pending = self._loading.get(key_hash)
        if pending is not None:
            await pending.wait()
            found = self.cached(key_hash)
            if found is not Miss.MISS:
                return found
        return await self._load(key_hash)

    async def by_id(self, key_id: int) -> KeyRecord | None:
        """The record of key ``key_id`` (cached when its hash is), None when there is none."""
        key_hash = self._hash_of.get(key_id)
        if key_hash is not None:
            found = self.cached(key_hash)
            if found is not Miss.MISS and found is not None:
                return found
        generation = self._generation
        record: KeyRecord | None = await self._db.read(load_by_id, key_id)
        if record is not None and generation == self._generation:
            self._store(record.key_hash, record)
        return record

    def clear(self) -> None:
        """Forget every key (invalidations may have been missed)."""
        self._generation += 1
        self._by_hash.clear()
        self._hash_of.clear()

    def invalidate(self, key_id: int) -> None:
        """Forget key ``key_id``; the next request with it reads the database."""
        self._generation += 1
        key_hash = self._hash_of.pop(key_id, None)
        if key_hash is not None:
            self._by_hash.pop(key_hash, None)

    async def _load(self, key_hash: str) -> KeyRecord | None:
        done = trio.Event()
        self._loading[key_hash] = done
        generation = self._generation
        try:
            record: KeyRecord | None = await self._db.read(load_by_hash, key_hash)
        finally:
            if self._loading.get(key_hash) is done:
                del self._loading[key_hash]
            done.set()
        if generation == self._generation:
            self._store(key_hash, record)
        return record

    def _store(self, key_hash: str, record: KeyRecord | None) -> None:
        ttl = self._ttl if record is not None else min(self._ttl, _UNKNOWN_TTL_SECONDS)
        self._by_hash[key_hash] = (record, time.monotonic() + ttl)
        self._by_hash.move_to_end(key_hash)
        if record is not None:
            self._hash_of[record.id] = key_hash
        while len(self._by_hash) > self._size:
            _, (evicted, _) = self._by_hash.popitem(last=False)
            if evicted is not None:
                self._hash_of.pop(evicted.id, None)


async def announce_change(directory: KeyDirectory, shared: SharedState, key_id: int) -> None:
    """Drop key ``key_id`` here at once and tell every process to drop it too."""
    directory.invalidate(key_id)
    await shared.publish(CHANGED_CHANNEL, str(key_id))


def directory_actor(directory: KeyDirectory, db: Database, shared: SharedState,
                    poll_seconds: float) -> ActorSpec:
    """The actor that keeps ``directory`` in step with the database on this process.

    It listens to ``keys.changed`` and polls for keys changed since the last poll (the
    polls overlap by one interval, so a change committed during a poll is not missed). It
    takes no messages: this process's own changes call ``announce_change``.
    """
    since = utcnow()

    async def resync() -> None:
        nonlocal since
        since = utcnow() - timedelta(seconds=poll_seconds)
        directory.clear()

    def apply(message: str) -> None:
        if message.isdigit():
            directory.invalidate(int(message))

    async def poll() -> None:
        nonlocal since
        checked_at = utcnow()
        for key_id in await db.read(changed_since, since):
            directory.invalidate(key_id)
        since = checked_at - timedelta(seconds=poll_seconds)

    feed = ChangeFeed(DIRECTORY_ACTOR, CHANGED_CHANNEL, resync, apply, poll, poll_seconds)

    async def run(mailbox: Mailbox, *,
                  task_status: trio.TaskStatus[Any] = trio.TASK_STATUS_IGNORED) -> None:
        await follow_changes(feed, shared, mailbox, task_status=task_status)

    return ActorSpec(name=DIRECTORY_ACTOR, run=run, mailbox_size=256)
