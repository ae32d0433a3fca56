"""The token registry projects attach to: operators' command, internal endpoint, functions.

A token is identified by its slug and owned by an EVM address. Operators add tokens with
``flowsvc tokens add`` or ``PUT /internal/tokens/<slug>`` (internal token); the chain
plugin will keep them current from chain events through :func:`upsert_token`.
"""

from __future__ import annotations

import argparse
import re
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field
from quart import Blueprint, Response
from quart_schema import document_response, validate_request
from sqlalchemy import Connection, insert, select, update
from sqlalchemy.exc import IntegrityError

from plugins.projects.guards import caller_first
from plugins.projects.tables import tokens
from runtime.context import require_internal
from runtime.errors import Conflict, InvalidRequest, NotFound
from runtime.hooktypes import Command
from runtime.http import json_response
from runtime.service import Service
from runtime.wire import as_utc, iso, utcnow

SLUG_PATTERN = r"^[a-z0-9](?:[a-z0-9-]{0,62}[a-z0-9])?$"
ADDRESS_PATTERN = r"^0x[0-9a-fA-F]{40}$"
TokenTemplate = Literal["dpnm", "virtuals"]


@dataclass(frozen=True)
class Token:
    """A token of the registry; addresses are lowercase."""

    slug: str
    owner_address: str
    template: str
    chain_id: int
    instance_address: str
    created_at: datetime
    updated_at: datetime

    def public(self) -> dict[str, Any]:
        return {"slug": self.slug, "ownerAddress": self.owner_address,
                "template": self.template, "chainId": self.chain_id,
                "instance": self.instance_address, "createdAt": iso(self.created_at),
                "updatedAt": iso(self.updated_at)}


def _token(row: Any) -> Token:
    return Token(slug=row.slug, owner_address=row.owner_address, template=row.template,
                 chain_id=row.chain_id, instance_address=row.instance_address,
                 created_at=as_utc(row.created_at), updated_at=as_utc(row.updated_at))


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
    if not re.match(SLUG_PATTERN, slug):
        raise InvalidRequest(f"token slug {slug!r} must be lowercase letters, digits and "
                             "dashes", details=[{"field": "slug", "message": "malformed"}])
    for field, value in (("ownerAddress", owner_address), ("instance", instance_address)):
        if not re.match(ADDRESS_PATTERN, value):
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


class TokenBody(BaseModel):
    """``PUT /internal/tokens/<slug>``: the token's owner, template, chain and instance."""

    model_config = ConfigDict(extra="forbid")
    ownerAddress: str = Field(pattern=ADDRESS_PATTERN)
    template: TokenTemplate
    chainId: int = Field(ge=1)
    instance: str = Field(pattern=ADDRESS_PATTERN)


class TokenView(BaseModel):
    slug: str
    ownerAddress: str
    template: str
    chainId: int
    instance: str
    createdAt: str
    updatedAt: str


class TokenResponse(BaseModel):
    token: TokenView


def add_token_routes(blueprint: Blueprint, service: Service) -> None:
    """The internal token endpoints (``Authorization: Bearer <internal.token>``)."""

    @blueprint.put("/internal/tokens/<slug>")
    @caller_first(require_internal)
    @validate_request(TokenBody)
    @document_response(TokenResponse, 200)
    async def put_token(slug: str, data: TokenBody) -> Response:
        """Register (201) or update (200) a token; internal requests only."""
        token, created = await service.db.write(lambda connection: upsert_token(
            connection, slug=slug, owner_address=data.ownerAddress, template=data.template,
            chain_id=data.chainId, instance_address=data.instance))
        return json_response({"token": token.public()}, 201 if created else 200)

    @blueprint.get("/internal/tokens/<slug>")
    @document_response(TokenResponse, 200)
    async def read_token(slug: str) -> Response:
        """A token of the registry; internal requests only."""
        require_internal()
        token = await service.db.read(get_token, slug)
        if token is None:
            raise NotFound(f"no token with slug {slug!r}")
        return json_response({"token": token.public()})


def _add_arguments(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="action", required=True)
    add = actions.add_parser("add", help="register a token, or update the one with this slug")
    add.add_argument("slug", help="the token's slug (lowercase letters, digits, dashes)")
    add.add_argument("--owner", required=True, help="the owner's EVM address")
    add.add_argument("--template", required=True, choices=["dpnm", "virtuals"])
    add.add_argument("--chain-id", required=True, type=int, help="the chain id (56: BSC)")
    add.add_argument("--instance", required=True, help="the token instance's EVM address")
    actions.add_parser("list", help="print every token")


async def _run(service: Service, args: argparse.Namespace) -> int:
    if args.action == "list":
        for token in await service.db.read(list_tokens):
            print(f"{token.slug}\t{token.owner_address}\t{token.template}\t"
                  f"{token.chain_id}\t{token.instance_address}")
        return 0
    try:
        token, created = await service.db.write(lambda connection: upsert_token(
            connection, slug=args.slug, owner_address=args.owner, template=args.template,
            chain_id=args.chain_id, instance_address=args.instance))
    except (InvalidRequest, Conflict) as exc:
        print(f"flowsvc tokens: {exc.message}")
        return 2
    print(f"{'added' if created else 'updated'} {token.slug} owned by {token.owner_address}")
    return 0


TOKENS = Command(name="tokens", help="manage the tokens projects attach to",
                 add_arguments=_add_arguments, run=_run)
