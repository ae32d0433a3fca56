"""The projects plugin's feature gates through HTTP with real subscriptions (billing on its
fake providers): ``fasterSse`` paces a caller's streams, ``privateProjects`` gates making a
project private and never reading one."""

from __future__ import annotations

from pathlib import Path

import httpx
import trio

from tests.support.billing import DAY, Stack, billing_stack, until_subscription
from tests.support.projects import new_project, token_owner
from tests.support.server import client
from tests.support.sse import open_sse
from tests.support.wallet import sign_in

PLUGINS = ["auth", "chain", "projects", "billing"]
FAST_HEARTBEAT = 0.1
# Heartbeats of everyone else would take 60 s: a keepalive within a second is fasterSse.
# A stream without one is heard for SILENCE (ten fast heartbeats); a stream that should have
# one gets up to FAST_DEADLINE (wide: a loaded machine) and ends as soon as it comes.
SILENCE = 10 * FAST_HEARTBEAT
FAST_DEADLINE = 5.0
PACING = {"FLOWSVC_PLUGINS_PROJECTS_HEARTBEAT_SECONDS": "60",
          "FLOWSVC_PLUGINS_PROJECTS_FASTER_HEARTBEAT_SECONDS": str(FAST_HEARTBEAT)}


def session_of(http: httpx.AsyncClient) -> dict[str, str]:
    return {"Cookie": f"svc_session={http.cookies['svc_session']}"}


async def pacing(stack: Stack, path: str, headers: dict[str, str], *,
                 within: float = SILENCE) -> tuple[int | None, bool]:
    """The stream's ``retry:`` hint, and whether a keepalive came within ``within`` seconds
    of silence."""
    async with open_sse(stack.running.base_url, path, headers) as stream:
        assert stream.status == 200
        with trio.move_on_after(within):
            while "keepalive" not in stream.comments:
                await stream._feed()
        return stream.retry, "keepalive" in stream.comments


async def lapse(stack: Stack, http: httpx.AsyncClient) -> None:
    """Cancel the subscription of ``http``'s user and let its period run out."""
    assert (await http.post("/me/subscription/cancel")).status_code == 200
    stack.advance(31 * DAY)
    await until_subscription(http, tier="none")


async def test_faster_sse_shortens_the_heartbeat_and_the_retry_hint(tmp_path: Path) -> None:
    async with billing_stack(tmp_path / "var", f"sqlite:///{tmp_path / 'db.sqlite'}",
                             plugins=PLUGINS, extra=PACING) as stack, \
            token_owner(stack.running, "paced") as owner, client(stack.running) as plain:
        await sign_in(plain)
        path = f"/projects/{(await new_project(owner, 'paced'))['slug']}/stream"
        assert await pacing(stack, path, {}) == (3000, False)
        await stack.subscribe(owner, "plus")  # plus has no fasterSse
        assert await pacing(stack, path, session_of(owner)) == (3000, False)
        await stack.subscribe(plain, "pro")
        assert await pacing(stack, path, session_of(plain), within=FAST_DEADLINE) == (1000, True)
        # A fast reader makes the stream beat faster; the others still hear nothing.
        async with open_sse(stack.running.base_url, path, session_of(plain)) as fast, \
                open_sse(stack.running.base_url, path) as anonymous:
            with trio.fail_after(5):
                while fast.comments.count("keepalive") < 3:
                    await fast._feed()
            with trio.move_on_after(0.5):
                await anonymous.until_end()
            assert anonymous.retry == 3000 and anonymous.comments == []
        await lapse(stack, plain)
        assert await pacing(stack, path, session_of(plain)) == (3000, False)


async def test_private_projects_need_max_and_stay_private_after_a_lapse(tmp_path: Path) -> None:
    async with billing_stack(tmp_path / "var", f"sqlite:///{tmp_path / 'db.sqlite'}",
                             plugins=PLUGINS) as stack, \
            token_owner(stack.running, "vault") as owner, client(stack.running) as stranger:
        await sign_in(stranger)
        body = {"tokenSlug": "vault", "title": "Vault", "brief": "A private build.",
                "agentTemplate": "fullstack-builder", "private": True}
        for tier in ("none", "pro"):
            if tier != "none":
                await stack.subscribe(owner, tier, provider="gateway")
            refused = await owner.post("/projects", json=body)
            assert refused.status_code == 403, (tier, refused.text)
            assert refused.json()["error"]["code"] == "private_projects_required"
        await lapse(stack, owner)
        await stack.subscribe(owner, "max")
        slug = (await new_project(owner, "vault", private=True))["slug"]
        await lapse(stack, owner)

        view = await owner.get(f"/projects/{slug}")
        assert view.status_code == 200 and view.json()["private"] is True
        hidden = await stranger.get(f"/projects/{slug}")
        assert hidden.status_code == 403
        assert hidden.json()["error"]["code"] == "private_forbidden"
        async with open_sse(stack.running.base_url, f"/projects/{slug}/stream",
                            session_of(owner)) as stream:
            assert stream.status == 200
        refused = await owner.post("/projects", json={**body, "title": "Another"})
        assert refused.json()["error"]["code"] == "private_projects_required"
        public = await owner.post("/projects", json={**body, "private": False})
        assert public.json()["error"]["code"] == "project_locked"  # gated no further
