"""Requests straight through the ASGI interface, in process: the app's own cost, no network.

The driver builds one app in this process (the hello-world of ``bench.hello_app``, or
flowsvc with its actors running on the embedded default) and sends it the same request
again and again through ``app(scope, receive, send)``, with no socket, no HTTP parser and no
load generator sharing the CPU. What it measures is the cost of the app itself: the part of
a request flowsvc's pipeline adds to the framework's.

Two ways to read the figures (``bench.bench_pipeline`` runs both):

- CPU time per request (``time.process_time``), robust to a loaded machine because the
  driver does nothing else;
- instructions per request under ``valgrind --tool=callgrind``: the same count whatever else
  the machine is doing. For that the driver waits on stdin after its warm-up
  (``--wait``), so that the harness turns instrumentation on (``callgrind_control -i on``)
  only around the measured requests.

Scenarios: ``hello`` (``GET /hello``), ``healthz`` (flowsvc ``GET /healthz``, the pipeline
alone), ``me`` (``GET /me`` with a session cookie), ``key`` (``GET /healthz`` with an
``x-api-key`` of a key with a cap, in-process meter).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import trio

from runtime.logs import configure_logging

Scope = dict[str, Any]
App = Callable[..., Awaitable[None]]  # app(scope, receive, send), ASGI 3
SCENARIOS = ("hello", "healthz", "me", "key")


def http_scope(method: str, path: str, headers: Sequence[tuple[str, str]]) -> Scope:
    """The ASGI scope hypercorn would give the app for this request on loopback."""
    return {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"},
            "http_version": "1.1", "method": method, "scheme": "http", "path": path,
            "raw_path": path.encode(), "query_string": b"", "root_path": "",
            "headers": [(b"host", b"127.0.0.1:8000"),
                        *((name.lower().encode(), value.encode()) for name, value in headers)],
            "client": ("127.0.0.1", 50000), "server": ("127.0.0.1", 8000), "extensions": {}}


async def call(app: App, method: str, path: str, headers: Sequence[tuple[str, str]] = (),
               body: bytes = b"") -> tuple[int, dict[str, str], bytes]:
    """One request through ``app``; its status, headers and body."""
    sent = False
    status = 0
    response_headers: dict[str, str] = {}
    chunks: list[bytes] = []

    async def receive() -> dict[str, Any]:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        await trio.sleep_forever()
        raise AssertionError("unreachable")

    async def send(message: dict[str, Any]) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]
            response_headers.update({name.decode().lower(): value.decode()
                                     for name, value in message.get("headers", [])})
        elif message["type"] == "http.response.body":
            chunks.append(message.get("body", b""))

    await app(http_scope(method, path, headers), receive, send)
    return status, response_headers, b"".join(chunks)


async def sign_in(app: App) -> str:
    """A session cookie for a fresh wallet, signed in over the app's own SIWE routes."""
    from eth_account import Account
    from eth_account.messages import encode_defunct

    wallet = Account.create()
    address = wallet.address.lower()
    json_headers = [("content-type", "application/json")]
    _, _, issued = await call(app, "POST", "/auth/nonce", json_headers,
                              json.dumps({"address": address}).encode())
    message = json.loads(issued)["message"]
    signature = "0x" + wallet.sign_message(encode_defunct(text=message)).signature.hex() \
        .removeprefix("0x")
    status, headers, body = await call(app, "POST", "/auth/verify", json_headers, json.dumps(
        {"address": address, "message": message, "signature": signature}).encode())
    if status != 200:
        raise RuntimeError(f"sign-in refused: {status} {body!r}")
    return headers["set-cookie"].split(";", 1)[0]


async def scenario_request(app: App, scenario: str) -> tuple[str, list[tuple[str, str]]]:
    """The path and headers of one request of ``scenario`` (signing in first if needed)."""
    if scenario == "hello":
        return "/hello", []
    if scenario == "healthz":
        return "/healthz", []
    cookie = await sign_in(app)
    if scenario == "me":
        return "/me", [("cookie", cookie)]
    status, _, body = await call(app, "POST", "/me/api-keys",
                                 [("cookie", cookie), ("content-type", "application/json")],
                                 json.dumps({"name": "bench", "rate_limit_rpm": 100_000}).encode())
    if status != 201:
        raise RuntimeError(f"key refused: {status} {body!r}")
    return "/healthz", [("x-api-key", json.loads(body)["key"]["raw_key"])]


def flowsvc_environ(var_dir: Path) -> dict[str, str]:
    return {"FLOWSVC_SERVICE_VAR_DIR": str(var_dir), "FLOWSVC_SERVICE_LOG_LEVEL": "info",
            "FLOWSVC_PLUGINS_ENABLED": '["auth", "keys"]',
            "FLOWSVC_LIMITS_ANONYMOUS_RPM": str(10**9),
            "FLOWSVC_LIMITS_AUTHENTICATED_RPM": str(10**9)}


async def drive(scenario: str, requests: int, warmup: int, wait: bool) -> dict[str, Any]:
    """Build the app, warm it up, then time ``requests`` requests of ``scenario``."""
    async with trio.open_nursery() as nursery:
        if scenario == "hello":
            from bench.hello_app import create_app as hello_app

            app: App = hello_app()
        else:
            app = await nursery.start(_flowsvc_app)
        path, headers = await scenario_request(app, scenario)
        for _ in range(warmup):
            status, _, _ = await call(app, "GET", path, headers)
        if status != 200:
            raise RuntimeError(f"{scenario}: {path} answered {status}")
        if wait:
            print("warm", flush=True)
            await trio.to_thread.run_sync(sys.stdin.readline)
        started = time.process_time()
        for _ in range(requests):
            await call(app, "GET", path, headers)
        cpu = time.process_time() - started
        if wait:
            print("done", flush=True)
            await trio.to_thread.run_sync(sys.stdin.readline)
        nursery.cancel_scope.cancel()
    return {"scenario": scenario, "requests": requests, "cpu_us_per_request": cpu / requests * 1e6}


async def _flowsvc_app(*, task_status: trio.TaskStatus[App]) -> None:
    from runtime.bootstrap import open_service
    from runtime.config import load_settings
    from runtime.http import create_app

    with tempfile.TemporaryDirectory(prefix="flowsvc-asgi-") as folder:
        environ = flowsvc_environ(Path(folder))
        settings = load_settings(None, environ)
        async with open_service(settings, environ=environ) as service, \
                trio.open_nursery() as nursery:
            supervisor = await service.start_actors(nursery)
            task_status.started(create_app(service))
            try:
                await trio.sleep_forever()
            finally:
                with trio.CancelScope(shield=True):
                    await supervisor.stop_all()


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("scenario", choices=SCENARIOS)
    parser.add_argument("--requests", type=int, default=5000)
    parser.add_argument("--warmup", type=int, default=500)
    parser.add_argument("--wait", action="store_true",
                        help="wait for a line on stdin before and after the measured requests")
    args = parser.parse_args(argv)
    # The service logs one access line per request, as when served: here to a null device.
    with open(os.devnull, "w") as devnull:
        configure_logging("info", devnull)
        result = trio.run(drive, args.scenario, args.requests, args.warmup, args.wait)
        print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
