"""The console's account page: the subscription and its features, checkout refusals shown
with the API's code, and the on-chain part degrading to the API's answer when no chain can
be read, or when the plugins behind a part are not enabled."""

from __future__ import annotations

import re
from pathlib import Path

from tests.support.server import client, make_settings, running_server, settings_env
from tests.support.wallet import sign_in


async def test_the_account_page_shows_what_each_api_answers(tmp_path: Path) -> None:
    env = settings_env(tmp_path / "var", database_url=f"sqlite:///{tmp_path / 'db.sqlite'}",
                       plugins=["auth", "billing", "chain", "console"])
    async with running_server(make_settings(env), env) as server, client(server) as http:
        await sign_in(http)
        page = await http.get("/console/account")
        assert page.status_code == 200
        assert '<dd id="tier">none</dd>' in page.text
        assert "privateProjects: no" in page.text
        assert "chain_unavailable" in page.text  # no chain configured: that part only
        token = re.search(r'name="csrf" value="([^"]+)"', page.text)
        assert token is not None
        refused = await http.post("/console/account/checkout",
                                  data={"csrf": token.group(1), "tier": "pro",
                                        "provider": "gateway"})
        assert refused.status_code == 400 and "provider_unsupported" in refused.text


async def test_a_part_whose_plugin_is_off_says_so(tmp_path: Path) -> None:
    env = settings_env(tmp_path / "var", database_url=f"sqlite:///{tmp_path / 'db.sqlite'}",
                       plugins=["auth", "console"])
    async with running_server(make_settings(env), env) as server, client(server) as http:
        await sign_in(http)
        page = await http.get("/console/account")
        assert page.status_code == 200 and page.text.count("Not available: not_found") == 2
