"""What the keys plugin does to every request: authenticate, meter, add headers, log.

``x-api-key`` wins over every other credential; a bearer token that starts with
``sk_live_`` is a key too. A malformed, unknown or revoked key is a 401 even when a valid
session or bearer token comes with it. An admitted key request carries the ``X-FLOW-*``
headers (and ``X-RateLimit-*`` when the key has a cap); refused ones carry them too.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable
from dataclasses import dataclass, replace
from datetime import UTC, datetime

from quart import Request, Response

from plugins.keys.directory import KeyDirectory, Miss
from plugins.keys.errors import ApiKeyInvalid, ApiKeyRevoked
from plugins.keys.meter import Admission, admission_of
from plugins.keys.metering import ADMIT, REFUND, MeterItem, item_for
from plugins.keys.records import KEY_PREFIX, RAW_KEY, KeyRecord, hash_key
from plugins.keys.state import KEYS, KeysState
from plugins.keys.usage import UsageEntry
from runtime.context import RequestContext, RequestSlot
from runtime.principal import Credentials, Principal
from runtime.service import Service
from runtime.wire import utcnow

log = logging.getLogger("flowsvc.keys")
COST_CACHE_SECONDS = 1.0


@dataclass
class KeyCall:
    """The key of the request being handled and, once metered, the meter's decision."""

    record: KeyRecord
    admission: Admission | None = None


KEY_CALL: RequestSlot[KeyCall] = RequestSlot("keys.call")
""":class:`KeyCall` of a request that presented a key (set by ``authenticate``)."""


def raw_key_of(credentials: Credentials) -> str | None:
    """The raw key a request presents: ``x-api-key``, else a ``Bearer sk_live_...``."""
    if credentials.api_key is not None:
        return credentials.api_key
    if credentials.bearer is not None and credentials.bearer.startswith(KEY_PREFIX):
        return credentials.bearer
    return None


def authenticate(service: Service, credentials: Credentials, context: RequestContext
                 ) -> Principal | None | Awaitable[Principal | None]:
    """The key's owner as the caller, or None when the request presents no key.

    A cached key is answered at once; only a cache miss returns an awaitable (the hook
    runner awaits it), so the common case costs no coroutine.

    :raises ApiKeyInvalid: the key is malformed or unknown.
    :raises ApiKeyRevoked: the key was revoked (the attempt is still logged).
    """
    raw = raw_key_of(credentials)
    if raw is None:
        return None
    if not RAW_KEY.fullmatch(raw):
        raise ApiKeyInvalid("the API key is not a valid sk_live_ key")
    directory = service.state(KEYS).directory
    key_hash = hash_key(raw)
    record = directory.cached(key_hash)
    if record is Miss.MISS:
        return _load_and_authenticate(directory, key_hash, context)
    return _caller(record, context)


async def _load_and_authenticate(directory: KeyDirectory, key_hash: str,
                                 context: RequestContext) -> Principal:
    return _caller(await directory.lookup(key_hash), context)


def _caller(record: KeyRecord | None, context: RequestContext) -> Principal:
    if record is None:
        raise ApiKeyInvalid("the API key is unknown")
    context.put(KEY_CALL, KeyCall(record))
    # A future revoked_at is the end of a rotation's overlap (plugins.keys.rotation).
    if record.revoked_at is not None and record.revoked_at <= utcnow():
        raise ApiKeyRevoked("the API key was revoked")
    return Principal(user_id=record.user_id, address=record.address, via="api_key",
                     key_id=record.id)


def request_cost(service: Service, state: KeysState, route: str | None, method: str) -> int:
    """The micro-FLOW cost of a request: the sum of every ``flowsvc_request_cost``.

    Asked once per route and method every ``COST_CACHE_SECONDS``: a hook call for every
    key request would cost more than the rest of the meter.
    """
    if route is None:
        return 0
    cached = state.route_costs.get((route, method))
    now = time.monotonic()
    if cached is not None and cached[1] > now:
        return cached[0]
    costs = service.pm.hook.flowsvc_request_cost(service=service, route=route, method=method)
    cost: int = sum(cost for cost in costs if cost)
    state.route_costs[(route, method)] = (cost, now + COST_CACHE_SECONDS)
    return cost


async def admit(service: Service, request: Request, call: KeyCall) -> None:
    """Meter the key request: its key's window, its owner's bucket and its spend.

    :raises RateLimited: the key's cap or the owner's bucket is full (429).
    :raises SpendCapReached: the key's period spend reached its cap (402).
    :raises Unavailable: the meter cannot answer (503).
    """
    state = service.state(KEYS)
    unix = time.time()
    user_rpm = service.settings.limits.authenticated_rpm
    rule = request.url_rule
    cost = request_cost(service, state, rule.rule if rule else None, request.method)
    item = item_for(call.record, ADMIT, cost, user_rpm, unix)
    call.admission = admission_of(call.record, await state.meter.meter(item, unix), unix)
    refusal = call.admission.refusal(user_rpm)
    if refusal is not None:
        raise refusal


def finish(service: Service, request: Request, response: Response,
           context: RequestContext) -> Awaitable[None] | None:
    """Refund a failed request's cost, add the key headers, and log the request.

    Only a refund needs to wait (for the meter), so only then is an awaitable returned.
    A request whose key was refused (no principal) is logged too; one that another
    plugin's credential won (a session, if ``Bearer sk_live_`` lost to a cookie) is not.
    """
    call = context.get(KEY_CALL)
    principal = context.principal
    if call is None or (principal is not None and principal.key_id != call.record.id):
        return None
    admission = call.admission
    if admission is not None and response.status_code >= 400 and admission.cost > 0:
        return _refund_and_complete(service, request, response, call, admission, context)
    _complete(service, request, response, call, admission, context)
    return None


async def _refund_and_complete(service: Service, request: Request, response: Response,
                               call: KeyCall, admission: Admission,
                               context: RequestContext) -> None:
    _complete(service, request, response, call, await _refund(service, admission), context)


def _complete(service: Service, request: Request, response: Response, call: KeyCall,
              admission: Admission | None, context: RequestContext) -> None:
    if admission is not None:
        response.headers.extend(admission.headers())
    route = request.url_rule.rule if request.url_rule else None
    group = request.blueprint or ("core" if route else "unmatched")
    service.state(KEYS).usage.log(UsageEntry(
        key_id=call.record.id, at=datetime.now(UTC), kind="request", method=request.method,
        route=route, status=response.status_code, cost=admission.cost if admission else 0,
        model=f"route:{group}",
        latency_us=int((time.perf_counter() - context.started) * 1_000_000),
        request_id=context.request_id))


async def _refund(service: Service, admission: Admission) -> Admission:
    record = admission.record
    item = MeterItem(mode=REFUND, key_id=record.id, user_id=record.user_id, key_rpm=0,
                     user_rpm=0, limit=record.spend_limit, cost=admission.cost,
                     period_key=admission.period_key,
                     seed=record.stored_spend(admission.period_key))
    try:
        result = await service.state(KEYS).meter.meter(item, time.time())
    except Exception:  # the request is answered already; the cost stays charged
        log.warning("refund of key %d failed", record.id, exc_info=True)
        return admission
    return replace(admission, cost=admission.cost + result.applied, used=result.used)
