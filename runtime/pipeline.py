"""The request pipeline: what every request goes through before and after its route.

In order: a request id; the caller, from the ``flowsvc_authenticate`` hooks; the
service-wide bucket (``runtime.limits``; an anonymous request may be claimed by a
``flowsvc_request_bucket`` hook); the ``flowsvc_before_request`` hooks (the key
meter); ``Idempotency-Key`` for writes; the route; ``flowsvc_after_request``; the metrics and
one access-log line. Every request pays this, so it is written for the CPU it costs
(``docs/performance.md`` has the profile): the headers it needs are read in one pass over
the raw ASGI headers, the request hooks call their implementations straight instead
of through pluggy's dispatch, metric children are looked up once per label set, and the
access line is formatted without ``json.dumps``.
"""

from __future__ import annotations

import inspect
import ipaddress
import itertools
import logging
import re
import secrets
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from json.encoder import encode_basestring
from typing import Any, cast

import pluggy
from quart import Response, request

from runtime import idempotency, limits
from runtime.config import ConfigError
from runtime.context import RequestContext, bind_context, current_context
from runtime.errors import InvalidRequest
from runtime.logs import access_writer
from runtime.principal import SESSION_COOKIE, Credentials
from runtime.service import Service

log = logging.getLogger("flowsvc.http")
access_log = logging.getLogger("flowsvc.access")
_VALID_REQUEST_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")
_COOKIE_PREFIX = SESSION_COOKIE + "="


class HookCalls:
    """One request hook's implementations, called straight, in pluggy's order.

    pluggy's dispatch costs more than most of these implementations do, on every request;
    these hooks take no wrappers (refused here), so a plain loop calls them the same way.
    Arguments are given by position, in the hookspec's order; an implementation that takes
    fewer gets its own. A result that is awaitable is awaited.

    :raises ConfigError: an implementation is a hook wrapper.
    """

    def __init__(self, caller: pluggy.HookCaller) -> None:
        spec = caller.spec
        assert spec is not None
        names = tuple(spec.argnames)
        self._calls: list[tuple[Callable[..., Any], tuple[int, ...] | None]] = []
        for implementation in reversed(caller.get_hookimpls()):
            if implementation.hookwrapper or implementation.wrapper:
                raise ConfigError(f"{implementation.plugin_name}: {caller.name} cannot be a "
                                  "hook wrapper")
            taken = tuple(implementation.argnames)
            positions = None if taken == names else tuple(names.index(name) for name in taken)
            self._calls.append((implementation.function, positions))

    def __bool__(self) -> bool:
        """Whether the hook has implementations (a request skips the call when not)."""
        return bool(self._calls)

    async def __call__(self, *arguments: Any) -> list[Any]:
        results = []
        for function, positions in self._calls:
            result = function(*arguments) if positions is None else \
                function(*[arguments[index] for index in positions])
            if result is not None and inspect.isawaitable(result):
                result = await result
            results.append(result)
        return results


@dataclass
class _Incoming:
    """The headers the pipeline reads, from one pass over the raw ASGI headers (a
    ``Headers.get`` of a missing header raises and catches an exception inside werkzeug)."""

    request_id: str = ""
    authorization: str = ""
    api_key: str = ""
    cookie: str = ""
    idempotency_key: str | None = None
    forwarded_for: str = ""


_WANTED = {b"x-request-id": "request_id", b"authorization": "authorization",
           b"x-api-key": "api_key", b"cookie": "cookie",
           b"idempotency-key": "idempotency_key", b"x-forwarded-for": "forwarded_for"}


def _incoming(raw_headers: Iterable[tuple[bytes, bytes]]) -> _Incoming:
    found = _Incoming()
    for name, value in raw_headers:
        field = _WANTED.get(name.lower())
        if field is not None:
            setattr(found, field, value.decode("latin-1"))
    return found


def _session_cookie(cookie_header: str) -> str | None:
    """The ``svc_session`` value of a ``Cookie`` header (the only cookie flowsvc reads)."""
    if _COOKIE_PREFIX not in cookie_header:
        return None
    for part in cookie_header.split(";"):
        part = part.strip()
        if part.startswith(_COOKIE_PREFIX):
            return part[len(_COOKIE_PREFIX):].strip('"') or None
    return None


def credentials_of(incoming: _Incoming) -> Credentials:
    bearer = None
    if incoming.authorization[:7].lower() == "bearer ":
        bearer = incoming.authorization[7:].strip() or None
    return Credentials(api_key=incoming.api_key or None, bearer=bearer,
                       session_cookie=_session_cookie(incoming.cookie))


def client_ip(peer: str, forwarded_for: str, trusted_proxies: list[str]) -> str:
    """The client's IP: the socket peer, or the right-most untrusted ``X-Forwarded-For`` hop
    when the peer is a configured trusted proxy."""
    if not trusted_proxies or not _in_networks(peer, trusted_proxies):
        return peer
    hops = [hop.strip() for hop in forwarded_for.split(",")]
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


def _current_request() -> Any:
    """The request object itself: one proxy lookup instead of one per attribute read."""
    return cast(Any, request)._get_current_object()


