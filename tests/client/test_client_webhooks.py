"""The client's webhook receiver helper on real deliveries: signature, tolerance, rotation;
and the subscription calls on the same service."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import trio
from flowsvc_client import BadRequest, Client, WebhookSignatureError, verify_webhook

from tests.support.server import make_settings, running_server
from tests.support.wallet import new_wallet
from tests.support.webhook_receiver import Received, running_receiver
from tests.support.webhooks import webhook_env

# The delivery of docs/webhooks-receiving.md, signed with its example secret at T.
DOCS_SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
DOCS_T = 1795860000


async def test_deliveries_verify_with_either_secret_while_rotating(tmp_path: Path) -> None:
    env = webhook_env(tmp_path / "var", f"sqlite:///{tmp_path / 'db.sqlite'}",
                      plugins=["auth", "webhooks", "chain", "billing"])
    async with running_server(make_settings(env), env) as running, \
            running_receiver() as receiver:
        with Client(running.base_url) as flow:
            webhook = await trio.to_thread.run_sync(_subscribe_and_ping, flow, receiver.url())
            [first] = await receiver.wait_for(1)  # signed before the rotation
            rotated = await trio.to_thread.run_sync(flow.rotate_webhook_secret, webhook["id"])
            await trio.to_thread.run_sync(flow.test_webhook, webhook["id"])
            first, second = await receiver.wait_for(2)
    old, new = str(webhook["secret"]), str(rotated["secret"])
    assert verify_webhook(first.body, first.headers, old)["event"] == "webhook.ping"
    with pytest.raises(WebhookSignatureError) as unknown:
        verify_webhook(first.body, first.headers, new)
    assert unknown.value.reason == "no_matching_signature"
    # After the rotation the old and the new secret both sign: either one verifies.
    for secrets in (old, new, [new, old]):
        assert verify_webhook(second.body, second.headers, secrets)["id"].startswith("evt_")
    _refused(second, new)


def _subscribe_and_ping(flow: Client, url: str) -> dict[str, Any]:
    flow.sign_in_with_wallet(new_wallet())
    webhook = flow.create_webhook(url, events=[])
    assert [hook["id"] for hook in flow.webhooks()] == [webhook["id"]]
    flow.test_webhook(webhook["id"])
    # Subscriptions, while here: none yet, and no payment provider configured in tests.
    assert flow.subscription()["tier"] == "none"
    with pytest.raises(BadRequest) as unsupported:
        flow.checkout("plus", "usdt_bep20")
    assert unsupported.value.code == "provider_unsupported"
    return webhook


def _refused(delivery: Received, secret: str) -> None:
    """A changed body, a stale or early time, a bad header: each refused with its reason."""
    tampered = delivery.body.replace(b"webhook.ping", b"webhook.pong")
    with pytest.raises(WebhookSignatureError) as changed:
        verify_webhook(tampered, delivery.headers, secret)
    assert changed.value.reason == "no_matching_signature"
    sent_at = int(delivery.headers["x-service-signature"].split(",")[0].removeprefix("t="))
    for now in (sent_at + 301, sent_at - 301):
        with pytest.raises(WebhookSignatureError) as stale:
            verify_webhook(delivery.body, delivery.headers, secret, now=now)
        assert stale.value.reason == "timestamp_out_of_tolerance"
    assert verify_webhook(delivery.body, delivery.headers, secret, now=sent_at + 300)
    assert verify_webhook(delivery.body, delivery.headers, secret, tolerance=10,
                          now=sent_at + 10)
    for header in ({}, {"X-Service-Signature": "v1=abc"}, {"x-service-signature": "t=1"}):
        with pytest.raises(WebhookSignatureError) as malformed:
            verify_webhook(delivery.body, header, secret)
        assert malformed.value.reason == "malformed"


def test_the_documented_example_delivery_verifies() -> None:
    docs = (Path(__file__).resolve().parents[2] / "docs" / "webhooks-receiving.md").read_text()
    http = docs.split("```http\n", 1)[1].split("```", 1)[0]
    head, body = http.split("\n\n", 1)
    headers = dict(line.split(": ", 1) for line in head.splitlines()[1:])
    envelope = verify_webhook(body.strip().encode(), headers, DOCS_SECRET, now=DOCS_T)
    assert envelope == json.loads(body) and envelope["event"] == "payout.sent"
