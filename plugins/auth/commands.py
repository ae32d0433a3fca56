"""Operator commands of the auth plugin: ``flowsvc access-codes create [--count N]``."""

from __future__ import annotations

import argparse
import secrets

from sqlalchemy import Connection, insert

from plugins.auth.identities import hash_code
from plugins.auth.tables import access_codes
from runtime.hooktypes import Command
from runtime.service import Service
from runtime.wire import utcnow


def new_access_codes(connection: Connection, count: int) -> list[str]:
    """Create ``count`` single-use codes; only their hashes are stored."""
    codes = [f"ac_{secrets.token_urlsafe(18)}" for _ in range(count)]
    now = utcnow()
    connection.execute(insert(access_codes),
                       [{"code_hash": hash_code(code), "created_at": now} for code in codes])
    return codes


def _add_arguments(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="action", required=True)
    create = actions.add_parser("create", help="create single-use access codes and print them")
    create.add_argument("--count", type=int, default=1, choices=range(1, 10001),
                        metavar="N", help="how many codes (1 to 10000, default 1)")


async def _run(service: Service, args: argparse.Namespace) -> int:
    for code in await service.db.write(new_access_codes, args.count):
        print(code)
    return 0


ACCESS_CODES = Command(name="access-codes", help="manage single-use access codes",
                       add_arguments=_add_arguments, run=_run)
