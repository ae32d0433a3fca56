"""The service-wide request buckets (spec, Limits): per IP, per user, per internal token.

Every request is counted in exactly one bucket of ``service.shared.hit_window`` (a sliding
log over one minute, exact across processes with Redis):

- anonymous: ``ip:<client ip>``, ``limits.anonymous_rpm`` (30) per minute;
- a session (cookie or bearer JWT): ``user:{u<user id>}``, ``limits.authenticated_rpm`` (240);
- the internal token: ``internal:<token digest>``, ``limits.internal_rpm`` (1000);
- an anonymous request a plugin claims with ``flowsvc_request_bucket`` (previews): that
  plugin's bucket instead of the per-address one.

A full bucket answers 429 ``rate_limited`` with ``Retry-After`` in whole seconds (when the
oldest counted request leaves the window). A limit of 0 disables its bucket. The client IP
is the socket peer unless ``service.trusted_proxies`` names the peer (``runtime.http.client_ip``).

API-key requests are the one exception: the plugin that authenticates a principal with
``via == "api_key"`` counts it in the owner's ``user:{u<id>}`` bucket (``user_bucket``) itself,
in the same atomic step as the key's own cap, so that a key request costs one round trip to
Redis instead of two. Such a request still shares one bucket with the owner's sessions.
The liveness and readiness probes are never counted: load balancers poll them (a
request a plugin claimed is no probe: ``/healthz`` on a preview host is a file).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from runtime.config import LimitsSettings
from runtime.errors import RateLimited, Unavailable
from runtime.principal import Principal
from runtime.shared import SharedState

WINDOW_SECONDS = 60.0
UNCOUNTED_PATHS = frozenset({"/healthz", "/readyz"})


@dataclass(frozen=True)
class Bucket:
    """One request bucket: its shared-state name, its per-minute limit, what it is for."""

    name: str
    limit: int
    label: str


def user_tag(user_id: int) -> str:
    """The Redis hash tag of a user's keys (``{u<id>}``): every shared-state key that one
    script may touch together with the user's bucket carries it (the keys meter's), so that
    on a Redis Cluster they all live in the bucket's hash slot."""
    return f"{{u{user_id}}}"


def user_bucket(user_id: int) -> str:
    """The shared-state name of a user's bucket (sessions and API keys of the user share it),
    under the user's hash tag."""
    return f"user:{user_tag(user_id)}"


def bucket_of(principal: Principal | None, client_ip: str, internal_token: str,
              limits: LimitsSettings) -> Bucket | None:
    """The bucket a request is counted in; None when it is not counted here.

    None for API-key requests (metered with their key, see the module docstring) and for
    a bucket whose limit is 0.
    """
    if principal is None:
        bucket = Bucket(f"ip:{client_ip}", limits.anonymous_rpm, "anonymous requests per IP")
    elif principal.via == "internal":
        digest = hashlib.sha256(internal_token.encode()).hexdigest()[:16]
        bucket = Bucket(f"internal:{digest}", limits.internal_rpm, "internal requests per token")
    elif principal.via == "session":
        bucket = Bucket(user_bucket(principal.user_id), limits.authenticated_rpm,
                        "authenticated requests per user")
    else:
        return None
    return bucket if bucket.limit > 0 else None


def _redis_error() -> type[Exception]:
    """coredis' base error. Looked up only when an exception is being matched (an ``except``
    clause evaluates its types then): a service without Redis never loads coredis."""
    from coredis.exceptions import RedisError

    return RedisError


async def check_request(shared: SharedState, path: str, principal: Principal | None,
                        client_ip: str, internal_token: str, limits: LimitsSettings,
                        claimed: Bucket | None = None) -> None:
    """Count the request in its bucket: ``claimed`` (a plugin's, anonymous requests only)
    when given, else the one ``bucket_of`` names.

    :raises RateLimited: the bucket is full; ``Retry-After`` says when a slot frees up.
    :raises Unavailable: Redis cannot be reached (503).
    """
    if path in UNCOUNTED_PATHS and claimed is None:  # a claimed one is no probe (a preview)
        return
    if claimed is not None and principal is None:
        bucket: Bucket | None = claimed if claimed.limit > 0 else None
    else:
        bucket = bucket_of(principal, client_ip, internal_token, limits)
    if bucket is None:
        return
    try:
        decision = await shared.hit_window(bucket.name, bucket.limit, WINDOW_SECONDS)
    except (_redis_error(), OSError) as exc:  # no bucket to check: refuse, not miscount
        raise Unavailable("the request limiter cannot reach Redis") from exc
    if not decision.allowed:
        raise RateLimited(f"too many requests: the limit is {bucket.limit} {bucket.label} "
                          f"per minute", retry_after=decision.retry_after)
