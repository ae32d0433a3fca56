"""The ``[plugins.chain]`` settings table: the chains the service reads and indexes.

Each chain is one ``[[plugins.chain.chains]]`` table of the TOML file; the environment sets
the whole list at once as JSON (``FLOWSVC_PLUGINS_CHAIN_CHAINS='[{"id": 56, ...}]'``).
With no chain (the embedded default) the service runs without an indexer and every chain
route answers a clear error.
"""

from __future__ import annotations

import re

from pydantic import Field, field_validator, model_validator

from runtime.config import Section

MULTICALL3 = "0xca11bde05977b3631167028862be2a173976ca11"
_ADDRESS = re.compile(r"^0x[0-9a-fA-F]{40}$")


def _address(value: str) -> str:
    if not _ADDRESS.fullmatch(value):
        raise ValueError("must be a 0x-prefixed EVM address (40 hex digits)")
    return value.lower()


class ChainConfig(Section):
    """One chain: where to reach it, the contracts flowsvc reads there, how to index it."""

    id: int = Field(gt=0)
    name: str = Field(min_length=1, max_length=32, pattern=r"^[a-z0-9][a-z0-9_-]*$")
    rpc_urls: list[str] = Field(min_length=1)
    multicall3: str = MULTICALL3
    factory: str
    usdt: str
    # The dpnm instance whose FLOW the platform means on this chain (``/me/flow-onchain``).
    flow_instance: str
    start_block: int = Field(0, ge=0)
    finality_depth: int = Field(12, ge=0, le=10_000)
    poll_interval_seconds: float = Field(2.0, gt=0)
    # How often the token registry is read for tokens registered or moved, while idle.
    registry_interval_seconds: float = Field(5.0, gt=0)
    stall_timeout_seconds: float = Field(60.0, gt=0)
    # A cap on eth_getLogs ranges (blocks); None: learned from each URL's answers.
    max_log_range: int | None = Field(None, ge=1)
    rpc_timeout_seconds: float = Field(5.0, gt=0)

    @field_validator("rpc_urls")
    @classmethod
    def _rpc_url_forms(cls, urls: list[str]) -> list[str]:
        for url in urls:
            if not url.startswith(("http://", "https://")):
                raise ValueError("every RPC URL must start with http:// or https://")
        if len(set(urls)) != len(urls):
            raise ValueError("an RPC URL is listed twice")
        return urls

    @field_validator("multicall3", "factory", "usdt", "flow_instance")
    @classmethod
    def _address_form(cls, value: str) -> str:
        return _address(value)


class ChainSettings(Section):
    """On-chain reads, the indexer and the token registry; ``docs/chain.md`` documents every
    key."""

    chains: list[ChainConfig] = []
    # How long a process holds a chain's indexing without renewing it: another process takes
    # over a chain within this many seconds of its indexer's process dying.
    lease_seconds: float = Field(10.0, ge=1, le=300)

    @model_validator(mode="after")
    def _unique_chains(self) -> ChainSettings:
        for key in ("id", "name"):
            values = [getattr(chain, key) for chain in self.chains]
            repeated = sorted({str(value) for value in values if values.count(value) > 1})
            if repeated:
                raise ValueError(f"two chains have the {key} {', '.join(repeated)}")
        return self
