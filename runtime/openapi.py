"""The OpenAPI document of ``/openapi.json``, completed by central rules.

quart-schema builds the paths from the routes (their bodies, queries and success models);
``ServiceOpenAPI`` then gives every operation:

- one tag, the plugin whose blueprint holds the route (``service`` for the runtime's own);
- a one-line plain-text summary, the first sentence of the view's docstring, and the rest
  as the description;
- its security, from what the view calls: ``require_user`` (a session cookie, a bearer
  token or an API key), ``require_internal`` (the internal token), otherwise credentials
  are optional;
- every status it can answer. Each error status carries the error envelope
  (``#/components/schemas/Error``) and lists its codes. Some statuses come with every
  request (``COMMON``: bad input, bad credentials, the spend cap, limits, outages), some
  with what the route takes (a path id: 404; a write: 413 and the ``Idempotency-Key``
  answers; a JSON body: 415), the rest from the ``ServiceError`` classes the view's code
  names, followed through the module-level functions it calls. ``answers`` declares,
  next to a route, what that reading cannot see (an error raised in a method of some
  object, a success without a JSON model such as 204 or a stream).

Fields whose values the service decides at start (``DYNAMIC_ENUMS``) become enums of
those values. The document is built once per app and cached.
"""

from __future__ import annotations

import copy
import dis
import functools
import inspect
import re
import types
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

from quart import Quart
from quart_schema import QuartSchema
from quart_schema.openapi import OpenAPIProvider
from quart_schema.validation import QUART_SCHEMA_REQUEST_ATTRIBUTE, validate_request
from werkzeug.routing.rules import Rule

from runtime import errors
from runtime.errors import ServiceError
from runtime.idempotency import WRITE_METHODS
from runtime.inputs import MAX_ID
from runtime.principal import SESSION_COOKIE
from runtime.service import Service

View = TypeVar("View", bound=Callable[..., Any])
Caller = Literal["user", "internal", "optional"]

