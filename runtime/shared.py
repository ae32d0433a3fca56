"""State shared between service processes: window counters, keys with a TTL, fan-out, locks.

One interface, two implementations: ``MemorySharedState`` for the embedded default (one
process, nothing to install) and ``RedisSharedState`` when ``FLOWSVC_REDIS_URL`` is set,
over coredis, which is Trio-native through AnyIO (no blocking client in threads).
Plugins that need a Redis feature beyond this interface (a Lua script of their own,
Streams) use ``shared.redis``, a narrow ``RedisAccess`` (None on the memory kind, where
they keep an in-process twin): it names keys under the service prefix and never hands
out the client. Key layouts that several modules depend on are named here
(``window_key``).

Rate windows are sliding logs: exact (the Nth request inside any 60-second span is
refused when the cap is N), and ``retry_after`` is when the oldest counted request
leaves the window.
"""

from __future__ import annotations

import math
import secrets
import time
from collections import defaultdict, deque
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, Any, Literal, Protocol
from urllib.parse import urlsplit

import trio

from runtime.config import ConfigError
from runtime.errors import Unavailable, is_outage

if TYPE_CHECKING:  # imported where Redis is used: a service without it never loads coredis
    import coredis

_SUBSCRIBER_BUFFER = 1024
_SWEEP_SECONDS = 60.0


@dataclass(frozen=True)
class WindowDecision:
    """The answer of a sliding-window counter.

    :param allowed: whether this hit was counted.
    :param remaining: slots left in the window after this hit.
    :param reset_at: Unix time (float seconds) when the oldest counted hit leaves the
        window (when a slot frees up); now when the window is empty.
    :param retry_after: whole seconds to wait before a refused hit can succeed (0 if allowed).
    """

    allowed: bool
    remaining: int
    reset_at: float
    retry_after: int


def window_key(name: str) -> str:
    """The logical key of the sliding window ``hit_window(name, ...)`` keeps in Redis: a
    sorted set whose scores and members are milliseconds. The keys meter's Lua script
    counts API-key requests in the owner's service-wide bucket through this very key."""
    return "win:" + name


class SharedState(Protocol):
    kind: Literal["memory", "redis"]
    redis: RedisAccess | None

    async def hit_window(self, key: str, limit: int, window: float) -> WindowDecision: ...
    async def get(self, key: str) -> str | None: ...
    async def set(self, key: str, value: str, *, ttl: float | None = None,
                  only_if_absent: bool = False) -> bool: ...
    async def delete(self, key: str) -> None: ...
    async def publish(self, channel: str, message: str) -> None: ...
    def subscribe(self, channel: str) -> Any: ...
    def lock(self, name: str, *, ttl: float = 30.0) -> Any: ...
    async def ping(self) -> None: ...


def _decision(allowed: bool, limit: int, count: int, oldest: float | None, now: float,
              window: float) -> WindowDecision:
    reset_at = (oldest + window) if oldest is not None else now
    retry_after = 0 if allowed else max(1, math.ceil(reset_at - now))
    return WindowDecision(allowed, max(0, limit - count), reset_at, retry_after)


