"""Rankings of the marketplace listing and the keyset paging over them.

Every listed (published) agent has one *open* row per sort in ``marketplace_rank_entries``
holding its current score. A change of score closes the open row at the time of the change
(``valid_to``) and opens a new one (``valid_from``); unpublishing closes all four, publishing
opens them. The rows therefore record, for any past moment T, the ranking as it was at T.

A listing takes two times on its first page: L, the moment of the request, and the snapshot
T = L - ``snapshot_lag_ms`` (far enough in the past that no change still being committed
can fall before it). Each agent published at L is ranked by one row: the row valid at T,
or, for an agent listed only after T, its *first* row after T (its publication). It pages
through those rows in ``(score, agent_id)`` descending order; the cursor carries T, L and
the last ``(score, id)``. An agent's rows are written in time order (each writer locks the
agent first), so the row an agent is ranked by never changes once committed: score changes
after T and agents published after L do not move anything in the listing, each agent
listed at L is returned exactly once however the scores move while the client pages, an
agent published just before L is in it (read-after-write), and one unpublished meanwhile
is hidden at once. Old rows are pruned once no cursor can still need them
(``cursor_ttl_seconds``).

Scores (integers, larger ranks first; ties broken by the larger agent id):

- ``new``: the time the agent was last published (microseconds).
- ``top_earning``: FLOW the agent has earned its owner, in micro-FLOW.
- ``top_rated``: the Bayesian average of its stars, (5 x 3 + sum) / (5 + count), x 10^9.
- ``trending``: log2 of the sum over its runs of 2^((t_run - 2024-01-01) / 24 h), x 10^9:
  every run counts 1 when it starts and half as much a day later. The decay factor is the
  same for every agent at any moment, so the order only changes when a run starts.
"""

from __future__ import annotations

import base64
import binascii
import functools
import json
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

from sqlalchemy import (
    BigInteger,
    Connection,
    Row,
    Select,
    and_,
    bindparam,
    delete,
    exists,
    insert,
    or_,
    select,
    tuple_,
    update,
)

from plugins.marketplace.tables import agent_tags, agents, rank_entries
from runtime.errors import InvalidRequest
from runtime.inputs import MAX_ID
from runtime.users import users
from runtime.wire import as_utc

Sort = Literal["trending", "new", "top_earning", "top_rated"]
SORTS: tuple[Sort, ...] = ("trending", "new", "top_earning", "top_rated")
OPEN = 2**62
NO_RUNS = -(2**62)
SCALE = 10**9
TRENDING_EPOCH_S = 1_704_067_200  # 2024-01-01T00:00:00Z
TRENDING_HALF_LIFE_S = 86_400.0
RATING_PRIOR_MEAN = 3
RATING_PRIOR_WEIGHT = 5
_CURSOR_VERSION = 2
_UNIX_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def now_us() -> int:
    """The current Unix time in microseconds (the clock of the ranking history)."""
    return time.time_ns() // 1000


def micros(moment: datetime) -> int:
    """A stored time as microsecond Unix time (SQLite gives naive UTC datetimes back)."""
    return (as_utc(moment) - _UNIX_EPOCH) // timedelta(microseconds=1)


def trending_after_run(previous: float | None, at: datetime) -> float:
    """Add one run at ``at`` to a trending sum kept as log2 (stable log-sum-exp)."""
    weight = (at.timestamp() - TRENDING_EPOCH_S) / TRENDING_HALF_LIFE_S
    if previous is None:
        return weight
    high, low = max(previous, weight), min(previous, weight)
    return high + math.log2(1.0 + 2.0 ** (low - high))


def trending_score(log2_sum: float | None) -> int:
    return NO_RUNS if log2_sum is None else round(log2_sum * SCALE)


def rating_score(stars_sum: int, count: int) -> int:
    """The Bayesian average of the ratings, exact in integers."""
    prior = RATING_PRIOR_WEIGHT * RATING_PRIOR_MEAN
    return (prior + stars_sum) * SCALE // (RATING_PRIOR_WEIGHT + count)


