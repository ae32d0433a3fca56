"""The Redis meter backend: one atomic script call for a whole batch of key requests.

Every process sends its key requests to its ``keys.meter`` actor's batcher, which runs
them through one Lua script per round trip: under load, all the requests that arrived
while the previous call was out go together (a call costs about 130 us of client CPU,
an item in a batch about 30 us). The script is atomic, so two processes sharing one Redis
enforce one cap per key, one bucket per user and one spend per period.

For each item the script meters, in order: the key's sliding window
(``keys:{u<user>}:<id>:win``), the period spend (hash ``keys:{u<user>}:<id>:spend`` holding
``pk`` and ``used``), and the owner's
service-wide bucket. The bucket is the very sorted set ``SharedState.hit_window`` keeps
for ``runtime.limits.user_bucket``, named by ``runtime.shared.window_key`` (scores and
members in milliseconds), so session and key requests of a user share it. A charge with a
token (``MeterItem``) also sets ``keys:{u<user>}:<id>:charge:<token>`` (kept 7 days) in the
same step, so a charge retried after a timeout (the script may have run in Redis all the same)
is applied once.
A spend hash that is missing (expired after 40 idle days, or Redis was emptied) or holds an
older period starts from the database's figure (``seed``) plus the spend this process
applied and has not written to the database yet, so a restart of Redis or of a process
does not reset a period's spend. After a failed call (Redis down, restarting, perhaps
emptied) the meter makes the key directory forget its records (``forget_records``), so
that the seeds of the next calls are read from the database again rather than from
records cached before the outage.

Every key of an item carries its owner's hash tag (``runtime.limits.user_tag``, like the
bucket), so on a Redis Cluster an item's keys share one slot. A batch is cut into one script
call per slot (``RedisAccess.slot``; one call on one Redis), sent in one pipeline
(``RedisScript.call_each``: one round trip per node).
"""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import Callable
from datetime import datetime
from itertools import count
from typing import Any

import trio
from coredis.exceptions import RedisError

from plugins.keys.metering import (
    STATUSES,
    TOKEN_TTL_SECONDS,
    MeterItem,
    MeterResult,
    SpendLedger,
)
from plugins.keys.records import KeyRecord
from runtime.errors import Unavailable
from runtime.limits import WINDOW_SECONDS, user_bucket, user_tag
from runtime.shared import RedisAccess, window_key

log = logging.getLogger("flowsvc.keys")
_SPEND_TTL_MS = 40 * 86_400_000
_MAX_QUEUE = 10_000


def user_bucket_key(user_id: int) -> str:
    """The logical Redis name of the owner's service-wide bucket (``SharedState.hit_window``'s)."""
    return window_key(user_bucket(user_id))


def key_name(user_id: int, key_id: int, what: str) -> str:
    """The logical Redis name of one of an API key's meter keys. All of them carry the
    owner's hash tag, as the owner's bucket does, so they share a cluster slot and one
    script may touch them all."""
    return f"keys:{user_tag(user_id)}:{key_id}:{what}"


