"""The HTTP front end: a quart-trio app factory, one blueprint per plugin.

Every request goes through the same steps: a request id; the caller, from the
``flowsvc_authenticate`` hooks; the ``flowsvc_before_request`` hooks (rate buckets,
spend caps); ``Idempotency-Key`` for writes; the route; ``flowsvc_after_request``; one
access-log line and the metrics. Every error leaves as ``{"error": {"code", "message"}}``.
"""

from __future__ import annotations

import ipaddress
import json
import logging
import re
import time
import uuid
from typing import Any, cast

from pydantic import ValidationError
from quart import Quart, Response, current_app, request
from quart_schema import QuartSchema, RequestSchemaValidationError
from quart_schema.openapi import Info
from quart_trio import QuartTrio
from werkzeug.exceptions import HTTPException

from runtime import idempotency, limits
from runtime.context import RequestContext, bind_context, current_context, find_context
from runtime.errors import (
    InternalError,
    InvalidRequest,
    MethodNotAllowed,
    NotFound,
    PayloadTooLarge,
    ServiceError,
    Unavailable,
)
from runtime.inputs import BoundedIntegerConverter, FlowsvcRequest
from runtime.principal import SESSION_COOKIE, Credentials
from runtime.service import Service, gather_hook
from runtime.shared import SharedState
from runtime.storage import Database

log = logging.getLogger("flowsvc.http")
access_log = logging.getLogger("flowsvc.access")
_VALID_REQUEST_ID = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")
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


def client_ip(trusted_proxies: list[str]) -> str:
    """The client's IP: the socket peer, or the right-most untrusted ``X-Forwarded-For`` hop
    when the peer is a configured trusted proxy."""
    peer = request.remote_addr or "unknown"
    if not trusted_proxies or not _in_networks(peer, trusted_proxies):
        return peer
    hops = [hop.strip() for hop in request.headers.get("X-Forwarded-For", "").split(",")]
    for hop in reversed([hop for hop in hops if hop]):
        if not _in_networks(hop, trusted_proxies):
            return hop
    return peer


def _in_networks(address: str, networks: list[str]) -> bool:
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return False
    return any(ip in ipaddress.ip_network(network, strict=False) for network in networks)


def _credentials() -> Credentials:
    bearer = None
    authorization = request.headers.get("Authorization", "")
    if authorization[:7].lower() == "bearer ":
        bearer = authorization[7:].strip() or None
    return Credentials(api_key=request.headers.get("x-api-key") or None, bearer=bearer,
                       session_cookie=request.cookies.get(SESSION_COOKIE) or None)


def _validation_details(error: ValidationError) -> list[dict[str, Any]]:
    return [{"field": ".".join(str(part) for part in item["loc"]) or "body",
             "message": item["msg"]} for item in error.errors()]


def _http_exception(exc: HTTPException) -> ServiceError:
    if exc.code == 404:
        return NotFound(f"no route for {request.method} {request.path}")
    if exc.code == 405:
        return MethodNotAllowed(f"{request.method} is not allowed on {request.path}")
    if exc.code == 413:
        # The rest of the body stays unread, so this connection cannot carry another request.
        return PayloadTooLarge(
            f"the request body is over {current_service().settings.service.max_body_bytes} bytes",
            headers={"Connection": "close"})
    if exc.code == 400:
        return InvalidRequest("the request body is not valid JSON")
    error = ServiceError(exc.description or "request failed")
    error.status = exc.code or 500  # type: ignore[misc]
    error.code = (exc.name or "error").lower().replace(" ", "_")  # type: ignore[misc]
    return error


def create_app(service: Service) -> Quart:
    """The app for ``service``; mounts the blueprints of every enabled plugin."""
    app = QuartTrio("flowsvc")
    app.request_class = FlowsvcRequest
    app.url_map.converters["int"] = BoundedIntegerConverter
    app.extensions["flowsvc"] = service
    app.config["MAX_CONTENT_LENGTH"] = service.settings.service.max_body_bytes
    app.config["QUART_SCHEMA_CONVERT_CASING"] = False
    QuartSchema(app, openapi_path="/openapi.json", swagger_ui_path="/docs", redoc_ui_path=None,
                scalar_ui_path=None, info=Info(title="flowsvc", version="0.1.0"))
    _install_pipeline(app, service)
    _install_error_handlers(app)
    _install_probes(app, service)
    for blueprints in reversed(service.pm.hook.flowsvc_blueprints(service=service)):
        for blueprint in blueprints or []:
            app.register_blueprint(blueprint)
    return app


