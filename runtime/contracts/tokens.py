"""Contract: the token registry (provided by the chain plugin).

A token is known by its slug and owned by an EVM address; it is an instance of a
template (``dpnm`` or ``virtuals``) on one chain. Projects attach to tokens their
creator owns; the marketplace links agents to them; ``GET /tokens/<slug>/onchain``
reads their state. Consumers read the registry inside their own transaction, with
``service.contract(TOKENS).get(connection, slug)``, so what they decide from a token
commits (or not) with what they write.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, Protocol

from runtime.contracts import Contract

if TYPE_CHECKING:
    from sqlalchemy import Connection

TokenTemplate = Literal["dpnm", "virtuals"]
SLUG_PATTERN = r"^[a-z0-9](?:[a-z0-9-]{0,62}[a-z0-9])?$"
"""What a token slug looks like: lowercase letters, digits and inner dashes, 1 to 64."""


@dataclass(frozen=True)
class TokenInfo:
    """A registered token; addresses are lowercase ``0x`` hex."""

    slug: str
    owner_address: str
    template: TokenTemplate
    chain_id: int
    instance: str


class TokenRegistry(Protocol):
    def get(self, connection: Connection, slug: str) -> TokenInfo | None:
        """The token ``slug`` read on ``connection``, or None when it is not registered."""
        ...


TOKENS: Contract[TokenRegistry] = Contract("token registry")
