"""The HTTP front end: a quart-trio app factory, one blueprint per plugin.

Every request goes through ``runtime.pipeline`` (request id, caller, buckets, hooks,
idempotency, metrics, access log). Every error leaves as ``{"error": {"code", "message"}}``.
"""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, cast

import trio
from flask.sansio.blueprints import Blueprint
from pydantic import ValidationError
from quart import Quart, Response, current_app, request
from quart_schema import QuartSchema, RequestSchemaValidationError
from quart_schema.openapi import Info
from quart_trio import QuartTrio
from werkzeug.exceptions import HTTPException

from runtime.context import find_context
from runtime.errors import (
    Draining,
    InternalError,
    InvalidRequest,
    MethodNotAllowed,
    NotFound,
    PayloadTooLarge,
    RequestTimeout,
    ServiceError,
    Unavailable,
)
from runtime.inputs import BoundedIntegerConverter, FlowsvcRequest
from runtime.openapi import ServiceOpenAPI, Success, answers
from runtime.openapi_docs import install_docs
from runtime.pipeline import Pipeline
from runtime.service import Service

log = logging.getLogger("flowsvc.http")
_HEALTHY = b'{"status":"ok"}'
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no",
               "Content-Type": "text/event-stream"}


def current_service() -> Service:
    """The service of the app handling the current request."""
    return cast(Service, current_app.extensions["flowsvc"])


