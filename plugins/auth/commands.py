"""Operator commands of the auth plugin: ``flowsvc access-codes create [--count N]``."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from runtime.hooktypes import Command

if TYPE_CHECKING:
    from runtime.service import Service


def _add_arguments(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="action", required=True)
    create = actions.add_parser("create", help="create single-use access codes and print them")
    create.add_argument("--count", type=int, default=1, choices=range(1, 10001),
                        metavar="N", help="how many codes (1 to 10000, default 1)")


async def _run(service: Service, args: argparse.Namespace) -> int:
    # Imported here: `flowsvc --help` reads this module and needs no database.
    from plugins.auth.identities import new_access_codes

    for code in await service.db.write(new_access_codes, args.count):
        print(code)
    return 0


ACCESS_CODES = Command(name="access-codes", help="manage single-use access codes",
                       add_arguments=_add_arguments, run=_run)
