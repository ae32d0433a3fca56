"""One delivery attempt over HTTP: vet the target, sign, POST, classify the answer.

The SSRF guard resolves the host before every attempt, and the HTTP client must connect to
one of the addresses it vetted, never resolve the name again (a second lookup could answer
differently: DNS rebinding). httpx has no hook for that, so the client runs on an httpcore
connection pool whose network backend only connects to the addresses pinned for the current
attempt (a context variable set around the request; httpcore connects in the caller's task).
The URL keeps its host name, so TLS checks the certificate against it, ``Host`` is right, and
kept-alive connections are pooled per host name. Redirects are never followed.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Iterable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

import httpcore
import httpx
import trio

from plugins.webhooks.outbox import Job, Outcome
from plugins.webhooks.signing import sign_delivery
from plugins.webhooks.urlguard import (
    IPAddress,
    UnsafeUrlError,
    UrlPolicy,
    normalize_host,
    resolve_and_check,
)
from runtime.wire import utcnow

USER_AGENT = "flowsvc-webhooks/1"
# Enough to read a receiver's usual short answer so that the connection can be kept alive;
# anything longer is not read (the connection is closed instead).
RESPONSE_READ_LIMIT = 16 * 1024
ERROR_MAX_CHARS = 300


@dataclass(frozen=True)
class _Pin:
    host: str
    addresses: tuple[str, ...]


_PIN: ContextVar[_Pin | None] = ContextVar("flowsvc_webhook_pin", default=None)


@contextmanager
def pinned(host: str, addresses: Sequence[IPAddress]) -> Iterator[None]:
    """Let connections opened in this context reach ``host`` only at ``addresses``."""
    token = _PIN.set(_Pin(normalize_host(host), tuple(str(address) for address in addresses)))
    try:
        yield
    finally:
        _PIN.reset(token)


class PinnedBackend(httpcore.AsyncNetworkBackend):
    """Trio TCP connections to the pinned addresses of the current attempt, and nowhere else."""

    def __init__(self) -> None:
        self._trio = httpcore.TrioBackend()

    async def connect_tcp(self, host: str, port: int, timeout: float | None = None,
                          local_address: str | None = None,
                          socket_options: Iterable[Any] | None = None
                          ) -> httpcore.AsyncNetworkStream:
        """Connect to the first pinned address of ``host`` that answers.

        :raises httpcore.ConnectError: ``host`` was not vetted for this attempt, or no
            pinned address accepts the connection.
        """
        pin = _PIN.get()
        if pin is None or normalize_host(host) != pin.host:
            raise httpcore.ConnectError(f"host {host!r} was not vetted for this attempt")
        failure: httpcore.ConnectError | None = None
        for address in pin.addresses:
            try:
                return await self._trio.connect_tcp(address, port, timeout=timeout,
                                                    local_address=local_address,
                                                    socket_options=socket_options)
            except httpcore.ConnectError as exc:
                failure = exc
        raise failure or httpcore.ConnectError(f"host {host!r} has no vetted address")

    async def connect_unix_socket(self, path: str, timeout: float | None = None,
                                  socket_options: Iterable[Any] | None = None
                                  ) -> httpcore.AsyncNetworkStream:
        raise httpcore.ConnectError("webhooks never connect to unix sockets")

    async def sleep(self, seconds: float) -> None:
        await trio.sleep(seconds)


class _ResponseStream(httpx.AsyncByteStream):
    def __init__(self, stream: Any) -> None:
        self._stream = stream

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for chunk in self._stream:
            yield chunk

    async def aclose(self) -> None:
        await self._stream.aclose()


class PinnedTransport(httpx.AsyncBaseTransport):
    """An httpx transport over a connection pool that uses ``PinnedBackend``.

    :param max_connections: open connections at most (in use or kept alive).
    """

    def __init__(self, *, max_connections: int, keepalive_expiry: float = 30.0) -> None:
        self._pool = httpcore.AsyncConnectionPool(
            ssl_context=httpx.create_ssl_context(), max_connections=max_connections,
            max_keepalive_connections=max_connections, keepalive_expiry=keepalive_expiry,
            network_backend=PinnedBackend())

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        """Send ``request``; httpcore's errors come out as the matching httpx ones."""
        assert isinstance(request.stream, httpx.AsyncByteStream)
        core_request = httpcore.Request(
            method=request.method,
            url=httpcore.URL(scheme=request.url.raw_scheme, host=request.url.raw_host,
                             port=request.url.port, target=request.url.raw_path),
            headers=request.headers.raw, content=request.stream, extensions=request.extensions)
        try:
            response = await self._pool.handle_async_request(core_request)
        except httpcore.TimeoutException as exc:
            raise httpx.TimeoutException(str(exc), request=request) from exc
        except httpcore.ConnectError as exc:
            raise httpx.ConnectError(str(exc), request=request) from exc
        except (httpcore.NetworkError, httpcore.ProtocolError, httpcore.UnsupportedProtocol,
                httpcore.ConnectionNotAvailable) as exc:
            raise httpx.TransportError(f"{type(exc).__name__}: {exc}") from exc
        return httpx.Response(status_code=response.status, headers=response.headers,
                              stream=_ResponseStream(response.stream),
                              extensions=response.extensions)

    async def aclose(self) -> None:
        await self._pool.aclose()


def open_client(*, max_connections: int, timeout: float) -> httpx.AsyncClient:
    """The dispatcher's client: pinned connections, no redirects, no proxy from the environment."""
    return httpx.AsyncClient(transport=PinnedTransport(max_connections=max_connections),
                             timeout=httpx.Timeout(timeout), follow_redirects=False,
                             trust_env=False, headers={"User-Agent": USER_AGENT})


def _describe(exc: httpx.TransportError, timeout: float) -> str:
    if isinstance(exc, httpx.TimeoutException):
        return f"timeout after {timeout:g} s"
    if isinstance(exc, httpx.ConnectError):
        return f"connection failed: {exc}"
    return f"network error: {exc}"


async def _post(client: httpx.AsyncClient, job: Job, headers: dict[str, str]) -> int:
    request = client.build_request("POST", job.url, content=job.body, headers=headers)
    response = await client.send(request, stream=True)
    try:
        read = 0
        async for chunk in response.aiter_raw():
            read += len(chunk)
            if read > RESPONSE_READ_LIMIT:
                break
    finally:
        await response.aclose()
    return response.status_code


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
    error: str | None = None
    permanent = False
    with trio.move_on_after(timeout) as deadline:
        try:
            addresses = await resolve_and_check(job.url, policy)
            headers = sign_delivery(job.secrets, job.body, timestamp=int(time.time()),
                                    event_id=job.event_id)
            headers["Content-Type"] = "application/json"
            with pinned(httpx.URL(job.url).host, addresses):
                status = await _post(client, job, headers)
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
                   permanent=permanent)
