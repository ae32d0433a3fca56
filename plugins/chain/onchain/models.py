"""Query and response models of the on-chain endpoints, for validation and ``/openapi.json``.

Amounts are exact decimal strings (18 decimals, trailing zeros trimmed); counts and Unix
times are numbers; addresses are lowercase ``0x`` hex.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from plugins.chain.indexed import LEVELS

Amount = str
Address = str


class ChainQuery(BaseModel):
    model_config = ConfigDict(extra="forbid")
    chainId: int | None = Field(None, ge=1, description="read this configured chain only")


class TreeQuery(ChainQuery):
    depth: int = Field(3, ge=1, le=LEVELS,
                       description="tree levels walked for subtreeByLevel (1 to 10)")


class TreePosition(BaseModel):
    upline: Address | None = Field(description="null for the tree's root")
    directSlots: list[Address | None] = Field(min_length=3, max_length=3)
    subtreeSize: int
    subtreeByLevel: list[int] = Field(min_length=LEVELS, max_length=LEVELS)


class FlowChain(BaseModel):
    chainId: int
    chainName: str
    blockNumber: int = Field(description="the block every figure of this entry was read at")
    flowBalance: Amount
    usdtBalance: Amount
    gwtBalance: Amount
    currentPrice: Amount
    dailyLimitTotal: Amount
    dailyLimitRemaining: Amount
    incomeLimitRemaining: Amount
    lifetimeIncome: Amount
    treeActiveUntil: int
    treeActiveDaysLeft: int
    claimableGWT: Amount
    tree: TreePosition


class MissingChain(BaseModel):
    chainId: int
    chainName: str
    code: str = Field(description="chain_unavailable")
    message: str


class FlowOnchainResponse(BaseModel):
    address: Address
    chains: list[FlowChain]
    unavailable: list[MissingChain] = Field(
        description="configured chains that could not be read, and why; empty when all "
                    "answered")


class DirectView(BaseModel):
    address: Address
    active: bool
    subtreeSize: int


class TreeResponse(BaseModel):
    address: Address
    chainId: int
    blockNumber: int
    depth: int
    upline: Address | None
    subtreeByLevel: list[int] = Field(min_length=LEVELS, max_length=LEVELS)
    lifetimeEarnedByLevel: list[Amount] = Field(min_length=LEVELS, max_length=LEVELS)
    directs: list[DirectView | None] = Field(min_length=3, max_length=3)


class DpnmOnchain(BaseModel):
    template: Literal["dpnm"]
    slug: str
    chainId: int
    blockNumber: int
    indexedBlock: int | None = Field(description="the newest block the counters include")
    instance: Address
    flowProtocol: Address
    currentPrice: Amount
    poolUsdt: Amount
    totalSupply: Amount
    totalActivePositions: int
    totalTreePositions: int
    lifetimeFeesUsdt: Amount
    lifetimeGwtMinted: Amount


class Reserves(BaseModel):
    token: Amount
    asset: Amount = Field(description="includes the curve's virtual liquidity")


class VirtualsOnchain(BaseModel):
    template: Literal["virtuals"]
    slug: str
    chainId: int
    blockNumber: int
    instance: Address = Field(description="the token")
    bonding: Address
    pair: Address
    name: str
    ticker: str
    graduated: bool
    trading: bool
    tradingOnUniswap: bool
    agentToken: Address | None = Field(description="null until graduated")
    totalSupply: Amount
    reserves: Reserves
    gradThreshold: Amount
    price: Amount = Field(description="asset per token from the pair's reserves, 18 decimals "
                                      "rounded down")
    marketCap: Amount = Field(description="price x total supply, in the asset")
    lastUpdated: int


class TokenOnchainResponse(BaseModel):
    """``dpnm`` or ``virtuals``, told apart by ``template``."""

    token: DpnmOnchain | VirtualsOnchain
