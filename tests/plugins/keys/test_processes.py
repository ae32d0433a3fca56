"""Two service processes: one cap per key through Redis, and revocation reaching both fast."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import httpx
import trio

from tests.support.keys import create_key, keys_env
from tests.support.processes import serving
from tests.support.server import ROOT, free_port
from tests.support.wallet import sign_in
from tests.support.webhooks import migrate_schema


async def _revocation_delay(base_a: str, base_b: str, raw: str, key_id: str,
                            http_a: httpx.AsyncClient) -> float:
    """Seconds from revoking on A until B answers 401 to the key."""
    async with httpx.AsyncClient(base_url=base_b, headers={"x-api-key": raw}) as on_b:
        assert (await on_b.get("/healthz")).status_code == 200  # B has the key cached
        started = time.monotonic()
        assert (await http_a.delete(f"/me/api-keys/{key_id}")).status_code == 204
        with trio.fail_after(5):
            # Another process has no event to await: poll it the way a client would.
            while (await on_b.get("/healthz")).status_code != 401:  # noqa: ASYNC110
                await trio.sleep(0.02)
        return time.monotonic() - started


async def test_two_processes_enforce_one_cap_and_one_revocation(
        tmp_path: Path, backend: tuple[str, str]) -> None:
    database_url, redis_url = backend
    env = keys_env(tmp_path / "var", database_url, redis_url,
                   extra={"FLOWSVC_SERVICE_LOG_LEVEL": "warning"})
    port_a, port_b = free_port(), free_port()
    base_a, base_b = f"http://127.0.0.1:{port_a}", f"http://127.0.0.1:{port_b}"
    # The schema migrated first, both processes start at once on it.
    await migrate_schema(env)
    with serving({**env, "FLOWSVC_DATABASE_MIGRATE_ON_START": "false"}, [port_a, port_b]):
        async with httpx.AsyncClient(base_url=base_a, timeout=30) as http_a:
            await sign_in(http_a)
            key = await create_key(http_a, rate_limit_rpm=10)
            raw = key["raw_key"]
            if redis_url:
                admitted = 0
                async with httpx.AsyncClient(headers={"x-api-key": raw}) as caller:
                    for n in range(30):
                        base = base_a if n % 2 else base_b
                        admitted += (await caller.get(f"{base}/healthz")).status_code == 200
                assert admitted == 10
                fresh = (await create_key(http_a, rate_limit_rpm=0))
                delay = await _revocation_delay(base_a, base_b, fresh["raw_key"], fresh["id"],
                                                http_a)
                assert delay < 1.0
            else:
                # In-process meters cannot be shared, but revocation still reaches another
                # process on the same database through the invalidation poll.
                delay = await _revocation_delay(base_a, base_b, raw, key["id"], http_a)
                assert delay < 1.5
    if not redis_url:
        with trio.fail_after(60):
            refused = await trio.run_process(
                [sys.executable, "-m", "runtime.cli", "serve", "--workers", "2", "--bind",
                 f"127.0.0.1:{free_port()}"], cwd=ROOT, env={**env, "PATH": "/usr/bin:/bin"},
                capture_stdout=True, capture_stderr=True, check=False)
        assert refused.returncode == 2
        assert b"needs Redis" in refused.stderr