def scores_of(agent: Row[Any]) -> dict[Sort, int]:
    """The current score of an agent row in every sort."""
    published = agent.published_at
    return {
        "trending": trending_score(agent.trending_log2),
        "new": micros(published) if published is not None else 0,
        "top_earning": int(agent.earned_micro),
        "top_rated": rating_score(int(agent.rating_sum), int(agent.rating_count)),
    }


def open_entries(connection: Connection, agent_id: int, scores: dict[Sort, int],
                 at_us: int) -> None:
    """List an agent from ``at_us`` with its scores (at publication)."""
    connection.execute(insert(rank_entries), [
        {"sort": sort, "agent_id": agent_id, "score": score, "valid_from": at_us,
         "valid_to": OPEN} for sort, score in scores.items()])


def close_entries(connection: Connection, agent_id: int, at_us: int) -> None:
    """Stop listing an agent from ``at_us`` (at unpublication)."""
    connection.execute(update(rank_entries).where(rank_entries.c.agent_id == agent_id)
                       .where(rank_entries.c.valid_to == OPEN).values(valid_to=at_us))


def set_score(connection: Connection, agent_id: int, sort: Sort, score: int,
              at_us: int) -> None:
    """Record that a listed agent's score in ``sort`` became ``score`` at ``at_us``.

    A no-op for an agent that is not listed (its scores are taken when it is published)
    or whose score did not change. Call it after locking the agent's row (an UPDATE of
    it), so that changes of one agent are recorded in order.
    """
    where = and_(rank_entries.c.agent_id == agent_id, rank_entries.c.sort == sort,
                 rank_entries.c.valid_to == OPEN)
    current = connection.execute(select(rank_entries.c.score).where(where)).scalar()
    if current is None or current == score:
        return
    connection.execute(update(rank_entries).where(where).values(valid_to=at_us))
    connection.execute(insert(rank_entries).values(
        sort=sort, agent_id=agent_id, score=score, valid_from=at_us, valid_to=OPEN))


def prune(connection: Connection, before_us: int) -> int:
    """Delete history that ended before ``before_us``; returns how many rows went."""
    return connection.execute(delete(rank_entries)
                              .where(rank_entries.c.valid_to < before_us)).rowcount


@dataclass(frozen=True)
class Cursor:
    """Where a listing stands: its sort and tag, its snapshot time T and listing time L
    (see the module docstring), the last (score, id)."""

    sort: Sort
    tag: str | None
    snapshot_us: int
    listed_us: int
    score: int
    agent_id: int

    def encode(self) -> str:
        raw = json.dumps([_CURSOR_VERSION, self.sort, self.tag, self.snapshot_us,
                          self.listed_us, self.score, self.agent_id], separators=(",", ":"))
        return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


def _bad_cursor(message: str) -> InvalidRequest:
    return InvalidRequest(f"cursor {message}", details=[{"field": "cursor", "message": message}])


def decode_cursor(text: str, *, now: int, ttl_seconds: int) -> Cursor:
    """Read a cursor made by ``Cursor.encode``.

    :raises InvalidRequest: it is malformed, from the future, or older than ``ttl_seconds``
        (then the listing must start again from the first page).
    """
    try:
        raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
        version, sort, tag, snapshot, listed, score, agent_id = json.loads(raw)
    except (ValueError, TypeError, binascii.Error):
        raise _bad_cursor("is not a cursor returned by this listing") from None
    valid = (version == _CURSOR_VERSION and sort in SORTS
             and (tag is None or isinstance(tag, str))
             and all(isinstance(v, int) and not isinstance(v, bool) and abs(v) <= MAX_ID
                     for v in (snapshot, listed, score, agent_id)))  # 64-bit columns
    if not valid or snapshot > listed:
        raise _bad_cursor("is not a cursor returned by this listing")
    if listed > now:
        raise _bad_cursor("is not a cursor returned by this listing")
    if snapshot < now - ttl_seconds * 1_000_000:
        raise _bad_cursor(f"has expired (older than {ttl_seconds} s); "
                          "start again from the first page")
    return Cursor(sort, tag, snapshot, listed, score, agent_id)


