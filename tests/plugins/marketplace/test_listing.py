"""The ranked listing: keyset paging that returns every agent once while the list changes."""

from __future__ import annotations

import random
from collections import Counter
from decimal import Decimal
from fractions import Fraction
from functools import partial
from pathlib import Path

import trio
from sqlalchemy import Connection, func, select

from plugins.marketplace.publication import unpublish
from plugins.marketplace.ranking import SORTS, Cursor, now_us, prune
from plugins.marketplace.tables import agents, rank_entries
from runtime.service import Service
from tests.support.marketplace import (
    marketplace_server,
    new_users,
    published_agent,
    seed_agents,
    shake,
    signed_in,
)

# The listing needs neither keys nor projects: the marketplace runs without them.
PLUGINS = ["auth", "keys", "chain", "projects", "marketplace"]


async def test_every_sort_pages_each_agent_once_while_agents_are_added(
        tmp_path: Path, database_url: str) -> None:
    # Pages of 10 over 125 agents: the same 13 pages a sort (and churn between them) as the
    # default page of 20 over 250, for half the seeding.
    seeded, page_size = 125, 10
    rng = random.Random(7)
    async with marketplace_server(tmp_path / "var", database_url, PLUGINS) as running:
        service = running.service
        owner, *raters = await new_users(running, 3)
        await service.db.write(lambda c: seed_agents(
            service, c, owner, "seed", seeded, raters=raters, rng=rng))
        async with signed_in(running) as (http, _):
            for round_number, sort in enumerate(SORTS):
                await trio.sleep(0.2)  # past the snapshot lag (100 ms in these tests)
                # Every agent listed when this round starts (earlier rounds added some).
                ids = dict(await service.db.read(lambda c: c.execute(
                    select(agents.c.slug, agents.c.id).where(agents.c.status == "published")
                ).all()))
                initial = sorted(ids)
                assert len(initial) >= seeded
                seen: list[str] = []
                hidden: set[str] = set()
                page = (await http.get("/marketplace/agents",
                                       params={"sort": sort, "limit": page_size})).json()
                pages = 1
                while True:
                    seen += [item["slug"] for item in page["agents"]]
                    if page["nextCursor"] is None:
                        break

                    gone = await service.db.write(partial(
                        _churn, service=service, owner=owner, raters=raters, rng=rng,
                        prefix=f"new{round_number}-{pages}", ids=ids,
                        unseen=sorted(set(initial) - set(seen) - hidden),
                        unpublish_one=pages % 4 == 0))
                    if gone is not None:
                        hidden.add(gone)
                    page = (await http.get("/marketplace/agents", params={
                        "cursor": page["nextCursor"], "limit": page_size})).json()
                    pages += 1
                counts = Counter(seen)
                assert max(counts.values()) == 1, f"{sort}: duplicates {counts.most_common(3)}"
                assert set(seen) == set(initial) - hidden, sort
                assert hidden and pages == -(-(len(initial) - len(hidden)) // page_size)


def _churn(connection: Connection, *, service: Service, owner: int, raters: list[int],
           rng: random.Random, prefix: str, ids: dict[str, int], unseen: list[str],
           unpublish_one: bool) -> str | None:
    """Between two pages: new agents with scores that would rank them anywhere, existing
    agents whose scores jump, and now and then an agent not yet seen is unpublished."""
    seed_agents(service, connection, owner, prefix, 2, raters=raters, rng=rng)
    for slug in rng.sample(sorted(ids), 4):
        shake(connection, ids[slug], owner, raters, rng)
    if unpublish_one and unseen:
        unpublish(connection, unseen[-1], owner)
        return unseen[-1]
    return None


async def test_a_published_agent_is_listed_by_the_very_next_request(
        tmp_path: Path, database_url: str) -> None:
    """Read-after-write under a long snapshot lag (60 s): everything here happens inside
    the lag, so each agent is ranked by its first score after the snapshot, and paging
    stays exactly-once while agents are added and scores move."""
    rng = random.Random(5)
    lag = {"FLOWSVC_PLUGINS_MARKETPLACE_SNAPSHOT_LAG_MS": "60000"}
    async with marketplace_server(tmp_path / "var", database_url, PLUGINS, lag) as running:
        service = running.service
        owner, *raters = await new_users(running, 3)
        seeded = await service.db.write(lambda c: seed_agents(
            service, c, owner, "seed", 30, raters=raters, rng=rng))
        async with signed_in(running) as (http, _):
            slug = await published_agent(http)
            newest = (await http.get("/marketplace/agents", params={"sort": "new"})).json()
            assert newest["agents"][0]["slug"] == slug
            ids = dict(await service.db.read(lambda c: c.execute(
                select(agents.c.slug, agents.c.id)).all()))
            seen: list[str] = []
            page = (await http.get("/marketplace/agents", params={"limit": 7})).json()
            while True:
                seen += [item["slug"] for item in page["agents"]]
                if page["nextCursor"] is None:
                    break
                await service.db.write(partial(
                    _churn, service=service, owner=owner, raters=raters, rng=rng,
                    prefix=f"late{len(seen)}", ids=ids, unseen=[], unpublish_one=False))
                page = (await http.get("/marketplace/agents", params={
                    "cursor": page["nextCursor"], "limit": 7})).json()
            assert sorted(seen) == sorted([*seeded, slug])  # once each, none added later
            assert (await http.post(f"/agents/{slug}/unpublish")).status_code == 200
            after = (await http.get("/marketplace/agents", params={"limit": 100})).json()
            assert slug not in {item["slug"] for item in after["agents"]}
            assert len(after["agents"]) == 30 + 4 * 2  # seeded, and 2 late ones per new page


async def test_sorts_follow_the_documented_scores_and_tags_filter(
        tmp_path: Path, database_url: str) -> None:
    rng = random.Random(11)
    async with marketplace_server(tmp_path / "var", database_url, PLUGINS) as running:
        service = running.service
        owner, *raters = await new_users(running, 3)
        plain = await service.db.write(lambda c: seed_agents(
            service, c, owner, "plain", 30, raters=raters, rng=rng))
        tagged = await service.db.write(lambda c: seed_agents(
            service, c, owner, "bots", 25, raters=raters, rng=rng, tags=("bots", "chat")))
        await trio.sleep(0.2)
        async with signed_in(running) as (http, _):
            listing = (await http.get("/marketplace/agents",
                                      params={"sort": "top_earning", "limit": 100})).json()
            earned = [Decimal(item["stats"]["earnedFlow"]) for item in listing["agents"]]
            assert earned == sorted(earned, reverse=True) and len(earned) == 55
            newest = (await http.get("/marketplace/agents",
                                     params={"sort": "new", "limit": 100})).json()["agents"]
            assert [item["slug"] for item in newest] == list(reversed(plain + tagged))
            rated = (await http.get("/marketplace/agents",
                                    params={"sort": "top_rated", "limit": 100})).json()["agents"]
            # The average is shown rounded; with a few ratings each, the sum is exact again.
            sums = [round((item["stats"]["ratingAverage"] or 0) * item["stats"]["ratingCount"])
                    for item in rated]
            bayes = [Fraction(5 * 3 + stars, 5 + item["stats"]["ratingCount"])
                     for stars, item in zip(sums, rated, strict=True)]
            assert bayes == sorted(bayes, reverse=True) and len(set(bayes)) > 3

            slugs: list[str] = []
            params: dict[str, str] = {"tag": "bots", "limit": "10", "sort": "top_rated"}
            while True:
                page = (await http.get("/marketplace/agents", params=params)).json()
                slugs += [item["slug"] for item in page["agents"]]
                assert all("bots" in item["tags"] for item in page["agents"])
                if page["nextCursor"] is None:
                    break
                params = {"cursor": page["nextCursor"]}
            assert sorted(slugs) == sorted(tagged)
            # History no cursor can need any more is pruned; current scores stay.
            entries = await service.db.read(lambda c: c.execute(
                select(func.count()).select_from(rank_entries)).scalar_one())
            pruned = await service.db.write(prune, now_us())
            assert pruned == entries - 4 * 55 > 0
            again = (await http.get("/marketplace/agents",
                                    params={"sort": "top_earning", "limit": 100})).json()
            assert [item["slug"] for item in again["agents"]] == \
                [item["slug"] for item in listing["agents"]]
            default = (await http.get("/marketplace/agents")).json()
            assert len(default["agents"]) == 20  # default page size
            clamped = (await http.get("/marketplace/agents", params={"limit": 1000})).json()
            assert len(clamped["agents"]) == 55 and clamped["nextCursor"] is None


async def test_bad_listing_parameters_are_clear_400s(tmp_path: Path, database_url: str) -> None:
    async with marketplace_server(tmp_path / "var", database_url, PLUGINS) as running:
        async with signed_in(running) as (http, _):
            unknown = await http.get("/marketplace/agents", params={"sort": "popular"})
            assert unknown.status_code == 400
            assert unknown.json()["error"]["code"] == "invalid_request"
            assert unknown.json()["error"]["details"][0]["field"] == "sort"
            future = now_us() + 10**9
            recent = now_us() - 10**6
            for cursor in ("garbage!", "bm90IGpzb24",
                           Cursor("new", None, future, future, 1, 1).encode(),
                           Cursor("new", None, now_us(), now_us() - 10**6, 1, 1).encode(),
                           # Beyond the 64-bit columns (an overflow in SQLite was a 500).
                           Cursor("new", None, recent, recent, 1, 2**63).encode(),
                           Cursor("new", None, recent, recent, -10**30, 1).encode()):
                bad = await http.get("/marketplace/agents", params={"cursor": cursor})
                assert bad.status_code == 400, cursor
                assert bad.json()["error"]["details"][0]["field"] == "cursor"
            hour_ago = now_us() - 3600 * 10**6
            old = Cursor("new", None, hour_ago, hour_ago, 1, 1).encode()
            expired = await http.get("/marketplace/agents", params={"cursor": old})
            assert expired.status_code == 400 and "expired" in expired.json()["error"]["message"]
            fresh = Cursor("new", None, now_us() - 10**6, now_us(), 1, 1).encode()
            other = await http.get("/marketplace/agents", params={"cursor": fresh,
                                                                   "sort": "trending"})
            assert other.status_code == 400
            assert (await http.get("/marketplace/agents", params={"limit": 0})).status_code == 400
