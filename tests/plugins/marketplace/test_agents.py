"""Agents over real HTTP: creation, monetization, publication, tool prices, the detail view."""

from __future__ import annotations

from pathlib import Path

from plugins.marketplace.publication import AGENT_PUBLISHED
from tests.support.marketplace import (
    marketplace_server,
    new_agent,
    signed_in,
)
from tests.support.projects import (
    BRIEF,
    EventRecorder,
    eventually,
    new_project,
    token_owner,
)
from tests.support.server import client


def code(response: object) -> str:
    return str(response.json()["error"]["code"])  # type: ignore[attr-defined]


async def test_creation_and_monetization_models(tmp_path: Path, database_url: str) -> None:
    async with marketplace_server(tmp_path / "var", database_url) as running, \
            signed_in(running) as (http, user_id), client(running) as anonymous:
        response = await anonymous.post("/agents", json={
            "name": "x", "description": "y", "agentTemplate": "fullstack-builder"})
        assert response.status_code == 401 and code(response) == "unauthenticated"
        agent = await new_agent(http, tags=["Pizza", "sites"], instructions="Use red.")
        assert agent["slug"] == "pizza-site-builder" and agent["status"] == "draft"
        assert agent["tags"] == ["pizza", "sites"] and agent["monetization"] == {"model": "free"}
        assert agent["owner"]["id"] == str(user_id) and agent["publishedAt"] is None
        assert agent["instructions"] == "Use red." and "linkedToken" not in agent
        again = await new_agent(http)
        assert again["slug"].startswith("pizza-site-builder-")
        taken = await http.post("/agents", json={
            "name": "x", "description": "y", "agentTemplate": "fullstack-builder",
            "slug": "pizza-site-builder"})
        assert taken.status_code == 409 and code(taken) == "conflict"

        per_call = await new_agent(http, monetization={"model": "per_call",
                                                       "defaultPerCallFlow": "0.25"})
        assert per_call["monetization"] == {"model": "per_call",
                                            "defaultPerCallFlow": "0.250000"}
        monthly = await new_agent(http, monetization={"model": "subscription",
                                                      "priceFlow": 12, "periodDays": 30})
        assert monthly["monetization"] == {"model": "subscription", "priceFlow": "12.000000",
                                           "periodDays": 30}
        for bad in ({"model": "auction"}, "free", {"model": "subscription", "priceFlow": "5"},
                    {"model": "subscription", "periodDays": 30},
                    {"model": "subscription", "priceFlow": "0", "periodDays": 30},
                    {"model": "subscription", "priceFlow": "5", "periodDays": 0},
                    {"model": "per_call", "defaultPerCallFlow": "0.0000001"},
                    {"model": "free", "priceFlow": "1"}):
            refused = await http.post("/agents", json={
                "name": "x", "description": "y", "agentTemplate": "fullstack-builder",
                "monetization": bad})
            assert refused.status_code == 400, bad
            assert code(refused) == "invalid_monetization", bad
            assert refused.json()["error"]["details"][0]["field"].startswith("monetization")
        unknown = await http.post("/agents", json={"name": "x", "description": "y",
                                                   "agentTemplate": "haiku-writer"})
        assert unknown.status_code == 400 and code(unknown) == "template_unknown"
        bad_tag = await http.post("/agents", json={"name": "x", "description": "y",
                                                   "agentTemplate": "fullstack-builder",
                                                   "tags": ["no spaces"]})
        assert bad_tag.status_code == 400 and code(bad_tag) == "invalid_request"