@dataclass(frozen=True)
class Page:
    """One page: agent rows (with ``owner_name``) in rank order, their tags, the next cursor."""

    rows: list[Row[Any]]
    tags: dict[int, list[str]]
    next_cursor: Cursor | None


# What a listing item shows (not the owner's instructions, which may be long).
_LISTED = (agents.c.id, agents.c.slug, agents.c.owner_id, agents.c.name, agents.c.description,
           agents.c.monetization, agents.c.premium, agents.c.linked_token,
           agents.c.published_at, agents.c.runs_count, agents.c.earned_micro,
           agents.c.rating_sum, agents.c.rating_count)


@functools.cache
def _page_query(tagged: bool, after: bool) -> Select[Any]:
    """The page query, built once per shape; the values are bound parameters."""
    entry = rank_entries.c
    snapshot = bindparam("snapshot", type_=BigInteger)
    listed = bindparam("listed", type_=BigInteger)
    earlier = rank_entries.alias("earlier")
    # The first row after the snapshot of an agent that had none valid at the snapshot:
    # no row of the agent in this sort started before it and was still valid at T.
    first_after_snapshot = and_(
        entry.valid_from > snapshot, entry.valid_from <= listed,
        ~exists().where(earlier.c.agent_id == entry.agent_id, earlier.c.sort == entry.sort,
                        earlier.c.valid_from < entry.valid_from,
                        earlier.c.valid_to > snapshot))
    query = (select(*_LISTED, users.c.display_name.label("owner_name"),
                    entry.score.label("rank_score"))
             .select_from(rank_entries.join(agents, agents.c.id == entry.agent_id)
                          .join(users, users.c.id == agents.c.owner_id))
             .where(entry.sort == bindparam("sort"),
                    or_(and_(entry.valid_from <= snapshot, entry.valid_to > snapshot),
                        first_after_snapshot),
                    agents.c.status == "published"))
    if tagged:
        query = query.join(agent_tags, and_(agent_tags.c.agent_id == entry.agent_id,
                                            agent_tags.c.tag == bindparam("tag")))
    if after:
        query = query.where(tuple_(entry.score, entry.agent_id) < tuple_(
            bindparam("after_score", type_=BigInteger), bindparam("after_id", type_=BigInteger)))
    return query.order_by(entry.score.desc(), entry.agent_id.desc()).limit(bindparam("rows"))


def list_page(connection: Connection, *, sort: Sort, tag: str | None, limit: int,
              snapshot_us: int, listed_us: int, after: Cursor | None) -> Page:
    """The agents published at ``listed_us`` ranked by ``sort`` as of ``snapshot_us`` (or
    by their first score after it), after ``after``."""
    values: dict[str, Any] = {"sort": sort, "snapshot": snapshot_us, "listed": listed_us,
                              "rows": limit + 1}
    if tag is not None:
        values["tag"] = tag
    if after is not None:
        values.update(after_score=after.score, after_id=after.agent_id)
    rows = list(connection.execute(_page_query(tag is not None, after is not None), values))
    more = len(rows) > limit
    rows = rows[:limit]
    next_cursor = None
    if more:
        last = rows[-1]
        next_cursor = Cursor(sort, tag, snapshot_us, listed_us, int(last.rank_score),
                             int(last.id))
    return Page(rows, tags_of(connection, [int(row.id) for row in rows]), next_cursor)


_TAGS_OF = (select(agent_tags.c.agent_id, agent_tags.c.tag)
            .where(agent_tags.c.agent_id.in_(bindparam("ids", expanding=True)))
            .order_by(agent_tags.c.tag))


def tags_of(connection: Connection, agent_ids: Sequence[int]) -> dict[int, list[str]]:
    """The tags of each agent, sorted."""
    found: dict[int, list[str]] = {agent_id: [] for agent_id in agent_ids}
    if agent_ids:
        for agent_id, tag in connection.execute(_TAGS_OF, {"ids": list(agent_ids)}):
            found[int(agent_id)].append(tag)
    return found
