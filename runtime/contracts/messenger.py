"""Contract: send a user a message through the messaging platform's bot (the auth plugin).

The auth plugin owns the one bot token (it also validates messenger sign-ins) and runs the
``auth.messenger`` actor that sends through the Bot API with retries. Any plugin casts
``MessageUser`` to it without waiting; users without a linked messaging identity are
skipped, and a full mailbox drops the message (``try_cast`` returns False), so a slow or
failing bot never slows the sender::

    address = service.registry.get(MESSENGER_ACTOR)
    if address is not None:
        address.try_cast(MessageUser(user_id=7, text="Your build completed."))
"""

from __future__ import annotations

from dataclasses import dataclass

MESSENGER_ACTOR = "auth.messenger"


@dataclass(frozen=True)
class MessageUser:
    """Send ``text`` (plain text, at most 4096 characters) to each of ``user_ids`` that has
    a linked messaging identity."""

    user_ids: tuple[int, ...]
    text: str
