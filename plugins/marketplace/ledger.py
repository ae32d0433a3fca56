"""What agents earn, how often they run and how they are rated: the facts rankings use.

Each function runs inside the caller's transaction and first updates the agent's row
(which takes its row lock on PostgreSQL), then records the new score in the ranking
history at a time taken after that lock, so one agent's history is written in order.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Literal

from sqlalchemy import Connection, func, insert, select, update

from plugins.marketplace.ranking import (
    micros,
    rating_score,
    set_score,
    trending_after_run,
    trending_score,
)
from plugins.marketplace.tables import agents, earnings, ratings, runs
from runtime.errors import Forbidden
from runtime.wire import utcnow

EarningKind = Literal["tool_call", "subscription"]


def register_run(connection: Connection, *, run_id: str, stream: str, agent_id: int,
                 user_id: int, key_id: int | None, prices: dict[str, int],
                 counted: bool = True) -> datetime:
    """Record a run of an agent by ``user_id`` starting now, on event stream ``stream``,
    with the prices it will pay (micro-FLOW per call by tool, fixed for the run). A
    ``counted`` run counts in ``runs`` and ``trending`` (the owner's own runs do not).

    :return: when the run started.
    """
    started = record_run_start(connection, agent_id) if counted else utcnow()
    connection.execute(insert(runs).values(
        run_id=run_id, stream=stream, agent_id=agent_id, user_id=user_id, key_id=key_id,
        prices=prices, tool_calls=0, charged_micro=0, started_at=started))
    return started


def record_run_start(connection: Connection, agent_id: int) -> datetime:
    """Count a run of the agent starting now (``runs_count`` and the trending score)."""
    connection.execute(update(agents).where(agents.c.id == agent_id)
                       .values(runs_count=agents.c.runs_count + 1))
    now = utcnow()
    previous = connection.execute(select(agents.c.trending_log2)
                                  .where(agents.c.id == agent_id)).scalar()
    trending = trending_after_run(previous, now)
    connection.execute(update(agents).where(agents.c.id == agent_id)
                       .values(trending_log2=trending))
    set_score(connection, agent_id, "trending", trending_score(trending), micros(now))
    return now


@dataclass(frozen=True)
class Earning:
    """One credit to an agent's owner: who paid, with which key, for what."""

    agent_id: int
    owner_id: int
    payer_id: int
    key_id: int | None
    kind: EarningKind
    amount_micro: int
    tool: str | None = None
    run_id: str | None = None
    subscription_id: int | None = None


def credit(connection: Connection, earning: Earning) -> None:
    """Record an earning for the owner and raise the agent's ``top_earning`` score."""
    connection.execute(update(agents).where(agents.c.id == earning.agent_id)
                       .values(earned_micro=agents.c.earned_micro + earning.amount_micro))
    now = utcnow()
    connection.execute(insert(earnings).values(
        agent_id=earning.agent_id, owner_id=earning.owner_id, payer_id=earning.payer_id,
        key_id=earning.key_id, kind=earning.kind, tool=earning.tool, run_id=earning.run_id,
        subscription_id=earning.subscription_id, amount_micro=earning.amount_micro,
        created_at=now))
    earned = connection.execute(select(agents.c.earned_micro)
                                .where(agents.c.id == earning.agent_id)).scalar_one()
    set_score(connection, earning.agent_id, "top_earning", int(earned), micros(now))


def owner_earnings(connection: Connection, owner_id: int) -> tuple[int, list[tuple[str, int]]]:
    """The owner's total earnings and each agent's share, largest first (micro-FLOW)."""
    rows = connection.execute(
        select(agents.c.slug, func.coalesce(func.sum(earnings.c.amount_micro), 0))
        .select_from(earnings.join(agents, agents.c.id == earnings.c.agent_id))
        .where(earnings.c.owner_id == owner_id).group_by(agents.c.slug)).all()
    by_agent = sorted(((slug, int(amount)) for slug, amount in rows),
                      key=lambda item: (-item[1], item[0]))
    return sum(amount for _, amount in by_agent), by_agent


def rate(connection: Connection, agent_id: int, owner_id: int, user_id: int,
         stars: int) -> tuple[int, int]:
    """Set ``user_id``'s rating of the agent (one per user; a new one replaces the old).

    :return: the agent's new sum of stars and count of ratings.
    :raises Forbidden: the user owns the agent, or never ran it.
    """
    if user_id == owner_id:
        raise Forbidden("owners cannot rate their own agents")
    # Lock the agent first: two ratings by one user at once must not both see "no rating".
    connection.execute(select(agents.c.id).where(agents.c.id == agent_id).with_for_update())
    ran = connection.execute(select(runs.c.id).where(runs.c.agent_id == agent_id)
                             .where(runs.c.user_id == user_id).limit(1)).first()
    if ran is None:
        raise Forbidden("only users who ran this agent can rate it")
    old = connection.execute(select(ratings.c.stars).where(ratings.c.agent_id == agent_id)
                             .where(ratings.c.user_id == user_id)).scalar()
    connection.execute(update(agents).where(agents.c.id == agent_id).values(
        rating_sum=agents.c.rating_sum + stars - (old or 0),
        rating_count=agents.c.rating_count + (0 if old is not None else 1)))
    now = utcnow()
    if old is None:
        connection.execute(insert(ratings).values(agent_id=agent_id, user_id=user_id,
                                                  stars=stars, created_at=now, updated_at=now))
    else:
        connection.execute(update(ratings).where(ratings.c.agent_id == agent_id)
                           .where(ratings.c.user_id == user_id)
                           .values(stars=stars, updated_at=now))
    row = connection.execute(select(agents.c.rating_sum, agents.c.rating_count)
                             .where(agents.c.id == agent_id)).one()
    set_score(connection, agent_id, "top_rated",
              rating_score(int(row.rating_sum), int(row.rating_count)), micros(now))
    return int(row.rating_sum), int(row.rating_count)