class MemorySharedState:
    """The embedded default: everything lives in this process.

    :param sweep_seconds: how often idle windows and expired values are forgotten (Redis
        expires its keys itself; here one window per client IP would otherwise stay for
        the life of the process).
    """

    kind: Literal["memory", "redis"] = "memory"
    redis: RedisAccess | None = None

    def __init__(self, sweep_seconds: float = _SWEEP_SECONDS) -> None:
        self._windows: dict[str, deque[float]] = defaultdict(deque)
        self._values: dict[str, tuple[str, float | None]] = {}
        self._subscribers: dict[str, set[trio.MemorySendChannel[str]]] = defaultdict(set)
        self._locks: dict[str, trio.Lock] = defaultdict(trio.Lock)
        self._longest_window = 0.0
        self._sweep_seconds = sweep_seconds
        self._next_sweep = time.time() + sweep_seconds

    def _sweep(self, now: float) -> None:
        """Forget windows whose every hit is out of the longest window, and expired values."""
        if now < self._next_sweep:
            return
        self._next_sweep = now + self._sweep_seconds
        for key in [key for key, hits in self._windows.items()
                    if not hits or hits[-1] <= now - self._longest_window]:
            del self._windows[key]
        for key in [key for key, (_value, expires) in self._values.items()
                    if expires is not None and expires <= now]:
            del self._values[key]

    async def hit_window(self, key: str, limit: int, window: float) -> WindowDecision:
        now = time.time()
        self._sweep(now)
        self._longest_window = max(self._longest_window, window)
        hits = self._windows[key]
        while hits and hits[0] <= now - window:
            hits.popleft()
        allowed = len(hits) < limit
        if allowed:
            hits.append(now)
        return _decision(allowed, limit, len(hits), hits[0] if hits else None, now, window)

    async def get(self, key: str) -> str | None:
        entry = self._values.get(key)
        if entry is None:
            return None
        value, expires = entry
        if expires is not None and expires <= time.time():
            del self._values[key]
            return None
        return value

    async def set(self, key: str, value: str, *, ttl: float | None = None,
                  only_if_absent: bool = False) -> bool:
        self._sweep(time.time())
        if only_if_absent and await self.get(key) is not None:
            return False
        self._values[key] = (value, time.time() + ttl if ttl else None)
        return True

    async def delete(self, key: str) -> None:
        self._values.pop(key, None)

    async def publish(self, channel: str, message: str) -> None:
        for send in list(self._subscribers[channel]):
            try:
                send.send_nowait(message)
            except trio.WouldBlock:
                # A subscriber this far behind is cut off; it re-syncs when it re-subscribes.
                await send.aclose()
                self._subscribers[channel].discard(send)

    @asynccontextmanager
    async def subscribe(self, channel: str) -> AsyncIterator[trio.MemoryReceiveChannel[str]]:
        send, receive = trio.open_memory_channel[str](_SUBSCRIBER_BUFFER)
        self._subscribers[channel].add(send)
        try:
            yield receive
        finally:
            self._subscribers[channel].discard(send)

    @asynccontextmanager
    async def lock(self, name: str, *, ttl: float = 30.0) -> AsyncIterator[None]:
        async with self._locks[name]:
            yield

    async def ping(self) -> None:
        return None


# KEYS[1] = window key; ARGV = now (ms), window (ms), limit, member
_SLIDING_WINDOW_LUA = """
local now = tonumber(ARGV[1])
local window = tonumber(ARGV[2])
local limit = tonumber(ARGV[3])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - window)
local count = redis.call('ZCARD', KEYS[1])
local allowed = 0
if count < limit then
  redis.call('ZADD', KEYS[1], now, ARGV[4])
  count = count + 1
  allowed = 1
end
redis.call('PEXPIRE', KEYS[1], window)
local oldest = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
local oldest_score = -1
if oldest[2] then oldest_score = tonumber(oldest[2]) end
return {allowed, count, oldest_score}
"""

_UNLOCK_LUA = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""