async def test_publication_events_and_visibility(tmp_path: Path, database_url: str) -> None:
    async with marketplace_server(tmp_path / "var", database_url) as running, \
            signed_in(running) as (owner, owner_id), signed_in(running) as (other, _), \
            client(running) as anonymous:
        recorder = EventRecorder()
        running.service.pm.register(recorder, name="recorder")
        slug = (await new_agent(owner, tags=["pizza"]))["slug"]
        draft = await anonymous.get(f"/marketplace/agents/{slug}")
        assert draft.status_code == 404 and code(draft) == "agent_not_found"
        assert (await owner.get(f"/marketplace/agents/{slug}")).json()["agent"]["status"] \
            == "draft"

        stolen = await other.post(f"/agents/{slug}/publish")
        assert stolen.status_code == 403 and code(stolen) == "not_owner"
        missing = await owner.post("/agents/no-such-agent/publish")
        assert missing.status_code == 404 and code(missing) == "agent_not_found"
        assert not recorder.events

        published = await owner.post(f"/agents/{slug}/publish", json={
            "description": "Pizza sites, fast.", "tags": ["pizza", "food"], "premium": True,
            "monetization": {"model": "per_call", "defaultPerCallFlow": "0.1"}})
        assert published.status_code == 200, published.text
        agent = published.json()["agent"]
        assert agent["status"] == "published" and agent["premium"] is True
        assert agent["publishedAt"].endswith("Z") and agent["tags"] == ["food", "pizza"]
        [event] = recorder.events
        assert event.name == AGENT_PUBLISHED.name == "agent.published"
        assert event.user_id == owner_id and event.data["slug"] == slug
        meta = event.data["marketplace_meta"]
        assert meta["first_publication"] is True and meta["premium"] is True
        assert meta["monetization"] == {"model": "per_call", "defaultPerCallFlow": "0.100000"}
        assert meta["tags"] == ["food", "pizza"] and meta["url"].endswith(
            f"/marketplace/agents/{slug}")
        bad = await owner.post(f"/agents/{slug}/publish", json={"monetization": {"model": "x"}})
        assert bad.status_code == 400 and code(bad) == "invalid_monetization"
        assert len(recorder.events) == 1  # a refused publish emits nothing

        public = (await anonymous.get(f"/marketplace/agents/{slug}")).json()["agent"]
        assert public["description"] == "Pizza sites, fast." and public["toolPrices"] == []
        assert "instructions" not in public and "linkedToken" not in public
        listed = (await anonymous.get("/marketplace/agents", params={"sort": "new"})).json()
        assert [item["slug"] for item in listed["agents"]] == [slug]

        renamed = await owner.post(f"/agents/{slug}/publish", json={"name": "Pizza Pro"})
        assert renamed.json()["agent"]["publishedAt"] == agent["publishedAt"]
        assert recorder.events[-1].data["marketplace_meta"]["first_publication"] is False

        refused = await other.post(f"/agents/{slug}/unpublish")
        assert refused.status_code == 403 and code(refused) == "not_owner"
        hidden = await owner.post(f"/agents/{slug}/unpublish")
        assert hidden.status_code == 200 and hidden.json()["agent"]["status"] == "unpublished"
        assert (await anonymous.get(f"/marketplace/agents/{slug}")).status_code == 404
        assert (await other.get(f"/marketplace/agents/{slug}")).status_code == 404
        assert (await owner.get(f"/marketplace/agents/{slug}")).status_code == 200
        assert (await anonymous.get("/marketplace/agents")).json()["agents"] == []
        again = await owner.post(f"/agents/{slug}/unpublish")
        assert again.status_code == 200  # unpublishing twice changes nothing
        back = (await owner.post(f"/agents/{slug}/publish")).json()["agent"]
        assert back["publishedAt"] > agent["publishedAt"]  # a new listing, at the top of "new"
        missing = await owner.post("/agents/no-such-agent/unpublish")
        assert missing.status_code == 404 and code(missing) == "agent_not_found"


