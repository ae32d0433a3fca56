"""The whole reference stack on a chain, and typed handles on its parts.

``deploy_stack`` deploys test USDT, the bonding asset (VIRTUAL), the launchpad factory and the
bonding launcher, places Multicall3 at its canonical address, and launches one dpnm instance
and one bonding-curve token through the factory. It returns a ``Deployment``: addresses and
the keys of the accounts it made, nothing bound to a connection, so a module-scoped fixture can
deploy once (in its own ``trio.run``) and every test reopens handles on its own ``Chain`` with
``dpnm_of`` / ``virtuals_of``. ``launch_dpnm`` gives a test an instance of its own.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from eth_abi import abi as codec
from eth_account import Account
from eth_account.signers.local import LocalAccount
from eth_utils.crypto import keccak

from tests.support.chain.contracts import Chain, Contract, artifact

MULTICALL3 = "0xcA11bde05977b3631167028862bE2a173976CA11"
ZERO_ADDRESS = "0x" + "00" * 20
DPNM = keccak(text="dpnm")
VIRTUALS = keccak(text="virtuals")
UNIT = 10**18  # every token here has 18 decimals
INITIAL_PRICE = UNIT  # 1 USDT per FLOW while no FLOW exists
BONDING_SUPPLY = 1_000_000_000 * UNIT
BONDING_VIRTUAL_LIQUIDITY = 6_000 * UNIT
BONDING_GRAD_THRESHOLD = 125_000_000 * UNIT


@dataclass(frozen=True)
class DpnmAddresses:
    instance: str
    protocol: str
    flow: str
    gwt: str
    tree: str
    treasury: str
    root_key: str  # the root's private key: tests act as the root too


@dataclass(frozen=True)
class VirtualsAddresses:
    token: str
    pair: str


@dataclass(frozen=True)
class Platform:
    """What every launched token shares."""

    chain_id: int
    usdt: str
    asset: str  # what bonding-curve tokens trade against (VIRTUAL)
    factory: str
    bonding: str
    router: str
    multicall: str


@dataclass(frozen=True)
class Deployment:
    platform: Platform
    dpnm: DpnmAddresses
    virtuals: VirtualsAddresses


@dataclass(frozen=True)
class Dpnm:
    """One dpnm instance: the instance, its protocol and parts, and the USDT it trades."""

    instance: Contract
    protocol: Contract
    flow: Contract
    gwt: Contract
    tree: Contract
    usdt: Contract
    treasury: str
    root: LocalAccount


@dataclass(frozen=True)
class Virtuals:
    """One bonding-curve token: the launcher, its router, the token, its pair and the asset."""

    bonding: Contract
    router: Contract
    token: Contract
    pair: Contract
    asset: Contract


async def deploy_stack(chain: Chain) -> Deployment:
    """Deploy every reference contract and launch one token of each template."""
    usdt = await chain.deploy("Token", "Tether USD", "USDT", ZERO_ADDRESS)
    asset = await chain.deploy("Token", "Virtual Protocol", "VIRTUAL", ZERO_ADDRESS)
    factory = await chain.deploy("LaunchpadFactory")
    bonding = await chain.deploy("Bonding", asset.address, BONDING_SUPPLY,
                                 BONDING_VIRTUAL_LIQUIDITY, BONDING_GRAD_THRESHOLD)
    await chain.rpc.call("anvil_setCode", MULTICALL3, artifact("Multicall3").deployed_bytecode)
    platform = Platform(chain.chain_id, usdt.address, asset.address, factory.address,
                        bonding.address, await bonding.call("router"), MULTICALL3)
    dpnm = await launch_dpnm(chain, platform)
    virtuals = await launch_virtuals(chain, platform, "Agent One", "AONE")
    return Deployment(platform, _addresses(dpnm),
                      VirtualsAddresses(virtuals.token.address, virtuals.pair.address))


async def launch_dpnm(chain: Chain, platform: Platform, *,
                      initial_price: int = INITIAL_PRICE, salt: bytes | None = None) -> Dpnm:
    """Launch a fresh dpnm instance through the factory, with a new root and treasury."""
    root: LocalAccount = await chain.new_account()
    treasury: str = Account.create().address
    params = codec.encode(["address", "address", "address", "uint256"],
                            [platform.usdt, treasury, root.address, initial_price])
    factory = chain.contract("LaunchpadFactory", platform.factory)
    receipt = await factory.transact(chain.deployer, "launch", DPNM, params,
                                     salt or os.urandom(32))
    [launched] = factory.events(receipt, "Launched")
    instance = chain.contract("DpnmInstance", launched["instance"])
    flow, gwt, tree, protocol = await instance.call("ecosystem")
    return dpnm_of(chain, platform, DpnmAddresses(instance.address, protocol, flow, gwt, tree,
                                                    treasury, root.key.hex()))


async def launch_virtuals(chain: Chain, platform: Platform, name: str, ticker: str
                          ) -> Virtuals:
    """Launch a bonding-curve token through the factory (template ``virtuals``)."""
    params = codec.encode(["address", "string", "string"], [platform.bonding, name, ticker])
    factory = chain.contract("LaunchpadFactory", platform.factory)
    receipt = await factory.transact(chain.deployer, "launch", VIRTUALS, params, os.urandom(32))
    [launched] = chain.contract("Bonding", platform.bonding).events(receipt, "Launched")
    return virtuals_of(chain, platform, VirtualsAddresses(launched["token"], launched["pair"]))


def dpnm_of(chain: Chain, platform: Platform, addresses: DpnmAddresses) -> Dpnm:
    """Handles on a dpnm instance, bound to ``chain``."""
    return Dpnm(chain.contract("DpnmInstance", addresses.instance),
                chain.contract("FlowProtocol", addresses.protocol),
                chain.contract("Token", addresses.flow), chain.contract("Token", addresses.gwt),
                chain.contract("PhenomenalTree", addresses.tree),
                chain.contract("Token", platform.usdt), addresses.treasury,
                Account.from_key(addresses.root_key))


def virtuals_of(chain: Chain, platform: Platform, addresses: VirtualsAddresses) -> Virtuals:
    """Handles on a bonding-curve token, bound to ``chain``."""
    return Virtuals(chain.contract("Bonding", platform.bonding),
                    chain.contract("FRouter", platform.router),
                    chain.contract("Token", addresses.token),
                    chain.contract("FPair", addresses.pair),
                    chain.contract("Token", platform.asset))


def _addresses(dpnm: Dpnm) -> DpnmAddresses:
    return DpnmAddresses(dpnm.instance.address, dpnm.protocol.address, dpnm.flow.address,
                         dpnm.gwt.address, dpnm.tree.address, dpnm.treasury,
                         dpnm.root.key.hex())