class RedisScript:
    """A Lua script registered once; call it with logical key names (prefixed for you)."""

    def __init__(self, access: RedisAccess, source: str) -> None:
        self._access = access
        self._script = access._client.register_script(source)

    async def __call__(self, keys: Sequence[str], args: Sequence[int | str]) -> Any:
        """Run the script atomically on ``keys`` (logical names) with ``args``."""
        return await self._script(keys=[self._access.key(name) for name in keys],
                                  args=list(args))

    async def call_each(self, calls: Sequence[tuple[Sequence[str], Sequence[int | str]]]
                        ) -> list[Any]:
        """Run the script once per ``(keys, args)``, all in one pipeline (on a Redis Cluster,
        one round trip per node: the calls whose keys are in different slots); each call's
        reply, or the exception it met. Each call is atomic, the set is not. A pipeline is
        far cheaper per call than separate calls; a node that lost the script (a replica
        just promoted) gets it again and its calls are sent once more."""
        from coredis.exceptions import NoScriptError

        replies: list[Any] = [None] * len(calls)
        pending = list(range(len(calls)))
        client = self._access._client
        for attempt in range(2):
            async with client.pipeline(transaction=False, raise_on_error=False) as pipe:
                requests = [pipe.evalsha(self._script.sha,
                                         keys=[self._access.key(name) for name in calls[i][0]],
                                         args=list(calls[i][1])) for i in pending]
            lost = []
            for index, request in zip(pending, requests, strict=True):
                try:
                    replies[index] = await request
                except NoScriptError as exc:
                    replies[index] = exc
                    lost.append(index)
                except Exception as exc:  # each call's own failure, for its caller
                    replies[index] = exc
            if not lost or attempt:
                break
            await client.script_load(self._script.script)
            pending = lost
        return replies


@dataclass(frozen=True)
class StreamEntry:
    """One entry of a Redis Stream: its id (``<ms>-<seq>``) and its fields."""

    identifier: str
    fields: dict[str, str]


class RedisAccess:
    """What a plugin may do with the shared Redis beyond ``SharedState``: Lua scripts and
    Streams, on keys under the service prefix. Keys are logical names (``keys:win:7``);
    the prefix is added here and never seen by plugins.

    :param client: the connected coredis client the shared state owns.
    :param slot_of: the hash slot of a full key on a Redis Cluster; None on one Redis,
        where every key is in one slot.
    """

    def __init__(self, client: coredis.Redis[str], prefix: str, timeout: float,
                 slot_of: Callable[[str], int] | None = None) -> None:
        self._client = client
        self._prefix = prefix
        self._timeout = timeout
        self._slot_of = slot_of

    def key(self, name: str) -> str:
        """The Redis key of a logical name (every key carries the service prefix)."""
        return self._prefix + name

    def slot(self, name: str) -> int:
        """The hash slot of a logical name (0 for all on one Redis). A script call or a
        multi-key command must touch names of one slot: a Redis Cluster refuses others."""
        return 0 if self._slot_of is None else self._slot_of(self.key(name))

    def script(self, source: str) -> RedisScript:
        """Register the Lua script ``source``; its ``KEYS`` are given as logical names."""
        return RedisScript(self, source)

    async def stream_add(self, stream: str, entries: Sequence[tuple[str, Mapping[str, str]]],
                         *, max_length: int) -> None:
        """Append ``(id, fields)`` entries to ``stream`` in one round trip, trimmed to about
        ``max_length`` entries; id ``"*"`` lets Redis number the entry. An entry whose id is
        not above the stream's last (a repeated batch) is refused by Redis and skipped."""
        from coredis import PureToken

        key = self.key(stream)
        async with self._client.pipeline(transaction=False, raise_on_error=False) as pipe:
            for identifier, fields in entries:
                pipe.xadd(key, dict(fields), identifier=identifier,
                          trim_strategy=PureToken.MAXLEN,
                          trim_operator=PureToken.APPROXIMATELY, threshold=max_length)

    async def stream_read(self, positions: Mapping[str, str], *, count: int, block_ms: int
                          ) -> dict[str, list[StreamEntry]]:
        """The entries after each stream's position (``"$"``: only new ones), waiting up to
        ``block_ms`` for one; keyed by the logical stream names asked for. The wait is cut
        to half the command deadline (``redis.timeout_seconds``), which it must stay under;
        an empty answer is the same as a wait that found nothing."""
        block_ms = min(block_ms, int(self._timeout * 500))
        reply = await self._client.xread({self.key(name): position
                                          for name, position in positions.items()},
                                         count=count, block=block_ms)
        entries: dict[str, list[StreamEntry]] = {}
        for key, items in (reply or {}).items():
            entries[str(key)[len(self._prefix):]] = [
                StreamEntry(str(item.identifier),
                            {str(name): str(value) for name, value in item.field_values.items()})
                for item in items]
        return entries


