"""Hostile input never gets a 500: bodies, nesting, NULs, ids, text (runtime.inputs)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, get_args

import httpx
import pytest
from pydantic import BaseModel, RootModel, ValidationError
from quart_schema.validation import QUART_SCHEMA_REQUEST_ATTRIBUTE

from runtime.http import create_app
from runtime.inputs import MAX_DEPTH, Body, check_visible
from runtime.server import Running
from tests.support.background import shared_service_fixture
from tests.support.keys import create_key
from tests.support.server import client, make_settings, running_server, settings_env
from tests.support.wallet import sign_in

JSON = {"content-type": "application/json"}
EVERY_PLUGIN = ["auth", "keys", "projects", "webhooks", "marketplace", "billing", "chain"]
ADDRESS = "0x" + "ab" * 20


# One service per database backend for the module: these tests only send requests, as
# nobody or each as a new user (a fresh wallet), so none depends on the rows of another,
# and a start each cost more than the requests themselves.
running = shared_service_fixture(["auth", "keys"])


@pytest.fixture
async def http(running: Running) -> AsyncIterator[httpx.AsyncClient]:
    async with client(running) as session:
        yield session


def _assert_invalid(response: httpx.Response, words: str) -> None:
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["code"] == "invalid_request"
    assert words in error["message"]


@pytest.mark.parametrize(("body", "words"), [
    (b'{"address": "\xff\xfe"}', "not valid UTF-8"),
    ('{"address": "x"}'.encode("utf-16"), "without a byte order mark"),
    ('{"address": "x"}'.encode("utf-16-le"), "without a byte order mark"),
    (b'\xef\xbb\xbf{"address": "x"}', "without a byte order mark"),
    (b"[" * 1000 + b"]" * 1000, "nested more than"),
    (b'{"a":' * 70 + b"1" + b"}" * 70, "nested more than"),
    (b'{"address": NaN}', "NaN"),
    (b'{"address": -Infinity}', "-Infinity"),
    (b'{"address": "0x\\u0000ab"}', "address contains a NUL character"),
    (b'{"\\u0000": 1}', "a key of body contains a NUL character"),
    (b'{"address": ', "not valid JSON"),
], ids=["latin1", "utf16-bom", "utf16-no-bom", "utf8-bom", "deep-arrays", "deep-objects", "nan",
        "infinity", "nul-value", "nul-key", "truncated"])
async def test_a_body_the_service_cannot_read_is_a_400_before_anything_else(
        http: httpx.AsyncClient, body: bytes, words: str) -> None:
    _assert_invalid(await http.post("/auth/nonce", content=body, headers=JSON), words)


async def test_a_body_at_the_nesting_limit_is_read(http: httpx.AsyncClient) -> None:
    nested: object = ADDRESS
    for _ in range(MAX_DEPTH - 1):
        nested = [nested]
    response = await http.post("/auth/nonce", json={"address": nested})
    _assert_invalid(response, "address")  # refused by the schema, not by the reader


async def test_nul_in_a_path_or_query_is_a_400(http: httpx.AsyncClient) -> None:
    _assert_invalid(await http.get("/me/api-keys/1%00/usage"), "NUL")
    _assert_invalid(await http.get("/me/api-keys?cursor=a%00b"), "NUL")


async def test_an_id_that_cannot_exist_is_a_404(http: httpx.AsyncClient) -> None:
    await sign_in(http)
    for key_id in (2**63, 2**64 + 5, 10**40):
        for method, path in (("PATCH", f"/me/api-keys/{key_id}"),
                             ("DELETE", f"/me/api-keys/{key_id}"),
                             ("GET", f"/me/api-keys/{key_id}/usage")):
            response = await http.request(method, path, json={} if method == "PATCH" else None)
            assert response.status_code == 404, (method, path, response.text)
            assert response.json()["error"]["code"] == "not_found"
    largest = await http.get(f"/me/api-keys/{2**63 - 1}/usage")
    assert largest.status_code == 404 and "no API key" in largest.json()["error"]["message"]


async def test_key_names_people_cannot_read_are_refused(http: httpx.AsyncClient) -> None:
    await sign_in(http)
    for name in ("\u200b\u200b", "\u3164", "admin\u202etxt.exe", "a\x07b", "\u2066x\u2069"):
        response = await http.post("/me/api-keys", json={"name": name})
        _assert_invalid(response, "name")
        assert response.json()["error"]["details"][0]["field"] == "name"
    assert (await create_key(http, name="Déploiement 🚀"))["name"] == "Déploiement 🚀"


@pytest.mark.parametrize("value", ["١٢٣", "1_000", "１２", "٣.5", "0x10", "5.5.5"])
async def test_spend_limits_take_plain_ascii_decimals_only(http: httpx.AsyncClient,
                                                           value: str) -> None:
    await sign_in(http)
    response = await http.post("/me/api-keys", json={"name": "k", "spend_limit_flow": value})
    _assert_invalid(response, "spend_limit_flow")


async def test_a_cursor_that_is_not_ours_is_a_400(http: httpx.AsyncClient) -> None:
    await sign_in(http)
    for cursor in ("é", "\u0100\u0101", "%%%", "a" * 5000):
        response = await http.get("/me/api-keys", params={"cursor": cursor})
        _assert_invalid(response, "cursor")


async def test_exact_amounts_keep_their_decimals(http: httpx.AsyncClient) -> None:
    await sign_in(http)
    body = b'{"name": "exact", "spend_limit_flow": 0.1234567}'
    _assert_invalid(await http.post("/me/api-keys", content=body, headers=JSON), "6 decimals")
    created = await http.post("/me/api-keys", content=json.dumps(
        {"name": "exact", "spend_limit_flow": "12.5"}), headers=JSON)
    assert created.json()["key"]["spend_limit_flow"] == "12.500000"


@pytest.mark.parametrize(("value", "multiline", "ok"), [
    ("Pizza bot", False, True), ("naïve café", False, True), ("日本語", False, True),
    ("line\nbreak", True, True), ("line\nbreak", False, False), ("", False, False),
    ("\u200d", False, False), ("\u2800\u2800", False, False), ("\u0301", False, False),
    ("ok\u202e", True, False), ("x\x1b[31m", True, False),
])
def test_check_visible(value: str, multiline: bool, ok: bool) -> None:
    if ok:
        assert check_visible(value, multiline=multiline) == value
    else:
        with pytest.raises(ValueError):
            check_visible(value, multiline=multiline)


async def test_an_unknown_body_field_is_refused_by_name(http: httpx.AsyncClient) -> None:
    response = await http.post("/auth/nonce", json={"address": ADDRESS, "adress": ADDRESS})
    _assert_invalid(response, "adress")
    assert response.json()["error"]["details"] == [
        {"field": "adress", "message": "Extra inputs are not permitted"}]


async def test_an_id_in_other_digits_is_a_404_not_another_id(http: httpx.AsyncClient) -> None:
    await sign_in(http)
    key = await create_key(http, name="twelve")
    ascii_id = key["id"].removeprefix("k")
    assert (await http.get(f"/me/api-keys/{ascii_id}/usage")).status_code == 200
    # Arabic-Indic, fullwidth and Devanagari digits: int() reads each as the ASCII one.
    for script in ("٠١٢٣٤٥٦٧٨٩", "０１２３４５６７８９", "०१२३४५६७८९"):
        other = "".join(script[int(digit)] for digit in ascii_id)
        for method, path in (("GET", f"/me/api-keys/{other}/usage"),
                             ("PATCH", f"/me/api-keys/{other}"),
                             ("DELETE", f"/me/api-keys/{other}")):
            response = await http.request(method, path,
                                          json={"name": "x"} if method == "PATCH" else None)
            assert response.status_code == 404, (path, response.text)
            assert response.json()["error"]["code"] == "not_found"
    assert (await http.get("/me/api-keys")).json()["keys"][0]["name"] == "twelve"  # untouched


# JSON values of each JSON Schema type, sent to a field that does not take that type.
_PROBES: dict[str, tuple[object, ...]] = {
    "boolean": (True, False), "integer": (0, 1), "number": (1.5,), "string": ("1", "yes"),
    "array": ([],), "object": ({},), "null": (None,)}


def _json_types(schema: dict[str, Any]) -> set[str]:
    """The JSON types a field's schema admits (empty: any value, such as ``Any``)."""
    if "$ref" in schema:
        return {"object"}
    types: set[str] = set()
    for option in schema.get("anyOf", []) + schema.get("oneOf", []):
        types |= _json_types(option)
    declared = schema.get("type", [])
    types |= {declared} if isinstance(declared, str) else set(declared)
    return types | ({"integer"} if "number" in types else set())


