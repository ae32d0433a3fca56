"""``[]`` subscriptions receive event types that did not exist when they were made.

The new type comes from a real third-party plugin (``tests/support/webhook_example_plugin``),
enabled in a second run of the service through its ``flowsvc.plugins`` entry point.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.events import emit_now
from tests.support.server import client, make_settings, running_server
from tests.support.webhook_example_plugin import EXAMPLE_EVENT, PLUGIN_NAME, install_entry_point
from tests.support.webhook_receiver import running_receiver
from tests.support.webhooks import PLUGINS, deliveries, signed_in, subscribe, webhook_env


async def test_an_all_events_subscription_receives_a_type_registered_after_it_was_made(
        tmp_path: Path, database_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    before = webhook_env(tmp_path / "var", database_url)
    after = webhook_env(tmp_path / "var", database_url, plugins=[*PLUGINS, PLUGIN_NAME])
    monkeypatch.syspath_prepend(str(install_entry_point(tmp_path / "site")))
    async with running_receiver() as everything, running_receiver() as chosen:
        async with running_server(make_settings(before), before) as running, \
                client(running) as http:
            user_id = await signed_in(http)
            catalogue_before = (await http.get("/me/webhooks/events")).json()["events"]
            all_events = await subscribe(http, everything.url(), [])
            only_payouts = await subscribe(http, chosen.url(), ["payout.sent"])
            too_early = await http.post("/me/webhooks", json={"url": chosen.url(),
                                                              "events": [EXAMPLE_EVENT]})
            cookies = http.cookies
        async with running_server(make_settings(after), after) as running, \
                client(running, cookies=cookies) as http:
            catalogue_after = (await http.get("/me/webhooks/events")).json()["events"]
            event = await emit_now(running.service, user_id=user_id,
                                         name=EXAMPLE_EVENT, data={"widget": "w-1"})
            [request] = await everything.wait_for(1)
            history = await deliveries(http, only_payouts["id"])

    assert EXAMPLE_EVENT not in {item["name"] for item in catalogue_before}
    assert EXAMPLE_EVENT in {item["name"] for item in catalogue_after}
    assert too_early.status_code == 400 and too_early.json()["error"]["code"] == "event_unknown"
    envelope = json.loads(request.body)
    assert envelope["id"] == event.id and envelope["event"] == EXAMPLE_EVENT
    assert envelope["data"] == {"widget": "w-1"}
    assert all_events["events"] == []
    assert chosen.received == [] and history == []
