"""Milestone notifications through a fake Bot API, with a messenger-linked subscriber."""

from __future__ import annotations

import json
import time
from pathlib import Path
from urllib.parse import urlencode

import httpx
import trio

from plugins.auth.messenger import init_data_hash
from plugins.projects.records.notifier import Milestone, milestone_text
from tests.support.fake_botapi import FakeBotApi
from tests.support.projects import new_project, serve_projects, token_owner
from tests.support.server import client
from tests.support.sse import open_sse

BOT_TOKEN = "123456:TEST-bot-token"


async def messenger_login(http: httpx.AsyncClient, messenger_id: int) -> None:
    fields = {"auth_date": str(int(time.time())), "query_id": "q1",
              "user": json.dumps({"id": messenger_id, "first_name": f"Fan {messenger_id}"})}
    init_data = urlencode({**fields, "hash": init_data_hash(fields, BOT_TOKEN)})
    answer = await http.post("/auth/messenger", json={"initData": init_data})
    assert answer.status_code == 200, answer.text


async def test_subscribers_hear_of_plan_commits_and_end(tmp_path: Path, database_url: str,
                                                        nursery: trio.Nursery) -> None:
    bot = FakeBotApi(fail_first=2, fail_status=502)
    bot_url = await nursery.start(bot.serve)
    env_extra = {"FLOWSVC_PLUGINS_AUTH_BOT_TOKEN": BOT_TOKEN,
                 "FLOWSVC_PLUGINS_AUTH_BOT_API_BASE_URL": bot_url,
                 "FLOWSVC_PLUGINS_AUTH_BOT_SEND_BACKOFF_SECONDS": "0.01"}
    async with serve_projects(tmp_path / "var", database_url, extra_env=env_extra) as running:
        async with token_owner(running, "news") as owner, client(running) as fan, \
                client(running) as quitter:
            slug = (await new_project(owner, "news"))["slug"]
            await messenger_login(fan, 777)
            await messenger_login(quitter, 778)
            for _ in range(2):
                subscribed = await fan.post(f"/projects/{slug}/subscribe")
                assert subscribed.status_code == 200
                assert subscribed.json() == {"subscribed": True}
            assert (await quitter.post(f"/projects/{slug}/subscribe")).status_code == 200
            left = await quitter.delete(f"/projects/{slug}/subscribe")
            assert left.json() == {"subscribed": False}

            assert (await owner.post(f"/projects/{slug}/start")).status_code == 201
            async with open_sse(running.base_url, f"/projects/{slug}/stream") as stream:
                events = await stream.until("done")
            messages = await bot.wait_for(5)
            await trio.sleep(0.2)  # nothing more arrives
        assert len(bot.messages) == 5 and bot.attempts == 7  # two failures were retried
        assert {message.chat_id for message in messages} == {777}
        assert {message.path for message in messages} == {f"/bot{BOT_TOKEN}/sendMessage"}
        texts = sorted(message.text for message in messages)
        commits = [event.json() for event in events if event.event == "commit"]
        assert sorted(texts) == sorted(
            ["Luigi's Pizza: the agent planned 3 steps\n1. Scaffold the page\n"
             "2. Add the API server and README\n3. Check the build"]
            + [f"Luigi's Pizza: commit {c['sha'][:7]} {c['message']} ({len(c['files'])} "
               f"file{'s' if len(c['files']) != 1 else ''})" for c in commits]
            + [f"Luigi's Pizza: the build completed. Download it: http://127.0.0.1:8000"
               f"/projects/{slug}/artifact?ref={commits[-1]['sha']}"])


def test_milestone_texts_for_failures_and_long_plans() -> None:
    failed = milestone_text("Bot", Milestone(1, "end", {"finalStatus": "failed",
                                                       "reason": "model down"}))
    assert failed == "Bot: the build failed: model down"
    cancelled = milestone_text("Bot", Milestone(1, "end", {"finalStatus": "cancelled"}))
    assert cancelled == "Bot: the build was cancelled."
    plan = milestone_text("Bot", Milestone(1, "plan", {"steps": [f"s{i}" for i in range(12)],
                                                       "revision": 2}))
    assert plan.splitlines()[0] == "Bot: the agent planned 12 steps"
    assert plan.splitlines()[-1] == "... and 2 more" and "11. s10" not in plan
