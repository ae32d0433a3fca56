"""flowsvc_client against a real service: sign-in three ways, keys, projects, the marketplace,
typed errors and Retry-After.

The client is blocking; the service runs in this test's Trio run, so the client's side of
each scenario runs in a worker thread (``trio.to_thread.run_sync``).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import trio
from eth_account import Account
from flowsvc_client import (
    BadRequest,
    Client,
    Conflict,
    Forbidden,
    NotFound,
    RateLimited,
    Unauthenticated,
)

from plugins.auth.identities import new_access_codes
from runtime.server import Running
from tests.support.server import make_settings, running_server, settings_env
from tests.support.tokens import add_token

PLUGINS = ["auth", "keys", "chain", "projects", "marketplace"]
TEMPLATE = "fullstack-builder"
BRIEF = "A landing page for the moon token."


async def test_wallet_session_keys_projects_marketplace_and_typed_errors(tmp_path: Path) -> None:
    env = settings_env(tmp_path / "var", database_url=f"sqlite:///{tmp_path / 'db.sqlite'}",
                       plugins=PLUGINS, extra={"FLOWSVC_LIMITS_ANONYMOUS_RPM": "0",
                                               "FLOWSVC_LIMITS_AUTHENTICATED_RPM": "0"})
    wallet = Account.create()
    async with running_server(make_settings(env), env) as running:
        registered = await add_token(running.base_url, "moon", wallet.address.lower())
        assert registered.status_code == 201
        [code] = await running.service.db.write(new_access_codes, 1)
        await trio.to_thread.run_sync(_scenario, running, wallet.key.hex(), code)


def _scenario(running: Running, private_key: str, access_code: str) -> None:
    url = running.base_url
    public_url = running.service.settings.service.public_url
    with Client(url) as anonymous:
        with pytest.raises(Unauthenticated) as refused:
            anonymous.me()
        assert refused.value.code == "unauthenticated" and refused.value.status == 401
        assert refused.value.request_id

    with Client(url) as flow:
        user = flow.sign_in_with_wallet(private_key)
        assert user["address"] == Account.from_key(private_key).address.lower()
        assert flow.me()["id"] == user["id"] and flow.session_token

        with pytest.raises(NotFound) as unknown:
            flow.create_project(token_slug="sun", title="Sun", brief=BRIEF,
                                agent_template=TEMPLATE)
        assert unknown.value.code == "not_found"
        with pytest.raises(BadRequest) as bad:
            flow.create_project(token_slug="moon", title="Moon", brief=BRIEF,
                                agent_template="no-such-template")
        assert bad.value.code == "template_unknown"
        project = flow.create_project(token_slug="moon", title="Moon", brief=BRIEF,
                                      agent_template=TEMPLATE)
        run_id = flow.start_project(project["slug"])
        events = list(flow.project_events(project["slug"]))
        assert [int(str(event.id)) for event in events] == list(range(1, len(events) + 1))
        assert events[-1].event == "done" and events[-1].data == {
            "runId": run_id, "finalStatus": "completed",
            "previewUrl": f"{public_url}/projects/{project['slug']}/preview/"}
        resumed = list(flow.project_events(project["slug"], last_event_id="3"))
        assert resumed == events[3:]
        assert flow.project(project["slug"])["status"] == "completed"

        # Marketplace: read-after-write through the client.
        agent = flow.create_agent(name="Moon builder", description="Builds moon pages.",
                                  agent_template=TEMPLATE, tags=["moon"])
        flow.publish_agent(agent["slug"])
        assert flow.agents(sort="new")["agents"][0]["slug"] == agent["slug"]
        assert [item["slug"] for item in flow.all_agents(tag="moon", limit=1)] == [agent["slug"]]
        assert flow.set_tool_prices(agent["slug"], {"git_commit": "0.5"}) == [
            {"tool": "git_commit", "perCallFlow": "0.500000"}]
        agent_run = flow.run_agent(agent["slug"], BRIEF)
        run_events = list(flow.agent_run_events(agent_run["runId"]))
        assert run_events[-1].data == {"runId": agent_run["runId"], "finalStatus": "completed"}
        flow.unpublish_agent(agent["slug"])
        assert flow.agents()["agents"] == []

        key = flow.create_api_key("bot", rate_limit_rpm=1)
        token = flow.session_token
        flow.logout()
        assert flow.session_token is None
    with Client(url, session_token=token) as logged_out, pytest.raises(Unauthenticated):
        logged_out.me()

    with Client(url) as coded:
        newcomer = coded.sign_in_with_access_code(access_code)
        assert newcomer["address"] is None
        with pytest.raises(Forbidden) as no_wallet:
            coded.create_project(token_slug="moon", title="Moon", brief=BRIEF,
                                 agent_template=TEMPLATE)
        assert no_wallet.value.code == "token_no_match"
        # The on-chain reads answer through the same typed errors (no chain configured here;
        # tests/plugins/chain reads real ones on anvil).
        with pytest.raises(Conflict) as no_address:
            coded.flow_onchain()
        assert no_address.value.code == "address_required"
        with pytest.raises(NotFound):
            coded.token_onchain("sun")
        with pytest.raises(BadRequest) as bad_depth:
            coded.tree(depth=11)
        assert bad_depth.value.details[0]["field"] == "depth"

    # Retry-After: a key capped at 1 request per minute; the client waits as told, then
    # raises the typed error once its retries are spent.
    waits: list[float] = []
    with Client(url, api_key=str(key["raw_key"]), sleep=waits.append,
                max_rate_retries=2) as bot:
        assert bot.me()["id"] == user["id"]
        with pytest.raises(RateLimited) as limited:
            bot.me()
    assert limited.value.code == "rate_limited" and 0 < limited.value.retry_after <= 60
    assert len(waits) == 2 and all(0 < wait <= 60 for wait in waits)