_ANSWERS_ATTRIBUTE = "_flowsvc_answers"
# werkzeug's rule syntax: <name> or <converter:name> (quart-schema's own pattern takes
# "<slug>/files/<path:path>" for one parameter named "path").
_PATH_PARAMETER = re.compile(r"<(?:[^<>:]*:)?([^<>]+)>")
_ROLE = re.compile(r":[a-z]+:`([^`]*)`")  # reST roles (:func:`x`) before plain backticks
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z(`])")

ERROR_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["error"],
    "properties": {"error": {
        "type": "object",
        "required": ["code", "message"],
        "properties": {
            "code": {"type": "string", "description": "stable snake_case code (docs/errors.md)"},
            "message": {"type": "string"},
            "details": {"type": "array", "items": {
                "type": "object", "required": ["field", "message"],
                "properties": {"field": {"type": "string"}, "message": {"type": "string"}}}},
        },
    }},
}

SECURITY_SCHEMES: dict[str, dict[str, Any]] = {
    "sessionCookie": {"type": "apiKey", "in": "cookie", "name": SESSION_COOKIE,
                      "description": "the session cookie set by the sign-in routes"},
    "bearer": {"type": "http", "scheme": "bearer",
               "description": "a session token (the sign-in answer's JWT) or an API key"},
    "apiKey": {"type": "apiKey", "in": "header", "name": "x-api-key",
               "description": "an API key (sk_live_...) from POST /me/api-keys"},
    "internalToken": {"type": "http", "scheme": "bearer",
                      "description": "the internal token ([internal] token) of operators"},
}
_USER: list[dict[str, list[str]]] = [{"sessionCookie": []}, {"bearer": []}, {"apiKey": []}]
SECURITY: dict[Caller, list[dict[str, list[str]]]] = {
    "user": _USER, "internal": [{"internalToken": []}], "optional": [{}, *_USER]}

# What any request can be answered, whatever its route: bad input (a NUL in the path or
# query, a bad Idempotency-Key), credentials that were sent but are not valid, an API key
# over its spend cap or rate, the service-wide buckets, a dependency down.
COMMON: tuple[type[ServiceError], ...] = (
    errors.InvalidRequest, errors.Unauthenticated, errors.SpendCapReached, errors.RateLimited,
    errors.Unavailable)
# What a write can be answered: a body over the limit, Idempotency-Key conflicts.
WRITES: tuple[type[ServiceError], ...] = (
    errors.PayloadTooLarge, errors.IdempotencyInProgress, errors.IdempotencyKeyReused)
# What a route that reads a JSON body can be answered besides: a body of another type.
BODIES: tuple[type[ServiceError], ...] = (errors.UnsupportedMediaType,)
_RETRY_AFTER = {"Retry-After": {"description": "seconds to wait before trying again",
                                "required": True, "schema": {"type": "string"}}}
_RESPONSE_HEADERS: dict[int, dict[str, Any]] = {429: _RETRY_AFTER, 503: _RETRY_AFTER}
# The runtime's probes: for load balancers and monitoring, no credentials.
_PROBES = frozenset({"healthz", "readyz", "metrics"})
SERVICE_TAG = "service"  # the tag of the runtime's own routes
_SERVICE_DESCRIPTION = "The service's own routes: health, readiness and metrics."
_SUCCESS_DESCRIPTIONS = {200: "OK", 201: "Created", 202: "Accepted", 204: "No Content"}


def _agent_templates(service: Service) -> list[str]:
    return sorted(service.templates)


# Body and query fields whose allowed values come from the enabled plugins.
DYNAMIC_ENUMS: dict[str, Callable[[Service], list[str]]] = {"agentTemplate": _agent_templates}


@dataclass(frozen=True)
class Success:
    """A success ``status`` answered without a JSON model (``media_type`` None: no body)."""

    status: int
    media_type: str | None = None
    description: str = ""


def answers(*outcomes: type[ServiceError] | Success) -> Callable[[View], View]:
    """Declare, next to a route, answers its code does not name where ``ServiceOpenAPI``
    can follow it: errors raised by methods of other objects, successes without a model.

    ``@answers(PrivateForbidden, Success(200, "text/event-stream"))``
    """

    def declare(view: View) -> View:
        setattr(view, _ANSWERS_ATTRIBUTE, (*getattr(view, _ANSWERS_ATTRIBUTE, ()), *outcomes))
        return view

    return declare


@dataclass
class _Reading:
    """What the code reachable from a view names."""

    caller: Caller = "optional"
    errors: frozenset[type[ServiceError]] = frozenset()


def _own_module(function: types.FunctionType, packages: tuple[str, ...]) -> bool:
    return function.__module__.split(".")[0] in packages


def _functions_within(function: types.FunctionType) -> Iterator[object]:
    """What a function can reach: the globals its code (and nested code) loads, the
    attributes it reads from modules, the functions it wraps or closes over."""
    codes = [function.__code__]
    while codes:
        code = codes.pop()
        codes.extend(const for const in code.co_consts if isinstance(const, types.CodeType))
        loaded: object = None
        for instruction in dis.get_instructions(code):
            if instruction.opname in ("LOAD_GLOBAL", "LOAD_NAME"):
                loaded = function.__globals__.get(str(instruction.argval))
                yield loaded
            elif instruction.opname in ("LOAD_ATTR", "LOAD_METHOD") and \
                    isinstance(loaded, types.ModuleType):
                loaded = getattr(loaded, str(instruction.argval), None)
                yield loaded
            else:
                loaded = None
    yield getattr(function, "__wrapped__", None)
    for cell in function.__closure__ or ():
        try:
            yield cell.cell_contents
        except ValueError:  # an empty cell
            continue


@functools.cache
def _reachable(function: types.FunctionType) -> tuple[object, ...]:
    """``_functions_within``, read once per function: views share most of their helpers
    (reading bytecode is most of the document's cost)."""
    return tuple(_functions_within(function))


def read_view(view: Callable[..., Any]) -> _Reading:
    """The caller a view requires and the errors its code names, following the functions of
    the project (``runtime`` and the view's own top package) it calls."""
    from runtime.context import require_internal, require_user

    packages = ("runtime", view.__module__.split(".")[0])
    reading = _Reading()
    found: set[type[ServiceError]] = set()
    seen: set[int] = set()
    pending: list[object] = [view]
    while pending:
        item = pending.pop()
        if item is require_user:
            reading.caller = "user"
        elif item is require_internal and reading.caller != "user":
            reading.caller = "internal"
        elif isinstance(item, type) and issubclass(item, ServiceError) and \
                item is not ServiceError:
            found.add(item)
        elif isinstance(item, types.FunctionType) and id(item) not in seen and \
                _own_module(item, packages):
            seen.add(id(item))
            pending.extend(_reachable(item))
    # An InternalError is what the service answers for a bug: never part of the contract.
    reading.errors = frozenset(found - {errors.InternalError})
    return reading


def plain_summary(docstring: str | None) -> tuple[str, str]:
    """The first sentence of ``docstring`` as one line of plain text, and the rest as
    Markdown (reST double backticks become single ones)."""
    paragraphs = _paragraphs(docstring)
    if not paragraphs:
        return "", ""
    first, *rest = _SENTENCE_END.split(paragraphs[0], maxsplit=1)
    summary = _ROLE.sub(r"\1", first).replace("``", "").replace("`", "").strip()
    return summary, _markdown("\n\n".join([*rest, *paragraphs[1:]]))


def _paragraphs(docstring: str | None) -> list[str]:
    """The paragraphs of a docstring, each on one line."""
    text = inspect.cleandoc(docstring or "")
    return [" ".join(part.split()) for part in re.split(r"\n\s*\n", text) if part.strip()]


def _first_paragraph(docstring: str | None) -> str:
    return next(iter(_paragraphs(docstring)), "")


def _markdown(text: str) -> str:
    """reST inline markup as Markdown: roles and double backticks become code spans."""
    return _ROLE.sub(r"`\1`", text).replace("``", "`")


def _body_required(view: Callable[..., Any]) -> bool:
    """Whether a request must carry a body: always under ``validate_request`` (it refuses a
    missing body); under ``document_request`` (the view reads the body itself, an empty one
    as ``{}``) when the model refuses ``{}``."""
    function: Any = view
    while function is not None:
        if function.__code__.co_qualname.startswith(f"{validate_request.__name__}."):
            return True
        function = getattr(function, "__wrapped__", None)
    model = getattr(view, QUART_SCHEMA_REQUEST_ATTRIBUTE)[0]
    try:
        model.model_validate({})
    except ValueError:  # pydantic's ValidationError, or a validator's own
        return True
    return False


def _error_response(status: int, codes: set[str]) -> dict[str, Any]:
    response: dict[str, Any] = {
        "description": ", ".join(sorted(codes)),
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}},
    }
    if status in _RESPONSE_HEADERS:
        response["headers"] = _RESPONSE_HEADERS[status]
    return response