def _install_pipeline(app: Quart, service: Service) -> None:
    settings = service.settings

    @app.before_request
    async def begin() -> Response | None:
        incoming = request.headers.get("X-Request-Id", "")
        context = RequestContext(
            incoming if _VALID_REQUEST_ID.match(incoming) else uuid.uuid4().hex,
            time.perf_counter(), client_ip(settings.service.trusted_proxies))
        bind_context(context)
        if "\x00" in request.path or b"%00" in request.query_string:
            # Nothing can be named with a NUL, and PostgreSQL cannot even compare one.
            raise InvalidRequest("the request path or query contains a NUL character")
        for principal in await gather_hook(service.pm.hook.flowsvc_authenticate,
                                           service=service, credentials=_credentials(),
                                           context=context):
            if principal is not None:
                context.principal = principal
                break
        await limits.check_request(service.shared, request.path, context.principal,
                                   context.client_ip, settings.internal.token, settings.limits)
        await gather_hook(service.pm.hook.flowsvc_before_request, service=service,
                          request=request, context=context)
        return await _idempotency_begin(service, context)

    @app.after_request
    async def finish(response: Response) -> Response:
        context = current_context()
        await _idempotency_finish(service, context, response)
        try:
            await gather_hook(service.pm.hook.flowsvc_after_request, service=service,
                              request=request, response=response, context=context)
        except Exception:  # after-request hooks must not turn a success into an error
            log.exception("after_request hook failed request_id=%s", context.request_id)
        response.headers["X-Request-Id"] = context.request_id
        route = request.url_rule.rule if request.url_rule else "<unmatched>"
        elapsed = time.perf_counter() - context.started
        principal = context.principal
        service.metrics.requests.labels(route, request.method, str(response.status_code)).inc()
        service.metrics.latency.labels(route).observe(elapsed)
        access_log.info(json.dumps({
            "request_id": context.request_id, "method": request.method, "route": route,
            "path": request.path, "status": response.status_code,
            "ms": round(elapsed * 1000, 2), "ip": context.client_ip,
            "user_id": principal.user_id if principal else None,
            "via": principal.via if principal else None}))
        return response


async def _idempotency_begin(service: Service, context: RequestContext) -> Response | None:
    key = request.headers.get(idempotency.HEADER)
    if key is None or request.method not in idempotency.WRITE_METHODS:
        return None
    key = idempotency.validate_key(key)
    principal = context.principal
    scope = f"user:{principal.user_id}" if principal else f"ip:{context.client_ip}"
    body = await request.get_data(cache=True)
    assert isinstance(body, bytes)
    print_ = idempotency.fingerprint(request.method, request.path, request.query_string, body)
    stored = await service.db.write(idempotency.claim, scope, key, print_,
                                    service.settings.limits.idempotency_hours)
    if stored is None:
        context.idempotency = (scope, key)
        return None
    response = Response(stored.body, status=stored.status, content_type=stored.content_type)
    response.headers[idempotency.REPLAYED_HEADER] = "true"
    return response


async def _idempotency_finish(service: Service, context: RequestContext,
                              response: Response) -> None:
    claimed, context.idempotency = context.idempotency, None
    if claimed is None:
        return
    body = await response.get_data()
    assert isinstance(body, bytes)
    stored = idempotency.StoredResponse(response.status_code, body, response.content_type)
    await service.db.write(idempotency.complete, *claimed, stored)


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
        return json_response({"status": "ok"})

    @app.get("/readyz")
    async def readyz() -> Response:
        checks: dict[str, Any] = {}
        ready = await _probe(checks, "database", service.db)
        ready = await _probe(checks, "redis" if service.shared.kind == "redis" else "shared",
                             service.shared) and ready
        for plugin_checks in service.pm.hook.flowsvc_readiness_checks(service=service):
            for check in plugin_checks or []:
                try:
                    checks[check.name] = {"ok": True, **(await check.check() or {})}
                except Exception as exc:
                    ready = False
                    checks[check.name] = {"ok": False, "error": str(exc)}
        supervisor = service.supervisor
        if supervisor is not None and supervisor.gave_up.is_set():
            ready = False
            checks["supervisor"] = {"ok": False, "error": supervisor.reason}
        if ready:
            return json_response({"status": "ready", "checks": checks})
        down = ", ".join(name for name, check in checks.items() if not check["ok"])
        body = Unavailable(f"not ready: {down}").body()
        return json_response({**body, "status": "unavailable", "checks": checks}, 503)

    @app.get("/metrics")
    async def metrics() -> Response:
        from runtime.metrics import CONTENT_TYPE

        return Response(service.metrics.render(), content_type=CONTENT_TYPE)


async def _probe(checks: dict[str, Any], name: str, target: Database | SharedState) -> bool:
    try:
        await target.ping()
    except Unavailable as exc:
        checks[name] = {"ok": False, "error": exc.message}
        return False
    except Exception as exc:
        checks[name] = {"ok": False, "error": type(exc).__name__}
        return False
    checks[name] = {"ok": True}
    return True
