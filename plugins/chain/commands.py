"""``flowsvc tokens``: the operators' command of the token registry (add, list)."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from runtime.hooktypes import Command

if TYPE_CHECKING:
    from runtime.service import Service


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
    # Imported here: `flowsvc --help` reads this module and needs no database.
    from plugins.chain.tokens import list_tokens, upsert_token
    from runtime.errors import Conflict, InvalidRequest

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


TOKENS_COMMAND = Command(name="tokens", help="manage the tokens projects attach to",
                         add_arguments=_add_arguments, run=_run)
