"""Projects API: validation, ownership, locks, privacy and every error code of the group."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx

from runtime.server import Running
from tests.support.auth import BOT_TOKEN, init_data
from tests.support.projects import (
    BRIEF,
    GrantedFeatures,
    new_project,
    serve_projects,
    token_owner,
)
from tests.support.server import client
from tests.support.sse import open_sse
from tests.support.tokens import add_token
from tests.support.wallet import sign_in


def error_of(response: httpx.Response) -> tuple[int, str]:
    return response.status_code, response.json()["error"]["code"]


async def grant_private_projects(running: Running, http: httpx.AsyncClient) -> None:
    """Give the signed-in user of ``http`` the ``privateProjects`` feature (billing's part:
    tests/plugins/projects/test_feature_gates.py has it with real subscriptions)."""
    user_id = int((await http.get("/me")).json()["user"]["id"])
    running.service.pm.register(GrantedFeatures({user_id: {"privateProjects": True}}))


async def test_creation_validates_every_field(tmp_path: Path, database_url: str) -> None:
    async with serve_projects(tmp_path / "var", database_url) as running, \
            token_owner(running, "shop") as http:
        good: dict[str, Any] = {"tokenSlug": "shop", "title": "Shop", "brief": BRIEF,
                                "agentTemplate": "bot-builder"}
        for change, field in [
            ({"brief": "First paragraph.\n\nSecond paragraph."}, "brief"),
            ({"brief": "   "}, "brief"),
            ({"title": ""}, "title"),
            ({"title": "x" * 121}, "title"),
            ({"private": "yes"}, "private"),
            ({"tokenSlug": "Not A Slug"}, "tokenSlug"),
            ({"colour": "red"}, "colour"),
        ]:
            answer = await http.post("/projects", json={**good, **change})
            assert error_of(answer) == (400, "invalid_request"), change
            assert field in {detail["field"] for detail in answer.json()["error"]["details"]}
        missing = await http.post("/projects", json={"tokenSlug": "shop"})
        assert error_of(missing) == (400, "invalid_request")

        unknown = await http.post("/projects", json={**good, "agentTemplate": "web3-wizard"})
        assert error_of(unknown) == (400, "template_unknown")
        assert "fullstack-builder" in unknown.json()["error"]["message"]
        no_token = await http.post("/projects", json={**good, "tokenSlug": "nope"})
        assert error_of(no_token) == (404, "not_found")

        refused = await http.post("/projects", json={**good, "private": True})
        assert error_of(refused) == (403, "private_projects_required")
        await grant_private_projects(running, http)
        created = await new_project(http, "shop", title="  Shop  ", private=True,
                                    brief="One line\nand a soft break in one paragraph.")
        assert created["slug"] == "shop" and created["status"] == "idle"
        view = (await http.get("/projects/shop")).json()
        assert view["title"] == "Shop" and view["private"] is True
        assert view["agentTemplate"] == "fullstack-builder" and view["lastRun"] is None
        async with client(running) as anonymous:
            assert error_of(await anonymous.post("/projects", json=good)) == \
                (401, "unauthenticated")


async def test_token_ownership_and_one_active_project_per_token(
        tmp_path: Path, database_url: str) -> None:
    async with serve_projects(tmp_path / "var", database_url) as running, \
            token_owner(running, "acme") as owner, client(running) as stranger:
        await sign_in(stranger)
        body = {"tokenSlug": "acme", "title": "Acme", "brief": BRIEF,
                "agentTemplate": "research-agent"}
        assert error_of(await stranger.post("/projects", json=body)) == (403, "token_no_match")

        first = await new_project(owner, "acme", title="Acme")
        locked = await owner.post("/projects", json=body)
        assert error_of(locked) == (409, "project_locked")
        assert first["slug"] in locked.json()["error"]["message"]

        assert error_of(await stranger.post(f"/projects/{first['slug']}/start")) == \
            (403, "forbidden")
        assert error_of(await stranger.post(f"/projects/{first['slug']}/cancel")) == \
            (403, "forbidden")
        cancelled = await owner.post(f"/projects/{first['slug']}/cancel")
        assert cancelled.status_code == 200 and cancelled.json()["status"] == "cancelled"
        assert error_of(await owner.post(f"/projects/{first['slug']}/cancel")) == \
            (409, "conflict")

        second = await new_project(owner, "acme", title="Acme")
        assert second["slug"] == "acme-2"
        # The cancelled project cannot come back while the second one is active.
        assert error_of(await owner.post(f"/projects/{first['slug']}/start")) == \
            (409, "project_locked")
        assert error_of(await owner.get("/projects/missing")) == (404, "not_found")


async def test_private_projects_are_for_their_owner_only(tmp_path: Path) -> None:
    async with serve_projects(tmp_path / "var", f"sqlite:///{tmp_path / 'db.sqlite'}") \
            as running, token_owner(running, "vault") as owner, client(running) as stranger:
        await sign_in(stranger)
        await grant_private_projects(running, owner)
        slug = (await new_project(owner, "vault", private=True))["slug"]
        assert (await owner.post(f"/projects/{slug}/start")).status_code == 201
        async with client(running) as anonymous:
            for http in (anonymous, stranger):
                for path in (f"/projects/{slug}", f"/projects/{slug}/artifact",
                             f"/projects/{slug}/files/index.html"):
                    assert error_of(await http.get(path)) == (403, "private_forbidden"), path
                assert error_of(await http.post(f"/projects/{slug}/subscribe")) in (
                    (401, "unauthenticated"), (403, "private_forbidden"))
            assert error_of(await stranger.post(f"/projects/{slug}/start")) == \
                (403, "private_forbidden")
        async with open_sse(running.base_url, f"/projects/{slug}/stream") as denied:
            assert denied.status == 403
            assert b'"private_forbidden"' in await denied.body()
        cookie = {"Cookie": f"svc_session={owner.cookies['svc_session']}"}
        async with open_sse(running.base_url, f"/projects/{slug}/stream", cookie) as stream:
            assert stream.status == 200
            events = await stream.until("done")
        assert events[-1].json()["finalStatus"] == "completed"
        assert (await owner.get(f"/projects/{slug}")).json()["status"] == "completed"


async def test_starting_twice_conflicts_and_subscribing_needs_a_messenger(
        tmp_path: Path) -> None:
    async with serve_projects(tmp_path / "var", f"sqlite:///{tmp_path / 'db.sqlite'}",
                              run_slots="1") as running, token_owner(running, "busy") as http:
        slug = (await new_project(http, "busy"))["slug"]
        async with open_sse(running.base_url, f"/projects/{slug}/stream") as stream:
            key = {"Idempotency-Key": "start-once"}
            started = await http.post(f"/projects/{slug}/start", headers=key)
            assert started.status_code == 201
            replayed = await http.post(f"/projects/{slug}/start", headers=key)
            assert replayed.json() == started.json()
            assert replayed.headers["idempotent-replayed"] == "true"
            again = await http.post(f"/projects/{slug}/start")
            assert error_of(again) == (409, "conflict")
            await stream.until("done")
        subscribed = await http.post(f"/projects/{slug}/subscribe")
        assert error_of(subscribed) == (409, "messenger_not_linked")
        assert "messaging" in subscribed.json()["error"]["message"]
        unsubscribed = await http.delete(f"/projects/{slug}/subscribe")
        assert unsubscribed.json() == {"subscribed": False}


async def test_a_caller_without_an_address_is_told_why_the_token_is_not_theirs(
        tmp_path: Path) -> None:
    extra = {"FLOWSVC_PLUGINS_AUTH_BOT_TOKEN": BOT_TOKEN}
    async with serve_projects(tmp_path / "var", f"sqlite:///{tmp_path / 'db.sqlite'}",
                              extra_env=extra) as running, token_owner(running, "moon"), \
            client(running) as http:
        signed_in = await http.post("/auth/messenger", json={
            "initData": init_data({"id": 4242, "first_name": "Ada"})})
        assert signed_in.status_code == 200 and signed_in.json()["user"]["address"] is None
        answer = await http.post("/projects", json={
            "tokenSlug": "moon", "title": "Moon", "brief": BRIEF,
            "agentTemplate": "bot-builder"})
        assert error_of(answer) == (403, "token_no_match")
        assert "your account has none" in answer.json()["error"]["message"]


async def test_the_routes_are_documented_in_openapi(running_tokens: Running) -> None:
    async with client(running_tokens) as http:
        spec = (await http.get("/openapi.json")).json()
    create = spec["paths"]["/projects"]["post"]
    body = create["requestBody"]["content"]["application/json"]["schema"]
    assert body["additionalProperties"] is False
    assert set(body["required"]) == {"tokenSlug", "title", "brief", "agentTemplate"}
    assert "201" in create["responses"]
    assert "put" in spec["paths"]["/internal/tokens/{slug}"]
    assert "post" in spec["paths"]["/projects/{slug}/start"]


async def test_my_projects_lists_the_callers_own_newest_first_a_page_at_a_time(
        tmp_path: Path, database_url: str) -> None:
    async with serve_projects(tmp_path / "var", database_url) as running, \
            client(running) as owner, token_owner(running, "other") as stranger:
        wallet, _ = await sign_in(owner)
        for slug in ("alpha", "beta", "gamma"):
            registered = await add_token(running.base_url, slug, wallet.address.lower())
            assert registered.status_code == 201, registered.text
        await grant_private_projects(running, owner)
        made = [(await new_project(owner, "alpha", title="Alpha"))["slug"],
                (await new_project(owner, "beta", title="Beta", private=True))["slug"],
                (await new_project(owner, "gamma", title="Gamma"))["slug"]]
        await new_project(stranger, "other", title="Not yours")
        first = await owner.get("/me/projects", params={"limit": 2})
        second = await owner.get("/me/projects", params={"limit": 2,
                                                         "cursor": first.json()["nextCursor"]})
        everything = (await owner.get("/me/projects", params={"limit": 500})).json()
        refused = [await owner.get("/me/projects", params=params)
                   for params in ({"cursor": "abc"}, {"limit": 0}, {"limit": "x"})]
        theirs = (await stranger.get("/me/projects")).json()
        async with client(running) as anonymous:
            anonymous_answer = await anonymous.get("/me/projects")

    assert first.status_code == 200, first.text
    listed = first.json()["projects"] + second.json()["projects"]
    assert [item["slug"] for item in listed] == made[::-1]
    assert second.json()["nextCursor"] is None
    assert [item["slug"] for item in everything["projects"]] == made[::-1]
    beta = listed[1]
    assert beta["private"] is True and beta["title"] == "Beta"
    assert beta["tokenSlug"] == "beta" and beta["status"] == "idle"
    assert set(beta) == {"id", "slug", "tokenSlug", "status", "createdAt", "title",
                         "agentTemplate", "private", "updatedAt"}
    assert [error_of(answer) for answer in refused] == [(400, "invalid_request")] * 3
    assert [item["title"] for item in theirs["projects"]] == ["Not yours"]
    assert error_of(anonymous_answer) == (401, "unauthenticated")
