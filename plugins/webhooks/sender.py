"""One delivery attempt over HTTP: vet the target, sign, POST, classify the answer.

The SSRF guard (``runtime.netguard``) resolves the host before every attempt, and the client
(``runtime.outbound``) connects only to the addresses it vetted, never resolving the name
again (DNS rebinding). Redirects are never followed.
"""

from __future__ import annotations

import time

import httpx
import trio

from plugins.webhooks.outbox import Job, Outcome
from plugins.webhooks.signing import sign_delivery
from runtime import outbound
from runtime.netguard import UnsafeUrlError, UrlPolicy, resolve_and_check
from runtime.wire import utcnow

USER_AGENT = "flowsvc-webhooks/1"
# Enough to read a receiver's usual short answer so that the connection can be kept alive;
# anything longer is not read (the connection is closed instead).
RESPONSE_READ_LIMIT = 16 * 1024
EXCERPT_MAX_BYTES = 256  # of each response body, kept with its attempt
ERROR_MAX_CHARS = 300


def open_client(*, max_connections: int, timeout: float) -> httpx.AsyncClient:
    """The dispatcher's client: pinned connections (``runtime.outbound``), no redirects."""
    return outbound.open_client(max_connections=max_connections, timeout=timeout,
                                user_agent=USER_AGENT)


def _describe(exc: httpx.TransportError, timeout: float) -> str:
    if isinstance(exc, httpx.TimeoutException):
        return f"timeout after {timeout:g} s"
    if isinstance(exc, httpx.ConnectError):
        return f"connection failed: {exc}"
    return f"network error: {exc}"


async def _post(client: httpx.AsyncClient, job: Job, headers: dict[str, str]
                ) -> tuple[int, str]:
    """The response's status and the start of its body (decoded, at most
    ``EXCERPT_MAX_BYTES``)."""
    request = client.build_request("POST", job.url, content=job.body, headers=headers)
    response = await client.send(request, stream=True)
    start = b""
    try:
        read = 0
        async for chunk in response.aiter_raw():
            if len(start) < EXCERPT_MAX_BYTES:
                start += chunk[:EXCERPT_MAX_BYTES - len(start)]
            read += len(chunk)
            if read > RESPONSE_READ_LIMIT:
                break
    finally:
        await response.aclose()
    return response.status_code, start.decode("utf-8", errors="replace")


async def send_attempt(client: httpx.AsyncClient, job: Job, policy: UrlPolicy,
                       timeout: float) -> Outcome:
    """Make one attempt of ``job`` within ``timeout`` seconds (DNS included); never raises
    for anything the target or the network does.

    A URL the SSRF policy now refuses fails for good (``permanent``), except a host that does
    not resolve, which is a network failure like any other and is retried.
    """
    started_at = utcnow()
    clock = trio.current_time()
    status: int | None = None
    excerpt: str | None = None
    error: str | None = None
    permanent = False
    with trio.move_on_after(timeout) as deadline:
        try:
            addresses = await resolve_and_check(job.url, policy)
            headers = sign_delivery(job.secrets, job.body, timestamp=int(time.time()),
                                    event_id=job.event_id)
            headers["Content-Type"] = "application/json"
            with outbound.pinned(httpx.URL(job.url).host, addresses):
                status, excerpt = await _post(client, job, headers)
        except UnsafeUrlError as exc:
            permanent = exc.reason != "unresolvable_host"
            error = f"refused: {exc}" if permanent else str(exc)
        except httpx.TransportError as exc:
            error = _describe(exc, timeout)
    if deadline.cancelled_caught:
        error = f"timeout after {timeout:g} s"
    elif status is not None and not 200 <= status < 300:
        error = f"HTTP {status}" + (" (redirects are not followed)" if 300 <= status < 400 else "")
    return Outcome(job=job, started_at=started_at,
                   duration_ms=round((trio.current_time() - clock) * 1000),
                   status_code=status, error=error[:ERROR_MAX_CHARS] if error else None,
                   permanent=permanent, response_excerpt=excerpt or None)
