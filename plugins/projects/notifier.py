"""The notifier actor: tells a project's subscribers about its milestones through the bot.

Milestones are a run's plan, each commit and its end. For each, the subscribers with a
linked messaging identity get one message through the messaging platform's Bot API
(``sendMessage``, Telegram's shape, over httpx). A failed send (network error, 5xx, 429
with its ``retry_after``) is retried with exponential backoff up to ``notify_attempts``
times; a refused one (another 4xx, such as a user who blocked the bot) is logged and
dropped. Sending happens in the notifier's own tasks: runs only drop milestones into its
mailbox without waiting (a full mailbox drops the milestone, with a warning), so sending
never slows or fails a run.
"""

from __future__ import annotations

import logging
import random
from typing import Any

import httpx
import trio

from plugins.projects.publisher import Milestone
from plugins.projects.settings import ProjectsSettings
from plugins.projects.store import get_project_by_id, subscriber_chats
from runtime.actors import ActorSpec, Address, Mailbox
from runtime.service import Service

log = logging.getLogger("flowsvc.projects.notifier")
NOTIFIER = "projects.notifier"
_CONCURRENT_SENDS = 8
_MAX_RETRY_AFTER = 30.0
_PLAN_STEPS_SHOWN = 10


def milestone_text(title: str, milestone: Milestone) -> str:
    """The message a subscriber gets for ``milestone`` of the project titled ``title``."""
    data = milestone.data
    if milestone.kind == "plan":
        steps = [str(step) for step in data.get("steps", [])]
        lines = [f"{number}. {step}" for number, step in
                 enumerate(steps[:_PLAN_STEPS_SHOWN], start=1)]
        if len(steps) > _PLAN_STEPS_SHOWN:
            lines.append(f"... and {len(steps) - _PLAN_STEPS_SHOWN} more")
        return f"{title}: the agent planned {len(steps)} steps\n" + "\n".join(lines)
    if milestone.kind == "commit":
        files = data.get("files", [])
        return (f"{title}: commit {str(data.get('sha', ''))[:7]} {data.get('message', '')} "
                f"({len(files)} file{'s' if len(files) != 1 else ''})")
    status = data.get("finalStatus")
    if status == "completed":
        return f"{title}: the build completed. Download it: {data.get('artifactUrl')}"
    if status == "failed":
        return f"{title}: the build failed: {data.get('reason')}"
    return f"{title}: the build was cancelled."


def notifier_address(service: Service) -> Address | None:
    return service.registry.get(NOTIFIER)


class BotClient:
    """Sends messages through the Bot API, with retries; one per notifier."""

    def __init__(self, http: httpx.AsyncClient, settings: ProjectsSettings) -> None:
        self._http = http
        self._settings = settings
        self._url = f"{settings.bot_api_base_url}/bot{settings.bot_token}/sendMessage"

    async def send(self, chat_id: int, text: str) -> bool:
        """Send ``text`` to ``chat_id``; True once the Bot API accepted it."""
        settings = self._settings
        for attempt in range(settings.notify_attempts):
            delay = settings.notify_backoff_seconds * 2 ** attempt * random.uniform(0.5, 1.0)
            try:
                reply = await self._http.post(self._url, json={"chat_id": chat_id,
                                                               "text": text})
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
            if attempt + 1 < settings.notify_attempts:
                await trio.sleep(delay)
        log.warning("giving up on a message to %s after %d attempts", chat_id,
                    settings.notify_attempts)
        return False


def _retry_after(reply: httpx.Response) -> float | None:
    try:
        return float(reply.json()["parameters"]["retry_after"])
    except (ValueError, KeyError, TypeError):
        return None


def notify_later(service: Service, milestone: Milestone) -> None:
    """Drop a milestone into the notifier's mailbox without waiting (what runs call)."""
    address = notifier_address(service)
    if address is not None and not address.try_cast(milestone):
        log.warning("notifier mailbox full: milestone %s of project %s dropped",
                    milestone.kind, milestone.project_id)


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


def notifier_spec(service: Service, settings: ProjectsSettings) -> ActorSpec:
    """The notifier actor (``projects.notifier``); messages are :class:`Milestone` casts."""

    async def deliver(bot: BotClient, limiter: trio.CapacityLimiter, chat: int,
                      text: str) -> None:
        async with limiter:
            await bot.send(chat, text)

    async def handle(bot: BotClient, limiter: trio.CapacityLimiter, nursery: trio.Nursery,
                     milestone: Milestone) -> None:
        if not settings.bot_token:
            return
        project = await service.db.read(get_project_by_id, milestone.project_id)
        chats = await service.db.read(subscriber_chats, milestone.project_id)
        if project is None:
            return
        text = milestone_text(project.title, milestone)
        for chat in chats:
            nursery.start_soon(deliver, bot, limiter, chat, text)

    async def run(mailbox: Mailbox, *,
                  task_status: trio.TaskStatus[Any] = trio.TASK_STATUS_IGNORED) -> None:
        limiter = trio.CapacityLimiter(_CONCURRENT_SENDS)
        redact = RedactSecret(settings.bot_token)
        httpx_log = logging.getLogger("httpx")
        httpx_log.addFilter(redact)
        try:
            async with httpx.AsyncClient(timeout=10) as http, trio.open_nursery() as nursery:
                bot = BotClient(http, settings)
                task_status.started()
                async for envelope in mailbox:
                    try:
                        await handle(bot, limiter, nursery, envelope.message)
                    except Exception:  # a milestone that cannot be sent must not stop the rest
                        log.exception("milestone of project %s not sent",
                                      envelope.message.project_id)
                nursery.cancel_scope.cancel()
        finally:
            httpx_log.removeFilter(redact)

    return ActorSpec(name=NOTIFIER, run=run, mailbox_size=1024)