# KEYS: per item: key window, user window, spend hash, charge token.
# ARGV[1] = now (ms), ARGV[2] = token TTL (ms); per item: mode, key rpm, user rpm, limit
# (-1: none), cost, period key, seed, window member, spend TTL (ms), has token (1 or 0).
# A token's key holds the period its charge was applied in, or 'v' once voided (mode 4),
# until a reopen (mode 5) deletes the 'v'.
# Returns per item: status (0 ok, 1 key rate, 2 user rate, 3 spend, 4 void), key count,
# oldest key hit (ms, -1 none), oldest user hit (ms, -1 unknown), used, period key,
# applied spend.
_METER_LUA = """
local now, token_ttl = tonumber(ARGV[1]), tonumber(ARGV[2])
local window = WINDOW_MS
local out = {}
for i = 1, #KEYS / 4 do
  local kw, uw, sp, tk = KEYS[4 * i - 3], KEYS[4 * i - 2], KEYS[4 * i - 1], KEYS[4 * i]
  local a = 3 + (i - 1) * 10
  local mode, key_rpm, user_rpm = tonumber(ARGV[a]), tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2])
  local limit, cost, pk = tonumber(ARGV[a + 3]), tonumber(ARGV[a + 4]), tonumber(ARGV[a + 5])
  local seed, member, ttl = tonumber(ARGV[a + 6]), ARGV[a + 7], tonumber(ARGV[a + 8])
  local tokened = ARGV[a + 9] == '1'
  local stored = redis.call('HMGET', sp, 'pk', 'used')
  local spk, used = tonumber(stored[1]), tonumber(stored[2])
  if spk == nil or spk < pk then
    spk, used = pk, seed
    redis.call('HSET', sp, 'pk', spk, 'used', used)
    redis.call('PEXPIRE', sp, ttl)
  end
  local status, kcount, uoldest, applied = 0, 0, -1, 0
  local counting = mode == 1 and key_rpm > 0
  local seen = false
  if tokened then seen = redis.call('GET', tk) end
  if tokened and mode == 5 then
    if seen == 'v' then redis.call('DEL', tk) end
  elseif tokened and mode == 4 then
    if seen and seen ~= 'v' and tonumber(seen) == spk then
      applied = -math.min(cost, used)
      used = redis.call('HINCRBY', sp, 'used', applied)
      redis.call('PEXPIRE', sp, ttl)
    end
    redis.call('SET', tk, 'v', 'PX', token_ttl)
  elseif seen == 'v' then
    status = 4
  elseif seen then
    applied = cost
  else
    if counting then
      redis.call('ZREMRANGEBYSCORE', kw, '-inf', now - window)
      kcount = redis.call('ZCARD', kw)
      if kcount >= key_rpm then status = 1 end
    end
    if status == 0 and mode ~= 3 and limit >= 0 and used >= limit then status = 3 end
    if status == 0 and mode == 1 and user_rpm > 0 then
      redis.call('ZREMRANGEBYSCORE', uw, '-inf', now - window)
      if redis.call('ZCARD', uw) >= user_rpm then
        status = 2
        local oldest = redis.call('ZRANGE', uw, 0, 0, 'WITHSCORES')
        if oldest[2] then uoldest = tonumber(oldest[2]) end
      end
    end
    if status == 0 then
      if counting then
        redis.call('ZADD', kw, now, member)
        redis.call('PEXPIRE', kw, window)
        kcount = kcount + 1
      end
      if mode == 1 and user_rpm > 0 then
        redis.call('ZADD', uw, now, member)
        redis.call('PEXPIRE', uw, window)
      end
      if mode == 3 then
        if spk == pk then applied = -math.min(cost, used) end
      else
        applied = cost
      end
      if applied ~= 0 then
        used = redis.call('HINCRBY', sp, 'used', applied)
        redis.call('PEXPIRE', sp, ttl)
      end
      if tokened then redis.call('SET', tk, spk, 'PX', token_ttl) end
    end
  end
  local koldest = -1
  if counting then
    local oldest = redis.call('ZRANGE', kw, 0, 0, 'WITHSCORES')
    if oldest[2] then koldest = tonumber(oldest[2]) end
  end
  for _, value in ipairs({status, kcount, koldest, uoldest, used, spk, applied}) do
    out[#out + 1] = value
  end
end
return out
""".replace("WINDOW_MS", str(int(WINDOW_SECONDS * 1000)))

# KEYS: spend hashes. Returns pk, used of each (false when missing).
_READ_SPEND_LUA = """
local out = {}
for i = 1, #KEYS do
  local stored = redis.call('HMGET', KEYS[i], 'pk', 'used')
  out[#out + 1] = stored[1] or -1
  out[#out + 1] = stored[2] or 0
end
return out
"""


class _Slot:
    """Where the batcher puts one item's answer."""

    def __init__(self) -> None:
        self.done = trio.Event()
        self.result: MeterResult | None = None
        self.error: Exception | None = None

    def finish(self, result: MeterResult | None, error: Exception | None = None) -> None:
        self.result, self.error = result, error
        self.done.set()


