"""What the on-chain endpoints derive from the indexer's raw logs (``chain_logs``): a user's
subtree counted by level from ``UserPlaced``, and the launcher of a bonding-curve token from
the factory's ``Launched``. Sync functions on an open connection (``service.db.read``).

Both follow the indexed chain, reorgs included (the indexer deletes the logs of dropped
blocks). ``tree_children`` reads every placement of an instance, so its callers keep the map
per indexed block (``reads.ChainReads.children``); a per-ancestor counter kept by the indexer
would make even that unnecessary.
"""

from __future__ import annotations

import json
from collections import defaultdict

from eth_abi.abi import decode
from eth_abi.exceptions import DecodingError
from sqlalchemy import Connection, select

from plugins.chain.abi import AbiDecodeError, hex_bytes
from plugins.chain.contracts import LAUNCHPAD_FACTORY
from plugins.chain.indexed import LEVELS
from plugins.chain.tables import FINAL_LOGS, POSITION_LOGS, logs

Children = dict[str, list[str]]


def tree_children(connection: Connection, chain_id: int, instance: str) -> Children:
    """Every placement in the tree of the dpnm token at ``instance``, from the indexed
    ``UserPlaced`` logs: each parent's children (lowercase addresses)."""
    children: defaultdict[str, list[str]] = defaultdict(list)
    for (raw_topics,) in connection.execute(
            select(logs.c.topics).where(logs.c.chain_id == chain_id, POSITION_LOGS,
                                        logs.c.instance == instance.lower(),
                                        logs.c.event == "UserPlaced")):
        topics = json.loads(raw_topics)
        children["0x" + topics[3][-40:]].append("0x" + topics[1][-40:])
    return dict(children)


def subtree_by_level(children: Children, address: str) -> list[int]:
    """How many users sit 1, 2, ... 10 levels below ``address`` (ten counts)."""
    counts = [0] * LEVELS
    frontier = [address.lower()]
    for level in range(LEVELS):
        frontier = [child for node in frontier for child in children.get(node, ())]
        counts[level] = len(frontier)
    return counts


def bonding_of(connection: Connection, chain_id: int, factory: str, token: str) -> str | None:
    """The Bonding contract that launched ``token`` through ``factory`` (the first field of
    the ``virtuals`` launch parameters), or None while its ``Launched`` is not indexed."""
    launched = LAUNCHPAD_FACTORY.events["Launched"]
    for raw_topics, data in connection.execute(
            select(logs.c.topics, logs.c.data).where(
                logs.c.chain_id == chain_id, FINAL_LOGS, logs.c.address == factory.lower(),
                logs.c.event == "Launched", logs.c.topics.contains(token.lower()[2:]))):
        try:
            args = launched.decode_args([hex_bytes(topic) for topic in json.loads(raw_topics)],
                                        hex_bytes(data))
            if args["instance"].lower() != token.lower():
                continue
            bonding, _name, _ticker = decode(["address", "string", "string"], args["params"])
        except (AbiDecodeError, DecodingError):
            return None
        return str(bonding).lower()
    return None
