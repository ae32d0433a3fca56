"""Routes of the chain plugin: the token registry's internal endpoints.

``PUT`` and ``GET /internal/tokens/<slug>`` take the internal token
(``Authorization: Bearer <internal.token>``). Views are module-level functions on
``blueprint``; they find the service with ``current_service()``.
"""

from __future__ import annotations

from pydantic import BaseModel, Field
from quart import Blueprint, Response
from quart_schema import document_response, validate_request

from plugins.chain.tokens import ADDRESS_PATTERN, get_token, upsert_token
from runtime.context import caller_first, require_internal
from runtime.contracts.tokens import TokenTemplate
from runtime.errors import NotFound
from runtime.http import current_service, json_response
from runtime.inputs import Body

blueprint = Blueprint("chain", __name__)


class TokenBody(Body):
    """``PUT /internal/tokens/<slug>``: the token's owner, template, chain and instance."""

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


@blueprint.put("/internal/tokens/<slug>")
@caller_first(require_internal)
@validate_request(TokenBody)
@document_response(TokenResponse, 200)
@document_response(TokenResponse, 201)
async def put_token(slug: str, data: TokenBody) -> Response:
    """Register (201) or update (200) a token; internal requests only."""
    token, created = await current_service().db.write(lambda connection: upsert_token(
        connection, slug=slug, owner_address=data.ownerAddress, template=data.template,
        chain_id=data.chainId, instance_address=data.instance))
    return json_response({"token": token.public()}, 201 if created else 200)


@blueprint.get("/internal/tokens/<slug>")
@document_response(TokenResponse, 200)
async def read_token(slug: str) -> Response:
    """A token of the registry; internal requests only."""
    require_internal()
    token = await current_service().db.read(get_token, slug)
    if token is None:
        raise NotFound(f"no token with slug {slug!r}")
    return json_response({"token": token.public()})
