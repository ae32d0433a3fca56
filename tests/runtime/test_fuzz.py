"""Fuzzing in the suite: schemathesis against a real server over its own ``/openapi.json``.

Three schemathesis runs at once: anonymous, with a session (cookie and bearer) and with an
API key (header and bearer). Each has a service of its own with every built-in plugin,
served on loopback by the test's process on a fresh database (PostgreSQL when the run has
it: NUL characters and 64-bit overflows only fail there), and all read one chain on anvil
so the on-chain routes answer from real contracts. A run fails on any 5xx and on any
answer the document does not declare (status, media type, headers, body schema), a 405
without ``Allow`` included.

Every run sends the same cases on every machine: schemathesis' deterministic mode (no
random seed, no example database), a fixed number of cases per operation
(``--max-examples``, not a time budget that a loaded machine spends on fewer cases, maybe
before the coverage phase reaches an operation), one worker, and a service only that run
has changed (a case that needs a resource another run created no longer depends on
timing). The work is fixed, so only the time it takes varies: about a minute on a quiet
two-core machine, several under heavy load (the test's timeout allows for that).

Left out: ``positive_data_acceptance`` (a body the schema allows may still be refused for
what a schema cannot say: a signature that does not verify, a cursor this listing never
issued, text made of control characters), and the SSE streams, every operation the
document says answers ``text/event-stream`` (an open stream never ends, so it cannot be
judged as one answer: each such case only waited out the request timeout, 22 cases and
about 97 s of each signed-in run for ``/me/api-keys/tail``; tests/plugins/projects and
tests/plugins/keys/test_activity.py cover the streams, their refusals included), and the
examples phase (the documented examples reach the network, a webhook URL's name lookup,
and would spend the run's time there).
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from tests.support.backends import preferred_database, redis_prefix
from tests.support.chain.anvil import DEFAULT_CHAIN_ID, open_anvil
from tests.support.chain.contracts import open_chain
from tests.support.chain.deploy import Deployment, deploy_stack
from tests.support.chain.service import chain_entry, chains_env
from tests.support.server import (
    INTERNAL_TOKEN,
    client,
    make_settings,
    running_server,
    settings_env,
)
from tests.support.wallet import new_wallet, sign

PLUGINS = ["auth", "keys", "projects", "webhooks", "marketplace", "billing", "chain"]
EXAMPLES_PER_OPERATION = 5  # fuzzing and stateful; the coverage phase's cases are fixed
RUN_TIMEOUT_SECONDS = 900  # a run that never ends, not a budget: runs end on their own
SCHEMATHESIS = Path(sys.executable).parent / "st"


async def _deploy(url: str) -> Deployment:
    async with open_chain(url) as chain:
        return await deploy_stack(chain)


async def _credentials(http: httpx.AsyncClient) -> tuple[str, str]:
    """A new user's session token (a wallet signs in) and API key (unlimited)."""
    wallet = new_wallet()
    address = wallet.address.lower()
    message = (await http.post("/auth/nonce", json={"address": address})).json()["message"]
    signed = await http.post("/auth/verify", json={"address": address, "message": message,
                                                   "signature": sign(wallet, message)})
    assert signed.status_code == 200, signed.text
    session = http.cookies["svc_session"]
    created = await http.post("/me/api-keys", json={"name": "fuzz", "rate_limit_rpm": 0})
    assert created.status_code == 201, created.text
    http.cookies.clear()
    return session, created.json()["key"]["raw_key"]


# Per run: the credentials of each security scheme (from a user's session token and API
# key) and the operations it must not call. A run must not revoke its own credentials
# (logout, deleting the key): the rest of it would test nothing but 401s. The anonymous run
# calls both, and the operators' routes with the internal token (they take nothing else).
RUNS: dict[str, tuple[Callable[[str, str], dict[str, dict[str, str]]], tuple[str, ...]]] = {
    "anonymous": (lambda session, key: {"internalToken": {"bearer": INTERNAL_TOKEN}}, ()),
    "session": (lambda session, key: {"sessionCookie": {"api_key": session},
                                      "bearer": {"bearer": session}}, ("post_logout",)),
    "api-key": (lambda session, key: {"apiKey": {"api_key": key}, "bearer": {"bearer": key}},
                ("delete_delete",)),
}


