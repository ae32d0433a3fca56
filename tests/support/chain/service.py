"""A flowsvc service configured with chains (the ``[plugins.chain] chains`` list) for the
indexer's tests."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from tests.support.chain.deploy import Platform


def chain_entry(platform: Platform, urls: Sequence[str], *, name: str = "", instance: str,
                chain_id: int | None = None, **overrides: Any) -> dict[str, Any]:
    """One ``[[plugins.chain.chains]]`` table for a deployed reference stack: fast polling
    and a finality depth of 2 blocks unless ``overrides`` say otherwise."""
    return {"id": chain_id if chain_id is not None else platform.chain_id,
            "name": name or f"chain{platform.chain_id}", "rpc_urls": list(urls),
            "multicall3": platform.multicall, "factory": platform.factory,
            "usdt": platform.usdt, "flow_instance": instance, "finality_depth": 2,
            "poll_interval_seconds": 0.1, "stall_timeout_seconds": 10,
            "rpc_timeout_seconds": 2, **overrides}


def chains_env(entries: Sequence[Mapping[str, Any]]) -> dict[str, str]:
    """The environment variable that sets the chains list."""
    return {"FLOWSVC_PLUGINS_CHAIN_CHAINS": json.dumps(list(entries))}