class Pipeline:
    """The before and after steps of every request of one service's app."""

    def __init__(self, service: Service) -> None:
        self._service = service
        self._settings = service.settings
        hooks = service.pm.hook
        self._authenticate = HookCalls(hooks.flowsvc_authenticate)
        self._before = HookCalls(hooks.flowsvc_before_request)
        self._after = HookCalls(hooks.flowsvc_after_request)
        self._claim_bucket = HookCalls(hooks.flowsvc_request_bucket)
        self._stats = service.metrics.requests
        self._access = access_writer(access_log)
        # 32 hex digits like a UUID, without os.urandom per request: a random prefix per
        # process and a counter.
        self._id_prefix = secrets.token_hex(12)
        self._ids = itertools.count(1)

    def _request_id(self, incoming: str) -> str:
        if incoming and _VALID_REQUEST_ID.fullmatch(incoming):
            return incoming
        return f"{self._id_prefix}{next(self._ids) & 0xFFFFFFFF:08x}"

    async def begin(self) -> Response | None:
        """Before the route: identify, count and check the request (a ``before_request``).

        :return: a stored response to replay (``Idempotency-Key``), or None to go on.
        """
        settings = self._settings
        current = _current_request()
        incoming = _incoming(current.scope["headers"])
        client = current.scope.get("client")
        context = RequestContext(
            self._request_id(incoming.request_id), time.perf_counter(),
            client_ip(client[0] if client else "unknown", incoming.forwarded_for,
                      settings.service.trusted_proxies))
        bind_context(context)
        if "\x00" in current.path or b"%00" in current.query_string:
            # Nothing can be named with a NUL, and PostgreSQL cannot even compare one.
            raise InvalidRequest("the request path or query contains a NUL character")
        service = self._service
        for principal in await self._authenticate(service, credentials_of(incoming), context):
            if principal is not None:
                context.principal = principal
                break
        claimed = None
        if context.principal is None and self._claim_bucket:
            claimed = next((bucket for bucket in await self._claim_bucket(
                service, current, context) if bucket is not None), None)
        await limits.check_request(service.shared, current.path, context.principal,
                                   context.client_ip, settings.internal.token, settings.limits,
                                   claimed)
        await self._before(service, current, context)
        if incoming.idempotency_key is None or current.method not in idempotency.WRITE_METHODS:
            return None
        return await self._idempotency_begin(incoming.idempotency_key, context)

    async def finish(self, response: Response) -> Response:
        """After the route: store the idempotent answer, run the after hooks, count and log
        the request (an ``after_request``)."""
        context = current_context()
        current = _current_request()
        if context.idempotency is not None:
            await self._idempotency_finish(context, response)
        try:
            await self._after(self._service, current, response, context)
        except Exception:  # after-request hooks must not turn a success into an error
            log.exception("after_request hook failed request_id=%s", context.request_id)
        response.headers["X-Request-Id"] = context.request_id
        if self._service.drain.draining:
            # The connection closes after this answer (runtime.drain): say so, or the client
            # may send its next request on it as it closes.
            response.headers["Connection"] = "close"
        rule = current.url_rule
        route = rule.rule if rule is not None else "<unmatched>"
        elapsed = time.perf_counter() - context.started
        status = response.status_code
        self._stats.observe(route, current.method, str(status), elapsed)
        if access_log.isEnabledFor(logging.INFO):
            self._access(self._access_line(context, current, route, status, elapsed))
        return response

    @staticmethod
    def _access_line(context: RequestContext, current: Any, route: str, status: int,
                     elapsed: float) -> str:
        """One JSON object per request; ``json.dumps`` costs more than the rest of it."""
        principal = context.principal
        user_id = principal.user_id if principal is not None else "null"
        via = f'"{principal.via}"' if principal is not None else "null"
        return (f'{{"request_id":"{context.request_id}","method":"{current.method}",'
                f'"route":{encode_basestring(route)},"path":{encode_basestring(current.path)},'
                f'"status":{status},"ms":{elapsed * 1000:.2f},'
                f'"ip":{encode_basestring(context.client_ip)},"user_id":{user_id},'
                f'"via":{via}}}')

    async def _idempotency_begin(self, key: str, context: RequestContext) -> Response | None:
        key = idempotency.validate_key(key)
        principal = context.principal
        scope = f"user:{principal.user_id}" if principal else f"ip:{context.client_ip}"
        body = await request.get_data(cache=True, as_text=False, parse_form_data=False)
        print_ = idempotency.fingerprint(request.method, request.path, request.query_string,
                                         body)
        stored = await self._service.db.write(idempotency.claim, scope, key, print_,
                                              self._settings.limits.idempotency_hours)
        if stored is None:
            context.idempotency = (scope, key)
            return None
        response = Response(stored.body, status=stored.status, content_type=stored.content_type)
        response.headers[idempotency.REPLAYED_HEADER] = "true"
        return response

    async def _idempotency_finish(self, context: RequestContext, response: Response) -> None:
        claimed, context.idempotency = context.idempotency, None
        assert claimed is not None
        body = await response.get_data()
        assert isinstance(body, bytes)
        stored = idempotency.StoredResponse(response.status_code, body, response.content_type)
        await self._service.db.write(idempotency.complete, *claimed, stored)
