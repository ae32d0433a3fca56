"""The messenger: the ``auth.messenger`` actor sends users messages through the bot.

The auth plugin owns the one bot token: it validates messenger sign-ins with it and
sends with it here, for every plugin (``runtime.contracts.messenger``: project
milestones, billing's renewal invoices). A ``MessageUser`` names users; those with a
linked messaging identity get one ``sendMessage`` each through the messaging platform's
Bot API (Telegram's shape, over httpx). A failed send (network error, 5xx, 429 with its
``retry_after``) is retried with exponential backoff up to ``bot_send_attempts`` times; a
refused one (another 4xx, such as a user who blocked the bot) is logged and dropped.
Senders never wait: they cast, and sending happens in the actor's own tasks. A database
outage holds messages in the mailbox (1,024) until the users' chats can be read again.
"""

from __future__ import annotations

import logging
import random
from contextlib import nullcontext
from functools import partial
from typing import Any

import httpx
import trio
from sqlalchemy import Connection, select

from plugins.auth.settings import AuthSettings
from runtime.actors import ActorSpec, Mailbox
from runtime.backoff import until_available
from runtime.contracts.messenger import MESSENGER_ACTOR, MessageUser
from runtime.service import Service
from runtime.users import users

log = logging.getLogger("flowsvc.auth.messenger")
_CONCURRENT_SENDS = 8
_MAX_RETRY_AFTER = 30.0
MAX_TEXT = 4096


class BotClient:
    """Sends messages through the Bot API, with retries; one per messenger actor run."""

    def __init__(self, http: httpx.AsyncClient, settings: AuthSettings) -> None:
        self._http = http
        self._settings = settings
        self._url = f"{settings.bot_api_base_url}/bot{settings.bot_token}/sendMessage"

    async def send(self, chat_id: int, text: str) -> bool:
        """Send ``text`` to ``chat_id``; True once the Bot API accepted it."""
        settings = self._settings
        for attempt in range(settings.bot_send_attempts):
            delay = settings.bot_send_backoff_seconds * 2 ** attempt * random.uniform(0.5, 1.0)
            try:
                reply = await self._http.post(self._url, json={"chat_id": chat_id,
                                                               "text": text[:MAX_TEXT]})
            except httpx.HTTPError as exc:
                log.warning("sendMessage to %s failed: %s", chat_id, type(exc).__name__)
            else:
                if reply.status_code < 300:
                    return True
                if reply.status_code == 429:
                    delay = min(_retry_after(reply) or delay, _MAX_RETRY_AFTER)
                elif reply.status_code < 500:
                    log.warning("sendMessage to %s refused: HTTP %s", chat_id,
                                reply.status_code)
                    return False
                else:
                    log.warning("sendMessage to %s: HTTP %s", chat_id, reply.status_code)
            if attempt + 1 < settings.bot_send_attempts:
                await trio.sleep(delay)
        log.warning("giving up on a message to %s after %d attempts", chat_id,
                    settings.bot_send_attempts)
        return False


def _retry_after(reply: httpx.Response) -> float | None:
    try:
        return float(reply.json()["parameters"]["retry_after"])
    except (ValueError, KeyError, TypeError):
        return None


class RedactSecret(logging.Filter):
    """Hides a secret in the records of a logger (httpx logs each request's URL, and the
    Bot API puts the bot token in the URL)."""

    def __init__(self, secret: str) -> None:
        super().__init__()
        self._secret = secret

    def filter(self, record: logging.LogRecord) -> bool:
        if self._secret and self._secret in record.getMessage():
            record.msg = record.getMessage().replace(self._secret, "[redacted]")
            record.args = None
        return True


def chats_of(connection: Connection, user_ids: tuple[int, ...]) -> list[int]:
    """The messaging chats of those of ``user_ids`` with a linked identity."""
    return [int(chat) for chat in connection.execute(
        select(users.c.messenger_id).where(users.c.id.in_(user_ids))
        .where(users.c.messenger_id.is_not(None))).scalars()]


def messenger_actor(service: Service, settings: AuthSettings) -> ActorSpec:
    """The ``auth.messenger`` actor; its messages are ``MessageUser`` casts. Without a bot
    token it drops them (messaging is not configured)."""

    async def deliver(bot: BotClient, limiter: trio.CapacityLimiter, chat: int,
                      text: str) -> None:
        async with limiter:
            await bot.send(chat, text)

    async def run(mailbox: Mailbox, *,
                  task_status: trio.TaskStatus[Any] = trio.TASK_STATUS_IGNORED) -> None:
        limiter = trio.CapacityLimiter(_CONCURRENT_SENDS)
        redact = RedactSecret(settings.bot_token)
        httpx_log = logging.getLogger("httpx")
        httpx_log.addFilter(redact)
        # Without a bot token nothing is sent, and no client is made: its TLS context (the
        # system's CA file parsed) would cost every start of the service.
        client = httpx.AsyncClient(timeout=10) if settings.bot_token else nullcontext(None)
        try:
            async with client as http, trio.open_nursery() as nursery:
                bot = BotClient(http, settings) if http is not None else None
                task_status.started()
                async for envelope in mailbox:
                    message = envelope.message
                    if not isinstance(message, MessageUser):
                        raise TypeError(f"{MESSENGER_ACTOR} does not understand {message!r}")
                    if bot is None or not message.user_ids:
                        continue
                    try:  # a database outage holds the message until it is back
                        chats = await until_available(
                            partial(service.db.read, chats_of, message.user_ids),
                            what="reading the chats of a message's users", log=log)
                    except Exception:  # one message that cannot be sent must not stop the rest
                        log.exception("message to %d users not sent: their chats could not "
                                      "be read", len(message.user_ids))
                        continue
                    for chat in chats:
                        nursery.start_soon(deliver, bot, limiter, chat, message.text)
                nursery.cancel_scope.cancel()
        finally:
            httpx_log.removeFilter(redact)

    return ActorSpec(name=MESSENGER_ACTOR, run=run, mailbox_size=1024)
