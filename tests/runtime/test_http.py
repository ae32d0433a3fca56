"""The HTTP front end over a real loopback server: errors, request ids, probes, metrics, docs."""

from __future__ import annotations

import json
import logging
import re
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
import trio
from prometheus_client.parser import text_string_to_metric_families

from runtime.sandbox.jail import cgroups_state
from runtime.server import Running
from tests.support.server import client, free_port, make_settings, running_server, settings_env
from tests.support.testkit_plugin import MODULE as TESTKIT
from tests.support.testkit_plugin import SECRET_DETAIL

MAX_BODY = 4096
ADDRESS = "0x" + "ab" * 20


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    return settings_env(tmp_path / "var", database_url=f"sqlite:///{tmp_path / 'flowsvc.db'}",
                        plugins=["auth", TESTKIT],
                        extra={"FLOWSVC_LIMITS_ANONYMOUS_RPM": "0",
                               "FLOWSVC_SERVICE_MAX_BODY_BYTES": str(MAX_BODY), **extra})


@pytest.fixture
async def running(tmp_path: Path) -> AsyncIterator[Running]:
    env = _env(tmp_path)
    async with running_server(make_settings(env), env) as served:
        yield served


@pytest.fixture
async def http(running: Running) -> AsyncIterator[httpx.AsyncClient]:
    async with client(running) as session:
        yield session


def _error(response: httpx.Response, status: int, code: str) -> str:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/json"
    body = response.json()
    assert set(body) == {"error"}
    assert {"code", "message"} <= set(body["error"]) <= {"code", "message", "details"}
    assert body["error"]["code"] == code
    message: str = body["error"]["message"]
    assert message
    return message


async def test_unknown_path_is_not_found(http: httpx.AsyncClient) -> None:
    assert "/nowhere" in _error(await http.get("/nowhere"), 404, "not_found")


async def test_wrong_method_is_method_not_allowed(http: httpx.AsyncClient) -> None:
    _error(await http.get("/auth/nonce"), 405, "method_not_allowed")
    _error(await http.delete("/healthz"), 405, "method_not_allowed")


async def test_malformed_json_is_invalid_request(http: httpx.AsyncClient) -> None:
    response = await http.post("/auth/nonce", content=b'{"address": ',
                               headers={"Content-Type": "application/json"})
    assert "not valid JSON" in _error(response, 400, "invalid_request")


async def test_a_bad_field_is_invalid_request_with_details(http: httpx.AsyncClient) -> None:
    response = await http.post("/auth/nonce", json={"address": "not-an-address"})
    _error(response, 400, "invalid_request")
    assert [detail["field"] for detail in response.json()["error"]["details"]] == ["address"]


async def test_a_body_over_the_limit_is_payload_too_large(http: httpx.AsyncClient) -> None:
    big = json.dumps({"address": ADDRESS, "padding": "x" * MAX_BODY}).encode()
    response = await http.post("/auth/nonce", content=big,
                               headers={"Content-Type": "application/json"})
    assert str(MAX_BODY) in _error(response, 413, "payload_too_large")

    async def chunks() -> AsyncIterator[bytes]:  # no Content-Length: caught while reading
        for _ in range(4):
            yield b"x" * MAX_BODY

    streamed = await http.post("/auth/nonce", content=chunks(),
                               headers={"Content-Type": "application/json"})
    _error(streamed, 413, "payload_too_large")
    assert (await http.post("/auth/nonce", json={"address": ADDRESS})).status_code == 200