def _config(path: Path, schemes: dict[str, dict[str, str]]) -> Path:
    """A schemathesis.toml giving the credentials of each named security scheme."""
    lines = []
    for scheme, values in schemes.items():
        lines.append(f"[auth.openapi.{scheme}]")
        lines.extend(f"{name} = {json.dumps(value)}" for name, value in values.items())
    path.write_text("\n".join(lines) + "\n")
    return path


def _streams(document: dict[str, Any]) -> list[str]:
    """The paths of the operations that answer ``text/event-stream`` in ``document``."""
    return sorted({path for path, operations in document["paths"].items()
                   for operation in operations.values() if isinstance(operation, dict)
                   for answer in operation.get("responses", {}).values()
                   if "text/event-stream" in answer.get("content", {})})


async def _schemathesis(base_url: str, config: Path, workdir: Path, excluded: tuple[str, ...],
                        streams: list[str]) -> tuple[int, str]:
    """One schemathesis run (``excluded``: operation ids it must not call; ``streams``: the
    paths of the SSE streams); its exit code and output."""
    argv = [str(SCHEMATHESIS), "--config-file", str(config), "run", f"{base_url}/openapi.json",
            "--generation-deterministic",
            "--max-examples", str(EXAMPLES_PER_OPERATION), "--workers", "1",
            "--no-color", "--request-timeout", "10",
            "--phases", "coverage,fuzzing,stateful",
            "--exclude-checks", "positive_data_acceptance"]
    for operation_id in excluded:
        argv += ["--exclude-operation-id", operation_id]
    for path in streams:
        argv += ["--exclude-path", path]
    with trio.fail_after(RUN_TIMEOUT_SECONDS):
        done = await trio.run_process(argv, cwd=workdir, capture_stdout=True,
                                      stderr=subprocess.STDOUT, check=False)
    return done.returncode, done.stdout.decode()


async def _serve_and_fuzz(name: str, workdir: Path, chain: dict[str, Any],
                          outputs: dict[str, tuple[int, str]]) -> None:
    """Run ``name`` of ``RUNS`` against a service of its own, on a fresh database."""
    schemes, excluded = RUNS[name]
    with preferred_database(workdir) as database_url:
        env = settings_env(workdir / "var", database_url=database_url,
                           redis_prefix=redis_prefix(), plugins=PLUGINS,
                           extra={"FLOWSVC_LIMITS_ANONYMOUS_RPM": "0",
                                  "FLOWSVC_LIMITS_AUTHENTICATED_RPM": "0",
                                  "FLOWSVC_LIMITS_INTERNAL_RPM": "0", **chains_env([chain])})
        async with running_server(make_settings(env), env) as running:
            async with client(running) as http:
                session, key = await _credentials(http)
                streams = _streams((await http.get("/openapi.json")).json())
            assert "/me/api-keys/tail" in streams  # the document still says which they are
            config = _config(workdir / "schemathesis.toml", schemes(session, key))
            outputs[name] = await _schemathesis(running.base_url, config, workdir / "run",
                                                excluded, streams)


@pytest.mark.timeout(RUN_TIMEOUT_SECONDS + 300)
async def test_fuzzing_the_document_finds_no_5xx_and_no_undeclared_answer(tmp_path: Path
                                                                          ) -> None:
    outputs: dict[str, tuple[int, str]] = {}
    async with open_anvil(DEFAULT_CHAIN_ID) as anvil:
        deployment = await _deploy(anvil.url)
        chain = chain_entry(deployment.platform, [anvil.url],
                            instance=deployment.dpnm.instance)
        async with trio.open_nursery() as nursery:
            for name in RUNS:
                (tmp_path / name / "run").mkdir(parents=True)
                nursery.start_soon(_serve_and_fuzz, name, tmp_path / name, chain, outputs)
    failed = {name: output for name, (code, output) in outputs.items() if code != 0}
    assert not failed, "\n\n".join(f"--- {name} ---\n{output[-6000:]}"
                                   for name, output in failed.items())
    for _, output in outputs.values():  # each run did test the operations
        assert " passed" in output and "API Operations:" in output, output[-3000:]