class RedisMeter:
    """Meters kept in Redis; ``run`` is the batcher, owned by the ``keys.meter`` actor.

    :param redis: the shared Redis (scripts, keys under the service prefix).
    :param max_batch: items per script call at most.
    :param timeout: seconds a script call may take before its items fail with 503.
    :param forget_records: called after a failed call: drops cached key records, whose
        spend figures seed Redis again if it comes back empty.
    """

    def __init__(self, redis: RedisAccess, max_batch: int, timeout: float,
                 forget_records: Callable[[], None]) -> None:
        self._redis = redis
        self._script = redis.script(_METER_LUA)
        self._read_script = redis.script(_READ_SPEND_LUA)
        self._max_batch = max_batch
        self._timeout = timeout
        self._forget_records = forget_records
        self._queue: list[tuple[MeterItem, _Slot]] = []
        self._wake = trio.Event()
        self._running = False
        self._member_tag = secrets.token_hex(4)
        self._members = count()
        self.spend = SpendLedger()

    async def meter(self, item: MeterItem, now: float) -> MeterResult:
        """Queue ``item`` for the next script call and wait for its answer.

        :raises Unavailable: the batcher is not running, is too far behind, or Redis failed.
        """
        if not self._running or len(self._queue) >= _MAX_QUEUE:
            raise Unavailable("the API key meter is unavailable")
        slot = _Slot()
        self._queue.append((item, slot))
        self._wake.set()
        await slot.done.wait()
        if slot.error is not None:
            raise slot.error
        assert slot.result is not None
        return slot.result

    async def run(self, *, task_status: trio.TaskStatus[Any] = trio.TASK_STATUS_IGNORED) -> None:
        """The batcher: one script call at a time, each with everything queued meanwhile."""
        self._running = True
        task_status.started()
        try:
            while True:
                await self._wake.wait()
                self._wake = trio.Event()
                while self._queue:
                    batch = self._queue[:self._max_batch]
                    del self._queue[:self._max_batch]
                    await self._execute(batch)
        finally:
            self._running = False
            error = Unavailable("the API key meter stopped")
            for _, slot in self._queue:
                slot.finish(None, error)
            self._queue.clear()

    async def _execute(self, batch: list[tuple[MeterItem, _Slot]]) -> None:
        now_ms = int(time.time() * 1000)
        groups: dict[int, list[tuple[MeterItem, _Slot]]] = {}
        for entry in batch:
            groups.setdefault(self._redis.slot(user_bucket_key(entry[0].user_id)), []).append(entry)
        try:
            with trio.fail_after(self._timeout):
                if len(groups) == 1:
                    replies: list[Any] = [await self._script(*self._call(batch, now_ms))]
                else:  # a cluster: one call per slot, in one pipeline
                    replies = await self._script.call_each(
                        [self._call(group, now_ms) for group in groups.values()])
        except (Exception, trio.TooSlowError) as exc:
            replies = [exc] * len(groups)
        for group, reply in zip(groups.values(), replies, strict=True):
            self._finish(group, reply)

    def _call(self, batch: list[tuple[MeterItem, _Slot]], now_ms: int
              ) -> tuple[list[str], list[int | str]]:
        """The keys and arguments of one script call for ``batch`` (keys of one slot)."""
        keys: list[str] = []
        args: list[int | str] = [now_ms, TOKEN_TTL_SECONDS * 1000]
        for item, _ in batch:
            keys += [key_name(item.user_id, item.key_id, "win"), user_bucket_key(item.user_id),
                     key_name(item.user_id, item.key_id, "spend"),
                     key_name(item.user_id, item.key_id, f"charge:{item.token}")]
            args += [item.mode, item.key_rpm, item.user_rpm,
                     -1 if item.limit is None else item.limit, item.cost, item.period_key,
                     item.seed + self.spend.pending(item.key_id, item.period_key),
                     f"{now_ms}:{self._member_tag}{next(self._members)}",
                     _SPEND_TTL_MS, 1 if item.token else 0]
        return keys, args

    def _finish(self, batch: list[tuple[MeterItem, _Slot]], reply: Any) -> None:
        """Answer the items of one script call with its ``reply`` (or the error it met)."""
        if isinstance(reply, BaseException):
            log.warning("key meter script failed: %s", type(reply).__name__)
            self._forget_records()
            error = Unavailable("the API key meter cannot reach Redis")
            for _, slot in batch:
                slot.finish(None, error)
            return
        for index, (item, slot) in enumerate(batch):
            status, kcount, koldest, uoldest, used, period, applied = (
                int(value) for value in reply[index * 7:index * 7 + 7])
            if not item.token:  # a token's spend is written by its charge's transaction
                self.spend.add(item.key_id, period, applied)
            slot.finish(MeterResult(
                STATUSES[status], kcount,
                None if koldest < 0 else koldest / 1000, None if uoldest < 0 else uoldest / 1000,
                used, period, applied))

    async def period_used(self, records: list[KeyRecord], now: datetime) -> dict[int, int]:
        """The live period spend of each key, from Redis (the database's when Redis has none).

        :raises Unavailable: Redis cannot be reached.
        """
        groups: dict[int, list[KeyRecord]] = {}
        for record in records:
            groups.setdefault(self._redis.slot(user_bucket_key(record.user_id)), []).append(record)
        try:  # one call per slot (one on one Redis), in one pipeline
            replies = await self._read_script.call_each(
                [([key_name(record.user_id, record.id, "spend") for record in group], [])
                 for group in groups.values()])
        except (RedisError, OSError) as exc:
            raise Unavailable("the API key meter cannot reach Redis") from exc
        stored: dict[int, tuple[int, int]] = {}
        for group, reply in zip(groups.values(), replies, strict=True):
            if isinstance(reply, Exception):
                raise Unavailable("the API key meter cannot reach Redis") from reply
            for index, record in enumerate(group):
                stored[record.id] = int(reply[2 * index]), int(reply[2 * index + 1])
        used = {}
        for record in records:
            current = record.current_period_key(now)
            stored_key, stored_used = stored[record.id]
            # Like the script: Redis holds the current period, or it starts from the database.
            used[record.id] = stored_used if stored_key >= current \
                else record.stored_spend(current)
        return used
