"""``Client``: the blocking client of the flowsvc API, one method per operation.

It authenticates with an API key (``x-api-key``), or a session token (``Authorization:
Bearer``) that a wallet, an access code or ``use_session`` gives it. Answers come back as the
service's JSON (field names exactly as documented in docs/); errors raise the typed
``ApiError`` subclasses of ``flowsvc_client.errors``. A 429 is retried after its
``Retry-After`` (at most ``max_rate_retries`` times, each wait at most
``max_retry_after`` seconds), since a refused request did nothing. A request whose kept-alive
connection the service closed as it was sent (a drain, an idle timeout) is sent once more on
a new connection when that is safe: an idempotent method, or an ``Idempotency-Key`` header.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from types import TracebackType
from typing import Any, Literal

import httpx

from flowsvc_client.errors import ApiError, RateLimited, error_class
from flowsvc_client.events import EventStream
from flowsvc_client.wallet import Signer, as_account, sign_text

JsonObject = dict[str, Any]
Sort = Literal["trending", "new", "top_earning", "top_rated"]
SESSION_COOKIE = "svc_session"
URL_VARIABLE = "FLOW_API_URL"
SESSION_VARIABLE = "FLOW_SESSION_TOKEN"
API_KEY_VARIABLE = "FLOW_API_KEY"


RESENDABLE_METHODS = frozenset({"GET", "HEAD", "OPTIONS", "PUT", "DELETE"})
"""Methods whose request may be sent twice (RFC 9110, section 9.2.2)."""
_CLOSED_ON_THE_WAY = (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError)
"""How a request fails on a connection closed under it: closed before any answer, reset."""


def _resendable(method: str, headers: Mapping[str, str] | None) -> bool:
    """Whether a request that may have reached the service can be sent again: an idempotent
    method, or a write with ``Idempotency-Key`` (the service answers a repeat once)."""
    return method.upper() in RESENDABLE_METHODS or \
        any(name.lower() == "idempotency-key" for name in headers or ())


def _retry_after_seconds(value: str | None) -> float:
    """``Retry-After`` in seconds, as flowsvc sends it (1 s when absent or unreadable)."""
    try:
        return max(0.0, float(value or "1"))
    except ValueError:
        return 1.0


def _raise_for(response: httpx.Response) -> None:
    if response.status_code < 400:
        return
    try:
        error = response.json()["error"]
        code, message, details = str(error["code"]), str(error["message"]), error.get("details")
    except (ValueError, KeyError, TypeError):
        code, message, details = "http_error", response.text[:200], None
    request_id = response.headers.get("x-request-id")
    if response.status_code == 429:
        raise RateLimited(429, code, message, details=details, request_id=request_id,
                          retry_after=_retry_after_seconds(response.headers.get("retry-after")))
    raise error_class(response.status_code)(response.status_code, code, message,
                                            details=details, request_id=request_id)


def _without_none(**fields: Any) -> JsonObject:
    return {name: value for name, value in fields.items() if value is not None}


class Client:
    """A client of one flowsvc service.

    :param base_url: the service's address, ``http://127.0.0.1:8000`` for ``make serve``.
    :param api_key: an ``sk_live_...`` key (wins over a session, as on the service).
    :param session_token: a session JWT (the ``svc_session`` cookie's value).
    :param timeout: seconds for each request (streams: for each read, see ``stream_timeout``).
    :param stream_timeout: how long a stream may stay silent before it is reconnected; the
        service sends a keep-alive every 15 s.
    :param max_rate_retries: how many times a 429 is retried after its ``Retry-After``.
    :param max_retry_after: the longest ``Retry-After`` waited; a longer one is raised.
    :param sleep: how to wait (``time.sleep``; tests pass their own).
    :param transport: an ``httpx`` transport (tests, proxies).
    """

    def __init__(self, base_url: str, *, api_key: str | None = None,
                 session_token: str | None = None, timeout: float = 30.0,
                 stream_timeout: float = 45.0, max_rate_retries: int = 3,
                 max_retry_after: float = 60.0, sleep: Callable[[float], None] = time.sleep,
                 transport: httpx.BaseTransport | None = None) -> None:
        self.base_url = base_url.rstrip("/")
        self.api_key = api_key
        self.session_token = session_token
        self._stream_timeout = stream_timeout
        self._max_rate_retries = max_rate_retries
        self._max_retry_after = max_retry_after
        self._sleep = sleep
        self._http = httpx.Client(base_url=self.base_url, timeout=timeout, transport=transport,
                                  headers={"user-agent": "flowsvc-client/0.1"})

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **options: Any) -> Client:
        """A client from ``FLOW_API_URL`` (default ``http://127.0.0.1:8000``) and
        ``FLOW_API_KEY`` or ``FLOW_SESSION_TOKEN`` (what ``flowsvc dev-wallet`` prints)."""
        env = os.environ if environ is None else environ
        return cls(env.get(URL_VARIABLE, "http://127.0.0.1:8000"),
                   api_key=env.get(API_KEY_VARIABLE) or None,
                   session_token=env.get(SESSION_VARIABLE) or None, **options)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self.close()

    # -- requests ------------------------------------------------------------------------

    def _headers(self, extra: Mapping[str, str] | None) -> dict[str, str]:
        headers = dict(extra or {})
        if self.api_key is not None:
            headers.setdefault("x-api-key", self.api_key)
        elif self.session_token is not None:
            headers.setdefault("authorization", f"Bearer {self.session_token}")
        return headers

    def send(self, method: str, path: str, *, json: Any = None,
             params: Mapping[str, Any] | None = None,
             headers: Mapping[str, str] | None = None) -> httpx.Response:
        """One request with the client's credential; 429 retried after ``Retry-After``, and a
        request whose connection closed under it sent once more when ``_resendable``.

        :raises ApiError: (a subclass by status) for an error answer.
        :raises httpx.TransportError: the service could not be reached.
        """
        retries = 0
        resent = False
        while True:
            try:
                response = self._http.request(method, path, json=json, params=params,
                                              headers=self._headers(headers))
            except _CLOSED_ON_THE_WAY:
                # httpx has dropped that connection: the next attempt takes another one.
                if resent or not _resendable(method, headers):
                    raise
                resent = True
                continue
            self._http.cookies.clear()  # the session travels as a bearer token only
            try:
                _raise_for(response)
            except RateLimited as limited:
                if retries == self._max_rate_retries or \
                        limited.retry_after > self._max_retry_after:
                    raise
                retries += 1
                self._sleep(limited.retry_after)
                continue
            return response

    def request(self, method: str, path: str, *, json: Any = None,
                params: Mapping[str, Any] | None = None,
                headers: Mapping[str, str] | None = None) -> Any:
        """``send``, then the decoded JSON body (None for an empty one, such as 204)."""
        response = self.send(method, path, json=json, params=params, headers=headers)
        return response.json() if response.content else None

    def _stream_opener(self, path: str) -> Callable[[str | None],
                                                    AbstractContextManager[httpx.Response]]:
        @contextmanager
        def open_stream(last_event_id: str | None) -> Iterator[httpx.Response]:
            extra = {"accept": "text/event-stream"}
            if last_event_id is not None:
                extra["last-event-id"] = last_event_id
            timeout = httpx.Timeout(self._http.timeout.connect, read=self._stream_timeout)
            with self._http.stream("GET", path, headers=self._headers(extra),
                                   timeout=timeout) as response:
                if response.status_code >= 400:
                    response.read()
                    _raise_for(response)
                yield response
        return open_stream

    def events(self, path: str, *, last_event_id: str | None = None, until_done: bool = True,
               max_failures: int = 10, raise_on_lost: bool = False) -> EventStream:
        """The events of the SSE stream at ``path``, each once, reconnecting by itself with
        ``Last-Event-ID`` (see ``flowsvc_client.events``). Stops after ``done`` when
        ``until_done``; ``max_failures`` consecutive failed connections raise. Events the
        service lost are listed in the stream's ``lost`` (and raise ``EventsLost`` with
        ``raise_on_lost``)."""
        return EventStream(self._stream_opener(path), last_event_id=last_event_id,
                           until_done=until_done, sleep=self._sleep,
                           max_failures=max_failures, raise_on_lost=raise_on_lost)

    # -- sign-in (docs/auth.md) -------------------------------------------------------------

    def _session_from(self, response: httpx.Response) -> JsonObject:
        token = response.cookies.get(SESSION_COOKIE)
        if token is None:
            raise ApiError(response.status_code, "no_session", "the answer set no session")
        self.session_token = token
        user: JsonObject = response.json()["user"]
        return user

    def sign_in_with_wallet(self, signer: Signer) -> JsonObject:
        """Sign in with SIWE: ask a nonce for the signer's address, sign the service's
        message, verify it. The client then holds the session; returns the ``user``.

        :param signer: a private key (``0x`` hex or bytes) or an eth-account account.
        """
        account = as_account(signer)
        address = account.address.lower()
        message = self.request("POST", "/auth/nonce", json={"address": address})["message"]
        return self._session_from(self.send("POST", "/auth/verify", json={
            "address": address, "message": message, "signature": sign_text(account, message)}))

    def sign_in_with_access_code(self, code: str) -> JsonObject:
        """Sign in (or up) with a single-use access code; returns the ``user``."""
        return self._session_from(self.send("POST", "/auth/access-code", json={"code": code}))

    def me(self) -> JsonObject:
        """The signed-in ``user``."""
        user: JsonObject = self.request("GET", "/me")["user"]
        return user

    def logout(self) -> None:
        """End the session everywhere (the token stops working)."""
        self.send("POST", "/auth/logout")
        self.session_token = None

    # -- API keys (docs/keys.md) ----------------------------------------------------------------

    def create_api_key(self, name: str, *, rate_limit_rpm: int | None = None,
                       spend_limit_flow: str | None = None,
                       spend_period: str | None = None) -> JsonObject:
        """A new key; its ``raw_key`` is in this answer only."""
        key: JsonObject = self.request("POST", "/me/api-keys", json=_without_none(
            name=name, rate_limit_rpm=rate_limit_rpm, spend_limit_flow=spend_limit_flow,
            spend_period=spend_period))["key"]
        return key

    def api_keys(self) -> list[JsonObject]:
        keys: list[JsonObject] = self.request("GET", "/me/api-keys")["keys"]
        return keys

    def update_api_key(self, key_id: str, **fields: Any) -> JsonObject:
        """Change ``name``, ``rate_limit_rpm``, ``spend_limit_flow`` or ``spend_period``."""
        key: JsonObject = self.request("PATCH", f"/me/api-keys/{key_id}", json=fields)["key"]
        return key

    def revoke_api_key(self, key_id: str) -> None:
        self.send("DELETE", f"/me/api-keys/{key_id}")

    def api_key_usage(self, key_id: str, since: str = "month") -> JsonObject:
        usage: JsonObject = self.request("GET", f"/me/api-keys/{key_id}/usage",
                                         params={"since": since})["usage"]
        return usage

    # -- projects (docs/projects.md) ---------------------------------------------------------

    def create_project(self, *, token_slug: str, title: str, brief: str,
                       agent_template: str, private: bool = False) -> JsonObject:
        """``{id, slug, tokenSlug, status, createdAt}`` of a new project on a token the
        caller's wallet owns."""
        project: JsonObject = self.request("POST", "/projects", json={
            "tokenSlug": token_slug, "title": title, "brief": brief,
            "agentTemplate": agent_template, "private": private})
        return project

    def project(self, slug: str) -> JsonObject:
        project: JsonObject = self.request("GET", f"/projects/{slug}")
        return project

    def start_project(self, slug: str) -> str:
        """Start a run; its ``runId``."""
        return str(self.request("POST", f"/projects/{slug}/start")["runId"])

    def cancel_project(self, slug: str) -> JsonObject:
        project: JsonObject = self.request("POST", f"/projects/{slug}/cancel")
        return project

    def subscribe_project(self, slug: str, subscribed: bool = True) -> bool:
        """Milestone notifications through the messaging bot, on or off."""
        answer = self.request("POST" if subscribed else "DELETE", f"/projects/{slug}/subscribe")
        return bool(answer["subscribed"])

    def project_events(self, slug: str, *, last_event_id: str | None = None,
                       until_done: bool = True, raise_on_lost: bool = False) -> EventStream:
        """The project's stream: its latest run from its first event (or everything after
        ``last_event_id``), each event once, until the run's ``done``."""
        return self.events(f"/projects/{slug}/stream", last_event_id=last_event_id,
                           until_done=until_done, raise_on_lost=raise_on_lost)

    # -- marketplace (docs/marketplace.md) ------------------------------------------------------

    def agents(self, *, sort: Sort | None = None, tag: str | None = None,
               limit: int | None = None, cursor: str | None = None) -> JsonObject:
        """One page: ``{agents, nextCursor}``."""
        page: JsonObject = self.request("GET", "/marketplace/agents", params=_without_none(
            sort=sort, tag=tag, limit=limit, cursor=cursor))
        return page

    def all_agents(self, *, sort: Sort | None = None, tag: str | None = None,
                   limit: int = 100) -> Iterator[JsonObject]:
        """Every listed agent, page after page, each once."""
        page = self.agents(sort=sort, tag=tag, limit=limit)
        yield from page["agents"]
        while page["nextCursor"] is not None:
            page = self.agents(cursor=page["nextCursor"], limit=limit)
            yield from page["agents"]

    def agent(self, slug: str) -> JsonObject:
        agent: JsonObject = self.request("GET", f"/marketplace/agents/{slug}")["agent"]
        return agent

    def create_agent(self, *, name: str, description: str, agent_template: str,
                     **fields: Any) -> JsonObject:
        """A draft agent; ``fields`` are the optional wire fields (``slug``, ``tags``,
        ``instructions``, ``monetization``, ``premium``)."""
        agent: JsonObject = self.request("POST", "/agents", json={
            "name": name, "description": description, "agentTemplate": agent_template,
            **fields})["agent"]
        return agent

    def publish_agent(self, slug: str, **settings: Any) -> JsonObject:
        """List the agent (and update its publication settings)."""
        agent: JsonObject = self.request("POST", f"/agents/{slug}/publish",
                                         json=settings)["agent"]
        return agent

    def unpublish_agent(self, slug: str) -> JsonObject:
        agent: JsonObject = self.request("POST", f"/agents/{slug}/unpublish")["agent"]
        return agent

    def set_tool_prices(self, slug: str, prices: Mapping[str, str]) -> list[JsonObject]:
        """Replace the agent's tool prices: ``{"git_commit": "1.25"}``."""
        answer = self.request("POST", f"/agents/{slug}/tool-prices", json=[
            {"tool": tool, "perCallFlow": price} for tool, price in prices.items()])
        tool_prices: list[JsonObject] = answer["toolPrices"]
        return tool_prices

    def run_agent(self, slug: str, brief: str) -> JsonObject:
        """``{runId, streamUrl}`` of a run of a marketplace agent on ``brief``."""
        run: JsonObject = self.request("POST", f"/agents/{slug}/runs", json={"brief": brief})
        return run

    def agent_run_events(self, run_id: str, *, last_event_id: str | None = None,
                         raise_on_lost: bool = False) -> EventStream:
        return self.events(f"/agent-runs/{run_id}/stream", last_event_id=last_event_id,
                           raise_on_lost=raise_on_lost)

    # -- webhooks (docs/webhooks.md) ----------------------------------------------------------

    def create_webhook(self, url: str, events: list[str] | None = None) -> JsonObject:
        """A subscription; its ``secret`` is in this answer only (and after a rotation)."""
        webhook: JsonObject = self.request("POST", "/me/webhooks", json={
            "url": url, "events": events or []})["webhook"]
        return webhook

    def webhooks(self) -> list[JsonObject]:
        webhooks: list[JsonObject] = self.request("GET", "/me/webhooks")["webhooks"]
        return webhooks

    def rotate_webhook_secret(self, webhook_id: str) -> JsonObject:
        """A new secret; the old one keeps signing beside it for a day."""
        webhook: JsonObject = self.request(
            "POST", f"/me/webhooks/{webhook_id}/rotate-secret")["webhook"]
        return webhook

    def test_webhook(self, webhook_id: str) -> JsonObject:
        delivery: JsonObject = self.request("POST", f"/me/webhooks/{webhook_id}/test")["delivery"]
        return delivery

    def delete_webhook(self, webhook_id: str) -> None:
        self.send("DELETE", f"/me/webhooks/{webhook_id}")

    # -- subscriptions (docs/billing.md) ---------------------------------------------------------

    def checkout(self, tier: str, provider: str) -> JsonObject:
        """``{subscriptionId, tier, provider, checkoutUrl, expiresAt}``."""
        answer: JsonObject = self.request("POST", "/subscriptions/checkout",
                                          json={"tier": tier, "provider": provider})
        return answer

    def subscription(self) -> JsonObject:
        """``{tier, status, renewsAt, provider, features}``."""
        answer: JsonObject = self.request("GET", "/me/subscription")
        return answer

    def cancel_subscription(self) -> JsonObject:
        answer: JsonObject = self.request("POST", "/me/subscription/cancel")
        return answer

    # -- on-chain reads (docs/chain.md) -------------------------------------------------------

    def flow_onchain(self, chain_id: int | None = None) -> JsonObject:
        """``{address, chains}``: the caller's FLOW state on every chain with activity."""
        answer: JsonObject = self.request("GET", "/me/flow-onchain",
                                          params=_without_none(chainId=chain_id))
        return answer

    def tree(self, depth: int = 3, chain_id: int | None = None) -> JsonObject:
        """The caller's tree position, ``depth`` levels down (at most 10)."""
        answer: JsonObject = self.request("GET", "/me/tree", params=_without_none(
            depth=depth, chainId=chain_id))
        return answer

    def token_onchain(self, slug: str) -> JsonObject:
        """A registered token's on-chain state (public)."""
        answer: JsonObject = self.request("GET", f"/tokens/{slug}/onchain")
        return answer