def _success_response(success: Success) -> dict[str, Any]:
    response: dict[str, Any] = {
        "description": success.description or _SUCCESS_DESCRIPTIONS.get(success.status, "")}
    if success.media_type is not None:
        response["content"] = {success.media_type: {"schema": {}}}
    return response


class ServiceOpenAPI(OpenAPIProvider):
    """quart-schema's provider with the rules of this module; needs ``bind`` before use."""

    def __init__(self, app: Quart, extension: QuartSchema) -> None:
        super().__init__(app, extension)
        self._service: Service | None = None
        self._tags: dict[str, str] = {}
        self._tag_descriptions: dict[str, str] = {}
        self._document: dict[str, Any] | None = None

    def bind(self, service: Service, blueprint_tags: dict[str, str],
             tag_descriptions: dict[str, str]) -> None:
        """Use ``service`` for dynamic enums, tag each blueprint (by name) as given and
        describe each tag with its docstring."""
        self._service = service
        self._tags = blueprint_tags
        self._tag_descriptions = {tag: _markdown(_first_paragraph(doc))
                                  for tag, doc in tag_descriptions.items()}

    def schema(self) -> dict[str, Any]:
        if self._document is None:
            document = super().schema()
            document["components"]["schemas"]["Error"] = ERROR_SCHEMA
            document["components"]["securitySchemes"] = SECURITY_SCHEMES
            used = sorted({tag for operations in document["paths"].values()
                           for operation in operations.values()
                           for tag in operation.get("tags", [])})
            document["tags"] = [{"name": tag, "description": self._tag_descriptions.get(
                tag, _SERVICE_DESCRIPTION)}
                for tag in used]
            for operations in document["paths"].values():
                for operation in operations.values():
                    self._fill_enums([operation["parameters"], operation.get("requestBody")])
            self._document = document
        return self._document

    def build_paths(self, rule: Rule) -> tuple[dict[str, Any], dict[str, Any]]:
        built, components = super().build_paths(rule)
        view = self._app.view_functions[rule.endpoint]
        reading = read_view(view)
        declared: tuple[type[ServiceError] | Success, ...] = getattr(view, _ANSWERS_ATTRIBUTE, ())
        summary, description = plain_summary(view.__doc__)
        blueprint = rule.endpoint.rpartition(".")[0]
        path = _PATH_PARAMETER.sub(r"{\1}", rule.rule)
        operations: dict[str, Any] = {}
        for method, shared in next(iter(built.values())).items():
            operation = copy.deepcopy(shared)
            operation["summary"] = summary
            operation["description"] = description
            operation["tags"] = [self._tags.get(blueprint, SERVICE_TAG)]
            operation["security"] = [] if rule.endpoint in _PROBES else SECURITY[reading.caller]
            if "requestBody" in operation:
                operation["requestBody"]["required"] = _body_required(view)
            for parameter in operation["parameters"]:
                if parameter["in"] == "path" and parameter["schema"].get("type") == "integer":
                    parameter["schema"].update(minimum=0, maximum=MAX_ID)
            self._add_responses(operation, method.upper(), rule, reading, declared)
            operations[method] = operation
        return {path: operations}, components

    def _add_responses(self, operation: dict[str, Any], method: str, rule: Rule,
                       reading: _Reading, declared: tuple[type[ServiceError] | Success, ...]
                       ) -> None:
        raised = set(reading.errors) | set(COMMON)
        if method in WRITE_METHODS:
            raised |= set(WRITES)
        if "requestBody" in operation:
            raised |= set(BODIES)
        if rule.arguments:
            raised.add(errors.NotFound)
        responses = operation["responses"] = {
            str(status): response for status, response in operation["responses"].items()}
        for outcome in declared:
            if isinstance(outcome, Success):
                responses[str(outcome.status)] = _success_response(outcome)
            else:
                raised.add(outcome)
        if not any(status.startswith("2") for status in map(str, responses)):
            responses["200"] = _success_response(Success(200, "application/json"))
        codes: dict[int, set[str]] = {}
        for error in raised:
            codes.setdefault(error.status, set()).add(error.code)
        for status in sorted(codes):
            responses[str(status)] = _error_response(status, codes[status])

    def _fill_enums(self, inputs: list[Any]) -> None:
        """Give the fields of ``DYNAMIC_ENUMS`` in these request parts their values (the
        answers keep plain strings: a stored value may predate a plugin's removal)."""
        assert self._service is not None, "ServiceOpenAPI.bind was not called"
        values = {name: sorted(find(self._service)) for name, find in DYNAMIC_ENUMS.items()}

        def fill(name: Any, schema: Any) -> None:
            if isinstance(name, str) and name in values and isinstance(schema, dict) \
                    and schema.get("type") == "string":
                schema["enum"] = values[name]

        def visit(node: Any) -> None:
            if isinstance(node, dict):
                fill(node.get("name"), node.get("schema"))  # a query parameter
                for name, schema in node.get("properties", {}).items():
                    fill(name, schema)
                for child in node.values():
                    visit(child)
            elif isinstance(node, list):
                for child in node:
                    visit(child)

        visit(inputs)