async def test_tool_prices(tmp_path: Path, database_url: str) -> None:
    async with marketplace_server(tmp_path / "var", database_url) as running, \
            signed_in(running) as (owner, _), signed_in(running) as (other, _):
        allowed = set(running.service.tools)
        assert {"write_file", "git_commit", "take_screenshot"} <= allowed
        slug = (await new_agent(owner))["slug"]
        priced = await owner.post(f"/agents/{slug}/tool-prices", json=[
            {"tool": "write_file", "perCallFlow": "0.5"},
            {"tool": "git_commit", "perCallFlow": 1.25},
            {"tool": "read_file", "perCallFlow": 0}])
        assert priced.status_code == 200, priced.text
        assert priced.json() == {"toolPrices": [
            {"tool": "git_commit", "perCallFlow": "1.250000"},
            {"tool": "read_file", "perCallFlow": "0.000000"},
            {"tool": "write_file", "perCallFlow": "0.500000"}]}
        detail = (await owner.get(f"/marketplace/agents/{slug}")).json()["agent"]
        assert detail["toolPrices"] == priced.json()["toolPrices"]

        unknown = await owner.post(f"/agents/{slug}/tool-prices", json=[
            {"tool": "write_file", "perCallFlow": "1"}, {"tool": "launch_rocket",
                                                         "perCallFlow": "1"}])
        assert unknown.status_code == 400 and code(unknown) == "tool_unknown"
        assert "launch_rocket" in unknown.json()["error"]["message"]
        for bad in ([{"tool": "write_file", "perCallFlow": "-1"}],
                    [{"tool": "write_file", "perCallFlow": "0.0000001"}],
                    [{"tool": "write_file", "perCallFlow": True}],
                    [{"tool": "write_file", "perCallFlow": "1"},
                     {"tool": "write_file", "perCallFlow": "2"}],
                    {"tool": "write_file", "perCallFlow": "1"}):
            refused = await owner.post(f"/agents/{slug}/tool-prices", json=bad)
            assert refused.status_code == 400 and code(refused) == "invalid_request", bad
        stolen = await other.post(f"/agents/{slug}/tool-prices", json=[])
        assert stolen.status_code == 403 and code(stolen) == "not_owner"
        missing = await owner.post("/agents/nothing-here/tool-prices", json=[])
        assert missing.status_code == 404 and code(missing) == "agent_not_found"
        unchanged = (await owner.get(f"/marketplace/agents/{slug}")).json()["agent"]
        assert unchanged["toolPrices"] == priced.json()["toolPrices"]
        cleared = await owner.post(f"/agents/{slug}/tool-prices", json=[])
        assert cleared.json() == {"toolPrices": []}


async def test_agent_from_a_completed_project_is_linked_to_its_token(
        tmp_path: Path, database_url: str) -> None:
    async with marketplace_server(tmp_path / "var", database_url) as running, \
            token_owner(running, "luigi") as http, signed_in(running) as (stranger, _):
        project = await new_project(http, "luigi")
        early = await http.post("/agents/from-project", json={"projectSlug": project["slug"]})
        assert early.status_code == 409 and code(early) == "conflict"
        assert (await http.post(f"/projects/{project['slug']}/start")).status_code == 201

        async def completed() -> bool:
            view = (await http.get(f"/projects/{project['slug']}")).json()
            return bool(view["status"] == "completed")

        await eventually(completed, timeout=30)
        theirs = await stranger.post("/agents/from-project",
                                     json={"projectSlug": project["slug"]})
        assert theirs.status_code == 403 and code(theirs) == "forbidden"
        nothing = await http.post("/agents/from-project", json={"projectSlug": "nope"})
        assert nothing.status_code == 404 and code(nothing) == "not_found"
        made = await http.post("/agents/from-project", json={
            "projectSlug": project["slug"], "tags": ["pizza"],
            "monetization": {"model": "per_call"}})
        assert made.status_code == 201, made.text
        agent = made.json()["agent"]
        assert agent["linkedToken"] == {"slug": "luigi"}
        assert agent["sourceProject"] == project["slug"] and agent["name"] == "Luigi's Pizza"
        assert agent["description"] == BRIEF and agent["agentTemplate"] == "fullstack-builder"
        await http.post(f"/agents/{agent['slug']}/publish")
        async with client(running) as anonymous:
            public = (await anonymous.get(f"/marketplace/agents/{agent['slug']}")).json()
        assert public["agent"]["linkedToken"] == {"slug": "luigi"}


async def test_a_flag_takes_a_json_boolean_only(tmp_path: Path, database_url: str) -> None:
    """``premium: 0`` or ``"yes"`` is refused like ``private: 0`` on projects: one
    strictness for every body (no coercion of numbers or strings to booleans)."""
    async with marketplace_server(tmp_path / "var", database_url) as running, \
            signed_in(running) as (http, _):
        slug = (await new_agent(http))["slug"]
        for value in (0, 1, "yes", "true", "", [], {}):
            refused = await http.post(f"/agents/{slug}/publish", json={"premium": value})
            assert refused.status_code == 400 and code(refused) == "invalid_request", value
            assert refused.json()["error"]["details"][0]["field"] == "premium"
            created = await http.post("/agents", json={
                "name": "x", "description": "y", "agentTemplate": "fullstack-builder",
                "premium": value})
            assert created.status_code == 400 and code(created) == "invalid_request", value
        detail = await http.get(f"/marketplace/agents/{slug}")
        assert detail.json()["agent"]["status"] == "draft"
        published = await http.post(f"/agents/{slug}/publish", json={"premium": False})
        assert published.status_code == 200, published.text