def json_response(body: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    """A JSON response; bodies are built from plain dicts with wire-formatted values."""
    return Response(json.dumps(body, separators=(",", ":")), status=status,
                    headers=headers, content_type="application/json")


def error_response(error: ServiceError) -> Response:
    return json_response(error.body(), error.status, error.headers)


def _validation_details(error: ValidationError) -> list[dict[str, Any]]:
    return [{"field": ".".join(str(part) for part in item["loc"]) or "body",
             "message": item["msg"]} for item in error.errors()]


def _http_exception(exc: HTTPException) -> ServiceError:
    if exc.code == 404:
        return NotFound(f"no route for {request.method} {request.path}")
    if exc.code == 405:
        allowed = sorted(getattr(exc, "valid_methods", None) or [])
        return MethodNotAllowed(f"{request.method} is not allowed on {request.path}",
                                headers={"Allow": ", ".join(allowed)})
    if exc.code == 413:
        # The rest of the body stays unread, so this connection cannot carry another request.
        return PayloadTooLarge(
            f"the request body is over {current_service().settings.service.max_body_bytes} bytes",
            headers={"Connection": "close"})
    if exc.code == 400:
        return InvalidRequest("the request body is not valid JSON")
    if exc.code == 408:
        # The rest of the body may still be trickling in: this connection is done.
        return RequestTimeout(
            f"the request body did not arrive within "
            f"{current_service().settings.service.body_timeout_seconds:g} s",
            headers={"Connection": "close"})
    error = ServiceError(exc.description or "request failed")
    error.status = exc.code or 500  # type: ignore[misc]
    error.code = (exc.name or "error").lower().replace(" ", "_")  # type: ignore[misc]
    return error


def create_app(service: Service) -> Quart:
    """The app for ``service``; mounts the blueprints of every enabled plugin."""
    app = QuartTrio("flowsvc", static_folder=None)  # no /static route: nothing to serve
    # werkzeug answers a path with "//" by a redirect to the merged path on the request's
    # Host (a forged one included): here it is an unknown path, a 404.
    app.url_map.merge_slashes = False
    app.request_class = FlowsvcRequest
    app.url_map.converters["int"] = BoundedIntegerConverter
    app.extensions["flowsvc"] = service
    app.config["MAX_CONTENT_LENGTH"] = service.settings.service.max_body_bytes
    # The whole request body must arrive within this, however slowly it trickles (408).
    app.config["BODY_TIMEOUT"] = service.settings.service.body_timeout_seconds
    app.config["QUART_SCHEMA_CONVERT_CASING"] = False
    schema = QuartSchema(app, openapi_path=None, info=Info(title="flowsvc", version="0.1.0"),
                         openapi_provider_class=ServiceOpenAPI)
    install_docs(app, schema.openapi_provider, "flowsvc")
    # quart-schema wraps make_response to turn returned models into responses; every view
    # here returns a Response already, and the wrapper costs every request a conversion.
    del app.make_response
    pipeline = Pipeline(service)
    app.before_request(pipeline.begin)
    app.after_request(pipeline.finish)
    _install_error_handlers(app)
    _install_probes(app, service)
    for blueprints in reversed(service.pm.hook.flowsvc_blueprints(service=service)):
        for blueprint in blueprints or []:
            app.register_blueprint(blueprint)
    tags, descriptions = _plugin_tags(service, app.blueprints.values())
    cast(ServiceOpenAPI, schema.openapi_provider).bind(service, tags, descriptions)
    return app


def _plugin_tags(service: Service, blueprints: Iterable[Blueprint]
                 ) -> tuple[dict[str, str], dict[str, str]]:
    """The OpenAPI tag of each blueprint (by name): the plugin whose package defines it; and
    each plugin's description: its package's docstring."""
    packages = {getattr(plugin, "__name__", "").rpartition(".")[0]: name
                for name, plugin in service.pm.list_name_plugin()}
    tags: dict[str, str] = {}
    descriptions: dict[str, str] = {}
    for blueprint in blueprints:
        module = blueprint.import_name
        while module and module not in packages:
            module = module.rpartition(".")[0]
        if module:
            tags[blueprint.name] = packages[module]
            descriptions[packages[module]] = getattr(sys.modules.get(module), "__doc__", "")
    return tags, descriptions


def _install_error_handlers(app: Quart) -> None:
    @app.errorhandler(ServiceError)
    async def service_error(error: ServiceError) -> Response:
        return error_response(error)

    @app.errorhandler(RequestSchemaValidationError)
    async def schema_error(error: RequestSchemaValidationError) -> Response:
        cause = error.validation_error
        if isinstance(cause, ValidationError):
            details = _validation_details(cause)
            message = "; ".join(f"{d['field']}: {d['message']}" for d in details)
            return error_response(InvalidRequest(message, details=details))
        return error_response(InvalidRequest(f"invalid request: {cause}"))

    @app.errorhandler(HTTPException)
    async def http_error(error: HTTPException) -> Response:
        return error_response(_http_exception(error))

    @app.errorhandler(Exception)
    async def unexpected(error: Exception) -> Response:
        context = find_context()
        request_id = context.request_id if context is not None else "unknown"
        log.error("unhandled error request_id=%s", request_id, exc_info=error)
        return error_response(InternalError(f"internal error; quote request id {request_id}"))


def _install_probes(app: Quart, service: Service) -> None:
    @app.get("/healthz")
    async def healthz() -> Response:
        """Liveness: the process answers HTTP (no dependency is checked)."""
        return Response(_HEALTHY, content_type="application/json")

    @app.get("/readyz")
    async def readyz() -> Response:
        """Readiness: 200 when every dependency answers, else 503 naming those that do not.

        ``checks`` has one entry per dependency (database, Redis or the in-process shared
        state, each plugin's checks such as chain RPC endpoints) with ``ok`` and an ``error``,
        and the sandbox's offer (``runtime.sandbox``). The checks run at once, each within
        ``service.readiness_timeout_seconds``. A part of the service that is down (a plugin, one
        chain: ``part:<name>``) is listed with ``ok: false`` and makes the status ``degraded``,
        still 200: the rest serves, and every replica would report the same part, so a load
        balancer must not pull them all for it. A process shutting down answers 503
        ``draining`` at once, without checks (``runtime.drain``).
        """
        if service.drain.draining:
            draining = Draining("this process is shutting down")
            return json_response({**draining.body(), "status": "draining"}, 503,
                                 draining.headers)
        timeout = service.settings.service.readiness_timeout_seconds

        async def database() -> None:
            await service.db.ping(timeout=timeout)  # its own deadline: it shields its thread

        probes: list[tuple[str, Callable[[], Awaitable[dict[str, Any] | None]]]] = [
            ("database", database),
            ("redis" if service.shared.kind == "redis" else "shared", service.shared.ping)]
        for plugin_checks in service.pm.hook.flowsvc_readiness_checks(service=service):
            probes += [(check.name, check.check) for check in plugin_checks or []]
        results: dict[str, dict[str, Any]] = {}
        async with trio.open_nursery() as nursery:
            for name, probe in probes:
                nursery.start_soon(_probe, results, name, probe, timeout)
        checks = {name: results[name] for name, _ in probes}
        supervisor = service.supervisor
        if supervisor is not None and supervisor.gave_up.is_set():
            checks["supervisor"] = {"ok": False, "error": supervisor.reason}
        down = ", ".join(name for name, check in checks.items() if not check["ok"])
        checks["sandbox"] = service.sandbox.health()
        failed_parts = supervisor.failed_parts() if supervisor is not None else {}
        for part, reason in failed_parts.items():
            checks[f"part:{part}"] = {"ok": False, "error": f"down: {reason}"}
        if not down:
            return json_response({"status": "degraded" if failed_parts else "ready",
                                  "checks": checks})
        error = Unavailable(f"not ready: {down}")
        return json_response({**error.body(), "status": "unavailable", "checks": checks}, 503,
                             error.headers)

    @app.get("/metrics")
    @answers(Success(200, "text/plain", "the Prometheus text format"))
    async def metrics() -> Response:
        """Prometheus metrics of this process, in the text exposition format."""
        from runtime.metrics import CONTENT_TYPE

        return Response(service.metrics.render(), content_type=CONTENT_TYPE)


async def _probe(results: dict[str, dict[str, Any]], name: str,
                 probe: Callable[[], Awaitable[dict[str, Any] | None]], timeout: float) -> None:
    """Run one readiness check into ``results[name]``; no answer within ``timeout`` is a
    failure like an error (a hung dependency must not hang ``/readyz``)."""
    try:
        with trio.fail_after(timeout):
            details = await probe()
    except trio.TooSlowError:
        results[name] = {"ok": False, "error": f"no answer within {timeout:g} s"}
    except Unavailable as exc:
        results[name] = {"ok": False, "error": exc.message}
    except Exception as exc:
        results[name] = {"ok": False, "error": str(exc) or type(exc).__name__}
    else:
        results[name] = {"ok": True, **(details or {})}
