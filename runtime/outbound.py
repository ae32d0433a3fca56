"""Outbound HTTP to URLs that users choose, through the SSRF guard (``runtime.netguard``).

The guard resolves the host before every request, and the HTTP client must connect to one of
the addresses it vetted, never resolve the name again (a second lookup could answer
differently: DNS rebinding). httpx has no hook for that, so the client runs on an httpcore
connection pool whose network backend only connects to the addresses pinned for the current
request (a context variable set around the request; httpcore connects in the caller's task).
The URL keeps its host name, so TLS checks the certificate against it, ``Host`` is right, and
kept-alive connections are pooled per host name. The client never follows redirects itself:
:func:`fetch_text` follows a few, vetting each new target like the first.

Webhook deliveries (``plugins.webhooks``) and the ``fetch_url`` agent tool (``plugins.projects``)
both go out through here.
"""

from __future__ import annotations

import ssl
from collections.abc import AsyncIterator, Iterable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from functools import cache
from typing import Any

import httpcore
import httpx
import trio

from runtime.netguard import IPAddress, UrlPolicy, normalize_host, resolve_and_check


@dataclass(frozen=True)
class _Pin:
    host: str
    addresses: tuple[str, ...]


_PIN: ContextVar[_Pin | None] = ContextVar("flowsvc_outbound_pin", default=None)


@contextmanager
def pinned(host: str, addresses: Sequence[IPAddress]) -> Iterator[None]:
    """Let connections opened in this context reach ``host`` only at ``addresses``."""
    token = _PIN.set(_Pin(normalize_host(host), tuple(str(address) for address in addresses)))
    try:
        yield
    finally:
        _PIN.reset(token)


class PinnedBackend(httpcore.AsyncNetworkBackend):
    """Trio TCP connections to the pinned addresses of the current request, and nowhere else."""

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
            raise httpcore.ConnectError(f"host {host!r} was not vetted for this request")
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
        raise httpcore.ConnectError("outbound requests never use unix sockets")

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


@cache
def _tls_context() -> ssl.SSLContext:
    """The TLS context of every outbound client of the process: making one parses the
    system's CA file (20-50 ms of CPU), which a ``fetch_url`` call paid each time."""
    return httpx.create_ssl_context()


class PinnedTransport(httpx.AsyncBaseTransport):
    """An httpx transport over a connection pool that uses ``PinnedBackend``.

    :param max_connections: open connections at most (in use or kept alive).
    """

    def __init__(self, *, max_connections: int, keepalive_expiry: float = 30.0) -> None:
        self._pool = httpcore.AsyncConnectionPool(
            ssl_context=_tls_context(), max_connections=max_connections,
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


def open_client(*, max_connections: int, timeout: float, user_agent: str) -> httpx.AsyncClient:
    """A client on pinned connections: no redirects followed, no proxy from the environment.

    Every request must run inside :func:`pinned` for its host.
    """
    return httpx.AsyncClient(transport=PinnedTransport(max_connections=max_connections),
                             timeout=httpx.Timeout(timeout), follow_redirects=False,
                             trust_env=False, headers={"User-Agent": user_agent})


REDIRECT_STATUSES = frozenset({301, 302, 303, 307, 308})


class FetchFailed(Exception):
    """A fetch did not get an answer to give back: too many redirects, a timeout, a network
    failure or a body it will not read. The message says which, for the model and the user."""


@dataclass(frozen=True)
class Fetched:
    """What a GET answered, after its redirects.

    :param url: the URL that gave this answer (the last redirect's target).
    :param body: at most the byte cap of the body; ``truncated`` says whether there was more.
    """

    url: str
    status: int
    content_type: str
    body: bytes
    truncated: bool
    redirects: int


async def _read_capped(response: httpx.Response, max_bytes: int) -> tuple[bytes, bool]:
    encoding = response.headers.get("content-encoding", "identity").strip().lower()
    if encoding not in ("", "identity"):
        # Decoding would let a few compressed bytes become gigabytes before the cap applies.
        raise FetchFailed(f"the server sent a {encoding}-encoded body although none was asked")
    body = bytearray()
    with trio.CancelScope() as reading:
        async for chunk in response.aiter_raw():
            body.extend(chunk[: max_bytes + 1 - len(body)])
            if len(body) > max_bytes:
                # Stop by cancelling the read under way: leaving the loop would drop
                # httpcore's body generators half-way, for the GC to finalize (with a warning).
                reading.cancel()
    return bytes(body[:max_bytes]), len(body) > max_bytes


async def _get_following(client: httpx.AsyncClient, url: str, policy: UrlPolicy, *,
                         max_bytes: int, max_redirects: int) -> Fetched:
    redirects = 0
    while True:
        addresses = await resolve_and_check(url, policy)
        request = client.build_request("GET", url, headers={"Accept-Encoding": "identity"})
        with pinned(request.url.host, addresses):
            response = await client.send(request, stream=True)
            try:
                location = response.headers.get("location")
                if response.status_code in REDIRECT_STATUSES and location:
                    if redirects == max_redirects:
                        raise FetchFailed(f"more than {max_redirects} redirects")
                    redirects += 1
                    url = str(request.url.join(location))  # httpx refused invalid ones
                    continue
                body, truncated = await _read_capped(response, max_bytes)
            finally:
                await response.aclose()
        return Fetched(url=url, status=response.status_code,
                       content_type=response.headers.get("content-type", ""), body=body,
                       truncated=truncated, redirects=redirects)


async def fetch(client: httpx.AsyncClient, url: str, policy: UrlPolicy, *, max_bytes: int,
                timeout: float, max_redirects: int = 5) -> Fetched:
    """GET ``url`` within ``timeout`` seconds (DNS and every redirect included), reading at
    most ``max_bytes`` of the body, and following at most ``max_redirects`` redirects.

    Every target, the first and each redirect's, goes through the SSRF guard and is reached
    only at the addresses it vetted. ``client`` comes from :func:`open_client`.

    :raises UnsafeUrlError: the URL or a redirect's target is refused by ``policy``.
    :raises FetchFailed: no answer to give back (see the class).
    """
    with trio.move_on_after(timeout):
        try:
            return await _get_following(client, url, policy, max_bytes=max_bytes,
                                        max_redirects=max_redirects)
        except httpx.TimeoutException:
            pass
        except httpx.TransportError as exc:
            raise FetchFailed(f"network error: {exc or type(exc).__name__}") from None
    raise FetchFailed(f"no answer within {timeout:g} s")
