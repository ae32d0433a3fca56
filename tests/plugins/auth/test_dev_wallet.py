"""``flowsvc dev-wallet`` against a running service: an API key and a token for the wallet,
the same wallet the next time, and a refusal off the embedded default.

The command runs in this process on a service of its own (as ``flowsvc`` opens one), so the
test pays no interpreter start per run; its process path, with the session it prints, is
README.md's "Try it", run by tests/test_readme.py.
"""

from __future__ import annotations

import argparse
import shlex
from pathlib import Path

import httpx
import pytest
from eth_account import Account

from plugins.auth.dev_wallet import DEV_WALLET
from runtime.bootstrap import open_service
from runtime.dev_wallet import KEY_FILE
from tests.support.server import INTERNAL, make_settings, running_server, settings_env


async def _dev_wallet(env: dict[str, str], capsys: pytest.CaptureFixture[str],
                      token: str | None = None, api_key: str | None = None
                      ) -> tuple[int, dict[str, str], str]:
    """Run the command; its exit code, the variables it exports, and its stderr."""
    async with open_service(make_settings(env), environ=env) as service:
        code = await DEV_WALLET.run(service, argparse.Namespace(token=token, api_key=api_key,
                                                                 wait=10.0))
    out, err = capsys.readouterr()
    exports = dict(shlex.split(line.removeprefix("export "))[0].split("=", 1)
                   for line in out.splitlines())
    return code, exports, err


async def test_dev_wallet_key_token_reuse_and_refusal(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    env = settings_env(tmp_path / "var", database_url=f"sqlite:///{tmp_path / 'db.sqlite'}",
                       plugins=["auth", "keys", "chain"])
    async with running_server(make_settings(env), env) as running:
        command_env = {**env, "FLOWSVC_SERVICE_PUBLIC_URL": running.base_url}
        code, exports, errors = await _dev_wallet(command_env, capsys, token="sun",
                                                  api_key="ci")
        assert code == 0, errors
        assert exports["FLOW_API_URL"] == running.base_url
        key_file = tmp_path / "var" / KEY_FILE
        assert key_file.stat().st_mode & 0o077 == 0
        address = Account.from_key(key_file.read_text().strip()).address.lower()
        assert f"dev wallet {address} signed in" in errors
        async with httpx.AsyncClient(base_url=running.base_url) as http:
            me = await http.get("/me", headers={"x-api-key": exports["FLOW_API_KEY"]})
            assert me.json()["user"]["address"] == address
            token = await http.get("/internal/tokens/sun", headers=INTERNAL)
            assert token.json()["token"]["ownerAddress"] == address

            code, exports, errors = await _dev_wallet(command_env, capsys)
            assert code == 0, errors
            again = await http.get("/me", headers={
                "authorization": f"Bearer {exports['FLOW_SESSION_TOKEN']}"})
            assert again.json()["user"]["address"] == address  # the same wallet, reused

        code, exports, errors = await _dev_wallet(
            {**command_env, "FLOWSVC_SERVICE_ENVIRONMENT": "production"}, capsys)
        assert code == 2 and exports == {}
        assert errors.splitlines() == [
            "flowsvc dev-wallet: refused: only for the embedded default (SQLite, no Redis, "
            "not production)"]
