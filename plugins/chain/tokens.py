"""The token registry: tokens by slug, their owner, template, chain and instance.

A token is identified by its slug and owned by an EVM address. Operators add tokens with
``flowsvc tokens add`` (``commands``) or ``PUT /internal/tokens/<slug>`` (``routes``);
other plugins read the registry through the ``runtime.contracts.tokens.TOKENS`` contract,
which :class:`RegisteredTokens` implements. Every function takes an open connection, so
callers compose them into one transaction.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime
from typing import Any, cast

from sqlalchemy import Connection, insert, select, update
from sqlalchemy.exc import IntegrityError

from plugins.chain.tables import tokens
from runtime.contracts.tokens import SLUG_PATTERN, TokenInfo, TokenTemplate
from runtime.errors import Conflict, InvalidRequest
from runtime.wire import as_utc, iso, utcnow

ADDRESS_PATTERN = r"^0x[0-9a-fA-F]{40}$"


@dataclass(frozen=True)
class Token:
    """A token of the registry; addresses are lowercase."""

    slug: str
    owner_address: str
    template: TokenTemplate
    chain_id: int
    instance_address: str
    created_at: datetime
    updated_at: datetime

    def public(self) -> dict[str, Any]:
        return {"slug": self.slug, "ownerAddress": self.owner_address,
                "template": self.template, "chainId": self.chain_id,
                "instance": self.instance_address, "createdAt": iso(self.created_at),
                "updatedAt": iso(self.updated_at)}

    def info(self) -> TokenInfo:
        """The token as the ``TOKENS`` contract describes it."""
        return TokenInfo(slug=self.slug, owner_address=self.owner_address,
                         template=self.template, chain_id=self.chain_id,
                         instance=self.instance_address)


def _token(row: Any) -> Token:
    return Token(slug=row.slug, owner_address=row.owner_address,
                 template=cast(TokenTemplate, row.template), chain_id=row.chain_id,
                 instance_address=row.instance_address, created_at=as_utc(row.created_at),
                 updated_at=as_utc(row.updated_at))


def get_token(connection: Connection, slug: str) -> Token | None:
    row = connection.execute(select(tokens).where(tokens.c.slug == slug)).first()
    return _token(row) if row else None


def list_tokens(connection: Connection) -> list[Token]:
    return [_token(row) for row in connection.execute(select(tokens).order_by(tokens.c.slug))]


def upsert_token(connection: Connection, *, slug: str, owner_address: str,
                 template: TokenTemplate, chain_id: int,
                 instance_address: str) -> tuple[Token, bool]:
    """Register a token or update the one with this slug (an ownership change, say).

    :return: the token as stored, and whether it was created.
    :raises InvalidRequest: the slug or an address is malformed.
    :raises Conflict: another slug already names this chain id and instance address.
    """
    if not re.fullmatch(SLUG_PATTERN, slug):  # whole: "$" also matches before a final "\n"
        raise InvalidRequest(f"token slug {slug!r} must be lowercase letters, digits and "
                             "dashes", details=[{"field": "slug", "message": "malformed"}])
    for field, value in (("ownerAddress", owner_address), ("instance", instance_address)):
        if not re.fullmatch(ADDRESS_PATTERN, value):
            raise InvalidRequest(f"{field} must be a 0x-prefixed EVM address",
                                 details=[{"field": field, "message": "malformed"}])
    values = {"owner_address": owner_address.lower(), "template": template,
              "chain_id": chain_id, "instance_address": instance_address.lower(),
              "updated_at": utcnow()}
    try:
        with connection.begin_nested():
            if get_token(connection, slug) is None:
                connection.execute(insert(tokens).values(slug=slug, created_at=utcnow(),
                                                         **values))
                created = True
            else:
                connection.execute(update(tokens).where(tokens.c.slug == slug).values(**values))
                created = False
    except IntegrityError:
        raise Conflict(f"another token already has chain id {chain_id} and instance "
                       f"{instance_address.lower()}") from None
    token = get_token(connection, slug)
    assert token is not None
    return token, created


class RegisteredTokens:
    """``TokenRegistry`` (the ``TOKENS`` contract) over the ``tokens`` table."""

    def get(self, connection: Connection, slug: str) -> TokenInfo | None:
        token = get_token(connection, slug)
        return token.info() if token is not None else None