async def test_a_huge_body_is_refused_and_the_connection_not_reused(running: Running) -> None:
    """The unread rest of the body would wedge a kept-alive connection: the server says close."""
    host, port = running.base_url.removeprefix("http://").rsplit(":", 1)
    body = b"x" * (1024 * MAX_BODY)
    head = (f"POST /auth/nonce HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode()
    received = b""
    async with await trio.open_tcp_stream(host, int(port)) as stream:

        async def send() -> None:
            try:
                await stream.send_all(head + body)
            except trio.BrokenResourceError:
                pass  # the server stopped reading, as it may

        async with trio.open_nursery() as nursery:
            nursery.start_soon(send)
            with trio.fail_after(10):
                while not _complete(received):
                    chunk = await stream.receive_some(65536)
                    assert chunk, f"closed before a whole response: {received!r}"
                    received += chunk
            nursery.cancel_scope.cancel()
    status_line, _, rest = received.partition(b"\r\n")
    headers, _, payload = rest.partition(b"\r\n\r\n")
    assert status_line == b"HTTP/1.1 413 "
    assert b"connection: close" in headers.lower()
    assert json.loads(payload)["error"]["code"] == "payload_too_large"


def _complete(response: bytes) -> bool:
    """Whether ``response`` holds a whole HTTP/1.1 response with a Content-Length body."""
    head, separator, body = response.partition(b"\r\n\r\n")
    length = re.search(rb"(?im)^content-length: *(\d+)", head)
    return bool(separator and length and len(body) >= int(length.group(1)))


async def test_an_unexpected_exception_is_internal_without_details(
        http: httpx.AsyncClient, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.ERROR, logger="flowsvc.http"):
        response = await http.post("/testkit/boom", headers={"X-Request-Id": "req-boom-1"})
    message = _error(response, 500, "internal")
    assert "req-boom-1" in message
    assert SECRET_DETAIL not in response.text and "Traceback" not in response.text
    logged = [record for record in caplog.records if "req-boom-1" in record.getMessage()]
    assert len(logged) == 1 and logged[0].exc_info is not None
    assert SECRET_DETAIL in str(logged[0].exc_info[1])


async def test_request_id_is_echoed_when_valid_and_generated_otherwise(
        http: httpx.AsyncClient) -> None:
    echoed = await http.get("/healthz", headers={"X-Request-Id": "lb-7f3a.42:x_y-z"})
    assert echoed.headers["X-Request-Id"] == "lb-7f3a.42:x_y-z"
    generated = [(await http.get(path, headers=headers)).headers["X-Request-Id"]
                 for path, headers in [("/healthz", {}), ("/healthz", {"X-Request-Id": "a b"}),
                                       ("/healthz", {"X-Request-Id": "x" * 129}),
                                       ("/nowhere", {})]]
    assert all(re.fullmatch(r"[0-9a-f]{32}", request_id) for request_id in generated)
    assert len(set(generated)) == 4


async def test_access_log_has_one_structured_line_per_request(
        http: httpx.AsyncClient, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="flowsvc.access"):
        await http.get("/healthz", headers={"X-Request-Id": "acc-1"})
        await http.post("/auth/nonce", json={"address": ADDRESS}, headers={"X-Request-Id": "acc-2"})
        await http.get("/nowhere", headers={"X-Request-Id": "acc-3"})
    lines = [json.loads(record.getMessage()) for record in caplog.records
             if record.name == "flowsvc.access"]
    assert [(line["request_id"], line["method"], line["route"], line["status"]) for line in lines] \
        == [("acc-1", "GET", "/healthz", 200), ("acc-2", "POST", "/auth/nonce", 200),
            ("acc-3", "GET", "<unmatched>", 404)]
    assert all(line["ip"] == "127.0.0.1" and line["ms"] >= 0 for line in lines)
    assert lines[2]["path"] == "/nowhere"


async def test_healthz(http: httpx.AsyncClient) -> None:
    response = await http.get("/healthz")
    assert response.status_code == 200
    assert response.json() == {"status": "ok"}


async def test_readyz_checks_the_database_and_shared_state(
        tmp_path: Path, database_url: str, redis_url: str) -> None:
    env = settings_env(tmp_path / "var", database_url=database_url, redis_url=redis_url,
                       plugins=["auth", TESTKIT])
    async with running_server(make_settings(env), env) as served, client(served) as http:
        response = await http.get("/readyz")
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["status"] == "ready"
    shared = "redis" if redis_url else "shared"
    assert body["checks"]["database"] == body["checks"][shared] == {"ok": True}
    assert all(check["ok"] for check in body["checks"].values())  # plugins' checks too


async def test_readyz_is_503_when_a_check_fails(tmp_path: Path) -> None:
    env = _env(tmp_path, FLOWSVC_REDIS_URL=f"redis://127.0.0.1:{free_port()}/0",
               FLOWSVC_PLUGINS_ENABLED="[]")  # no plugin whose actors need Redis to start
    async with running_server(make_settings(env), env) as served, client(served) as http:
        ready = await http.get("/readyz")
        alive = await http.get("/healthz")
    assert ready.status_code == 503
    assert ready.json() == {
        "error": {"code": "unavailable", "message": "not ready: redis"},
        "status": "unavailable", "checks": {
            "database": {"ok": True}, "redis": {"ok": False, "error": "redis is unavailable"},
            "sandbox": {"ok": True, "commands": "available", "browser": "available",
                        "cgroups": cgroups_state()}}}
    assert alive.status_code == 200  # alive, just not ready


def _samples(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    return {(sample.name, frozenset(sample.labels.items())): sample.value
            for family in text_string_to_metric_families(text) for sample in family.samples}


async def test_metrics_count_requests_restarts_and_mailboxes(running: Running,
                                                             http: httpx.AsyncClient) -> None:
    for _ in range(3):
        await http.get("/healthz")
    await http.get("/nowhere")
    crashed = await http.post("/testkit/crash")
    assert "testkit.flaky crashed" in _error(crashed, 503, "unavailable")
    response = await http.get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    samples = _samples(response.text)

    def value(name: str, **labels: str) -> float | None:
        return samples.get((name, frozenset(labels.items())))

    assert value("flowsvc_http_requests_total", route="/healthz", method="GET", status="200") == 3
    assert value("flowsvc_http_requests_total", route="<unmatched>", method="GET",
                 status="404") == 1
    assert value("flowsvc_http_requests_total", route="/testkit/crash", method="POST",
                 status="503") == 1
    assert value("flowsvc_actor_restarts_total", actor="testkit.flaky") == 1
    assert running.service.supervisor is not None
    actors = running.service.supervisor.running()
    assert {"core.housekeeper", "testkit.flaky"} <= set(actors)
    for actor in actors:
        assert value("flowsvc_actor_mailbox_depth", actor=actor) == 0
    assert value("flowsvc_http_request_seconds_count", route="/healthz") == 3


async def test_openapi_documents_the_auth_routes_with_their_request_schemas(
        http: httpx.AsyncClient) -> None:
    response = await http.get("/openapi.json")
    assert response.status_code == 200
    document = response.json()
    assert document["openapi"].startswith("3.1")
    assert document["info"]["title"] == "flowsvc"
    paths = document["paths"]
    for path, fields in {"/auth/nonce": {"address"},
                         "/auth/verify": {"address", "message", "signature"},
                         "/auth/access-code": {"code"},
                         "/auth/messenger": {"initData"}}.items():
        schema = paths[path]["post"]["requestBody"]["content"]["application/json"]["schema"]
        assert fields <= set(schema["properties"])
        assert fields <= set(schema["required"])
    nonce = paths["/auth/nonce"]["post"]
    assert nonce["requestBody"]["content"]["application/json"]["schema"]["properties"][
        "address"]["pattern"] == "^0x[0-9a-fA-F]{40}$"
    assert "200" in nonce["responses"]
    assert "get" in paths["/me"]


async def test_docs_serve_a_page(http: httpx.AsyncClient) -> None:
    response = await http.get("/docs")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/html")
    assert "swagger-ui" in response.text and "/openapi.json" in response.text