class _RedisOutageIsUnavailable:
    """``with`` it around a Redis call: a Redis outage (``is_outage``) becomes
    ``Unavailable``, so a route that meets one answers 503 ``unavailable`` rather than 500;
    anything else (a bug) passes unchanged. A class rather than ``@contextmanager``: it is on
    the path of every rate-limited request, and a generator-based one costs several times
    more per use."""

    def __enter__(self) -> None:
        return None

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 traceback: TracebackType | None) -> None:
        if isinstance(exc, Exception) and is_outage(exc) and not isinstance(exc, Unavailable):
            raise Unavailable("redis is unavailable") from exc


_redis_outage_is_unavailable = _RedisOutageIsUnavailable()


class RedisSharedState:
    """Shared state in Redis, for several service processes behind a load balancer.

    A Redis outage surfaces from every method as ``Unavailable`` (503 on a route); a
    subscription that breaks later raises the client's own error from its iterator, which
    ``runtime.follow`` and other listeners tell from a bug with ``is_outage``.

    :param client: a connected coredis client (``decode_responses=True``); owned by the
        caller of ``open_shared_state``.
    :param timeout: the client's command deadline (its ``stream_timeout``), in seconds.
    """

    kind: Literal["memory", "redis"] = "redis"

    def __init__(self, client: coredis.Redis[str], prefix: str = "flowsvc:", *,
                 timeout: float = 2.0) -> None:
        self._client = client
        access = RedisAccess(client, prefix, timeout)
        self.redis: RedisAccess | None = access
        self.key = access.key
        self._window_script = client.register_script(_SLIDING_WINDOW_LUA)
        self._unlock_script = client.register_script(_UNLOCK_LUA)

    async def hit_window(self, key: str, limit: int, window: float) -> WindowDecision:
        now_ms = int(time.time() * 1000)
        member = f"{now_ms}:{secrets.token_hex(6)}"
        with _redis_outage_is_unavailable:
            reply: list[int] = await self._window_script(
                keys=[self.key(window_key(key))],
                args=[now_ms, int(window * 1000), limit, member])
        allowed, count, oldest = reply
        oldest_s = None if int(oldest) < 0 else int(oldest) / 1000
        return _decision(bool(allowed), limit, int(count), oldest_s, now_ms / 1000, window)

    async def get(self, key: str) -> str | None:
        with _redis_outage_is_unavailable:
            return await self._client.get(self.key(key))

    async def set(self, key: str, value: str, *, ttl: float | None = None,
                  only_if_absent: bool = False) -> bool:
        from coredis import PureToken

        px = int(ttl * 1000) if ttl else None
        with _redis_outage_is_unavailable:
            result = await self._client.set(
                self.key(key), value, px=px,
                condition=PureToken.NX if only_if_absent else None)
        return bool(result)

    async def delete(self, key: str) -> None:
        with _redis_outage_is_unavailable:
            await self._client.delete([self.key(key)])

    async def publish(self, channel: str, message: str) -> None:
        with _redis_outage_is_unavailable:
            await self._client.publish(self.key(channel), message)

    @asynccontextmanager
    async def subscribe(self, channel: str) -> AsyncIterator[_PubSubMessages]:
        pubsub = self._client.pubsub(channels=[self.key(channel)])
        async with pubsub:
            yield _PubSubMessages(pubsub)

    @asynccontextmanager
    async def lock(self, name: str, *, ttl: float = 30.0) -> AsyncIterator[None]:
        token = secrets.token_hex(16)
        key = self.key("lock:" + name)
        # A Redis lock is taken by retrying SET NX; no event can tell us it was freed.
        while not await self.set("lock:" + name, token, ttl=ttl,  # noqa: ASYNC110
                                 only_if_absent=True):
            await trio.sleep(0.02)
        try:
            yield
        finally:
            with trio.CancelScope(shield=True):
                await self._unlock_script(keys=[key], args=[token])

    async def ping(self) -> None:
        try:
            await self._client.ping()
        except Exception as exc:
            raise Unavailable("redis is unavailable") from exc