def _body_models(running: Running) -> set[type[BaseModel]]:
    """Every request body model of every route, and the models nested in them."""
    app = create_app(running.service)
    found: set[type[BaseModel]] = set()
    pending = [getattr(view, QUART_SCHEMA_REQUEST_ATTRIBUTE)[0]
               for view in app.view_functions.values()
               if hasattr(view, QUART_SCHEMA_REQUEST_ATTRIBUTE)]
    while pending:
        model = pending.pop()
        if model in found:
            continue
        found.add(model)
        for field in model.model_fields.values():
            pending.extend(nested for nested in _annotation_types(field.annotation)
                           if isinstance(nested, type) and issubclass(nested, BaseModel))
    return found


def _annotation_types(annotation: object) -> list[object]:
    return [annotation, *(inner for argument in get_args(annotation)
                          for inner in _annotation_types(argument))]


async def test_every_body_model_of_every_plugin_is_strict(tmp_path: Path) -> None:
    """A boolean field takes no 0 or "yes", an integer no true or "1", a string no number:
    for every field of every body model, each JSON type its schema does not name fails."""
    env = settings_env(tmp_path / "var", database_url=f"sqlite:///{tmp_path / 'flowsvc.db'}",
                       plugins=EVERY_PLUGIN)
    async with running_server(make_settings(env), env) as running:
        models = _body_models(running)
    names = {model.__name__ for model in models}
    assert {"PublishRequest", "ClockRequest", "TokenBody", "CreateKey", "RecoverRequest",
            "CreateProjectRequest", "ToolPriceEntry", "NonceRequest"} <= names, names
    lax = []
    for model in models:
        if issubclass(model, RootModel):
            continue  # a list of models: its items are walked
        assert issubclass(model, Body), f"{model.__name__} is not a runtime.inputs.Body"
        properties = model.model_json_schema()["properties"]
        for name, schema in properties.items():
            admitted = _json_types(schema)
            for json_type, probes in _PROBES.items():
                if not admitted or json_type in admitted:
                    continue
                for probe in probes:
                    try:
                        model.model_validate({name: probe})
                    except ValidationError as exc:
                        if any(error["loc"][:1] == (name,) for error in exc.errors()):
                            continue
                    lax.append(f"{model.__name__}.{name} takes {probe!r}")
    assert not lax, lax
