"""The OpenAPI document of a service with every built-in plugin, and the rules that build it
(runtime/openapi.py): tags, summaries, security, statuses with the error envelope, enums,
path templates."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from runtime.context import require_user
from runtime.errors import Conflict, NotFound
from runtime.openapi import SECURITY, plain_summary, read_view
from tests.support.server import client, make_settings, running_server, settings_env

PLUGINS = ["auth", "keys", "projects", "webhooks", "marketplace", "billing", "chain"]
COMMON_STATUSES = {"400", "401", "402", "429", "503"}
WRITE_STATUSES = {"409", "413", "422"}


async def _fetch_document(tmp_path: Path) -> tuple[dict[str, Any], dict[str, httpx.Response]]:
    env = settings_env(tmp_path / "var", database_url=f"sqlite:///{tmp_path / 'flowsvc.db'}",
                       plugins=PLUGINS)
    async with running_server(make_settings(env), env) as running, client(running) as http:
        document = (await http.get("/openapi.json")).json()
        answers = {"not allowed": await http.put("/me/api-keys", json={}),
                   "not JSON": await http.post("/auth/nonce", content=b"address=0x1",
                                               headers={"Content-Type": "text/plain"})}
    return document, answers


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory
           ) -> tuple[dict[str, Any], dict[str, httpx.Response]]:
    """The document, and answers to requests the document declares (one service start)."""
    return trio.run(_fetch_document, tmp_path_factory.mktemp("openapi"))


@pytest.fixture(scope="module")
def document(served: tuple[dict[str, Any], dict[str, httpx.Response]]) -> dict[str, Any]:
    return served[0]


def _operations(document: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    return [(method.upper(), path, operation)
            for path, operations in document["paths"].items()
            for method, operation in operations.items()]


def test_every_operation_has_its_plugins_tag_a_plain_one_line_summary_and_security(
        document: dict[str, Any]) -> None:
    operations = _operations(document)
    assert len(operations) > 50
    assert {tag["name"] for tag in document["tags"]} == {*PLUGINS, "service"}
    keys_tag = next(tag for tag in document["tags"] if tag["name"] == "keys")
    assert keys_tag["description"].startswith("API keys: `/me/api-keys`")
    assert set(document["components"]["securitySchemes"]) == {
        "sessionCookie", "bearer", "apiKey", "internalToken"}
    assert document["components"]["securitySchemes"]["apiKey"]["name"] == "x-api-key"
    for method, path, operation in operations:
        where = f"{method} {path}"
        assert len(operation["tags"]) == 1, where
        summary = operation["summary"]
        assert summary and "`" not in summary and "\n" not in summary, where
        assert summary.endswith((".", ")")), where  # a whole sentence, not a cut line
        assert operation["security"] in SECURITY.values() or operation["security"] == [], where
    by_route = {(method, path): operation for method, path, operation in operations}
    assert by_route["GET", "/healthz"]["security"] == []
    assert by_route["GET", "/me/api-keys"]["tags"] == ["keys"]
    assert by_route["GET", "/me/api-keys"]["security"] == SECURITY["user"]
    assert by_route["GET", "/marketplace/agents"]["security"] == SECURITY["optional"]
    assert by_route["GET", "/internal/tokens/{slug}"]["security"] == SECURITY["internal"]
    assert by_route["GET", "/readyz"]["summary"].startswith("Readiness")


def test_every_operation_declares_its_statuses_errors_with_the_envelope(
        document: dict[str, Any]) -> None:
    envelope = {"$ref": "#/components/schemas/Error"}
    assert document["components"]["schemas"]["Error"]["required"] == ["error"]
    for method, path, operation in _operations(document):
        where = f"{method} {path}"
        responses = operation["responses"]
        statuses = set(responses)
        assert any(status.startswith("2") for status in statuses), where
        assert COMMON_STATUSES <= statuses, where
        if method != "GET":
            assert WRITE_STATUSES <= statuses, where
        if "{" in path:
            assert "404" in statuses, where
        for status, response in responses.items():
            if int(status) >= 400:
                assert response["content"]["application/json"]["schema"] == envelope, where
                assert response["description"], where  # the codes answered
        assert "Retry-After" in responses["429"]["headers"], where
    by_route = {(method, path): operation for method, path, operation in _operations(document)}
    assert "204" in by_route["DELETE", "/me/api-keys/{key_id}"]["responses"]
    create_project = by_route["POST", "/projects"]["responses"]
    assert {"403", "404", "409"} <= set(create_project)
    assert "token_no_match" in create_project["403"]["description"]
    assert "text/event-stream" in by_route["GET", "/projects/{slug}/stream"]["responses"][
        "200"]["content"]


def test_enums_path_templates_and_bodies(document: dict[str, Any]) -> None:
    create = document["paths"]["/projects"]["post"]["requestBody"]
    assert create["required"] is True
    # publish reads an empty body as {} (document_request): its body is optional
    assert document["paths"]["/agents/{slug}/publish"]["post"]["requestBody"]["required"] is False
    assert document["paths"]["/me/api-keys/{key_id}"]["patch"]["requestBody"]["required"] is True
    template = create["content"]["application/json"]["schema"]["properties"]["agentTemplate"]
    assert template["enum"] == ["bot-builder", "content-machine", "fullstack-builder",
                                "research-agent"]
    assert create["content"]["application/json"]["schema"]["examples"][0]["tokenSlug"]
    for path in ("/auth/nonce", "/me/api-keys", "/me/webhooks", "/agents",
                 "/subscriptions/checkout"):  # the main bodies come with an example
        body = document["paths"][path]["post"]["requestBody"]["content"]["application/json"]
        assert body["schema"]["examples"], path
    checkout = document["paths"]["/subscriptions/checkout"]["post"]["requestBody"]
    tier = checkout["content"]["application/json"]["schema"]["properties"]["tier"]
    assert tier["enum"] == ["plus", "pro", "max"]
    assert "/projects/{path}" not in document["paths"]
    files = document["paths"]["/projects/{slug}/files/{path}"]["get"]
    assert {parameter["name"] for parameter in files["parameters"]} == {"slug", "path"}
    key_id = document["paths"]["/me/api-keys/{key_id}"]["delete"]["parameters"][0]
    assert key_id["schema"] == {"type": "integer", "minimum": 0, "maximum": 2**63 - 1}


def test_a_method_a_path_does_not_take_is_405_with_allow(
        served: tuple[dict[str, Any], dict[str, httpx.Response]]) -> None:
    answer = served[1]["not allowed"]
    assert answer.status_code == 405
    assert answer.json()["error"]["code"] == "method_not_allowed"
    assert {"GET", "POST"} <= {method.strip() for method in answer.headers["Allow"].split(",")}


def test_a_summary_is_the_first_sentence_in_plain_text() -> None:
    summary, description = plain_summary("""Revoke the ``key`` (204); see :func:`revoke`
        for what follows. It answers 401 from then on.

        A second paragraph with ``code``.""")
    assert summary == "Revoke the key (204); see revoke for what follows."
    assert description == "It answers 401 from then on.\n\nA second paragraph with `code`."
    assert plain_summary(None) == ("", "")


def _find_owned(slug: str) -> None:
    require_user()
    if slug == "taken":
        raise Conflict("taken")


async def _view(slug: str) -> None:
    _find_owned(slug)
    raise NotFound(slug)


def test_a_view_is_read_through_the_functions_it_calls() -> None:
    reading = read_view(_view)
    assert reading.caller == "user"
    assert reading.errors >= {Conflict, NotFound}


def test_a_body_that_is_not_json_is_415_as_declared(
        served: tuple[dict[str, Any], dict[str, httpx.Response]]) -> None:
    document, answers = served
    answer = answers["not JSON"]
    assert answer.status_code == 415
    assert answer.json()["error"]["code"] == "unsupported_media_type"
    assert "unsupported_media_type" in \
        document["paths"]["/auth/nonce"]["post"]["responses"]["415"]["description"]