class _PubSubMessages:
    """The payloads of a pubsub's messages.

    An iterator object, not an async generator: a subscriber that stops reading early
    would leave a suspended generator behind (a ResourceWarning).
    """

    def __init__(self, pubsub: Any) -> None:
        self._pubsub = pubsub

    def __aiter__(self) -> _PubSubMessages:
        return self

    async def __anext__(self) -> str:
        while True:
            message = await self._pubsub.__anext__()
            if message["type"] in ("message", "smessage"):  # smessage: sharded, on a cluster
                return str(message["data"])


@asynccontextmanager
async def open_shared_state(redis_url: str, prefix: str = "flowsvc:", *,
                            connect_timeout: float = 2.0, timeout: float = 2.0
                            ) -> AsyncIterator[SharedState]:
    """The shared state for ``redis_url``: Redis when set, in-process when empty.

    :param prefix: put before every Redis key and channel, so that several deployments
        (or test runs) can share one Redis.
    :param connect_timeout: the deadline of opening a Redis connection, in seconds.
    :param timeout: the deadline of one Redis command's answer (``redis.timeout_seconds``);
        past it the command raises ``TimeoutError``, an outage (503 on a route).
    """
    if not redis_url:
        yield MemorySharedState()
        return
    # Imported here: the cluster backend builds on this module's classes, and a service
    # without Redis never loads coredis (about 0.25 s of a start).
    import coredis

    from runtime.shared_cluster import RedisClusterSharedState, redis_client

    client = redis_client(redis_url, connect_timeout=connect_timeout, timeout=timeout)
    async with client:
        if isinstance(client, coredis.RedisCluster):
            yield RedisClusterSharedState(client, prefix, timeout=timeout)
        else:
            yield RedisSharedState(client, prefix, timeout=timeout)


REDIS_START_SECONDS = 5.0


async def probe_redis(redis_url: str) -> None:
    """Fail a start with a clear message instead of retrying forever on a dead Redis.

    The CLI calls it before serving; a service embedded in-process (tests) may start
    with Redis down and report it on ``/readyz``. A separate short-lived client keeps
    the timeout's cancel scope around its whole lifetime (coredis clients run tasks of
    their own while open).

    :raises ConfigError: Redis does not answer within ``REDIS_START_SECONDS``.
    """
    from runtime.shared_cluster import redis_client  # a cycle at the top (see above)

    where = urlsplit(redis_url).netloc.rpartition("@")[2]  # never print a password
    try:
        with trio.fail_after(REDIS_START_SECONDS):
            probe = redis_client(redis_url)
            async with probe:
                await probe.ping()
    except Exception as exc:  # a timeout, or coredis errors, bare or grouped by its tasks
        raise ConfigError(f"cannot reach Redis at {where} ({root_cause(exc)}); "
                          "check FLOWSVC_REDIS_URL") from None


def root_cause(error: BaseException) -> str:
    """What went wrong, for a person: the innermost exception of a chain or of a group of
    one cause (coredis wraps a refused connection in its tasks' exception group)."""
    while True:
        if isinstance(error, BaseExceptionGroup) and error.exceptions:
            error = error.exceptions[0]
        elif error.__cause__ is not None:
            error = error.__cause__
        else:
            break
    if isinstance(error, trio.TooSlowError):
        return f"no answer within {REDIS_START_SECONDS:g} s"
    return f"{type(error).__name__}: {error}" if str(error) else type(error).__name__
