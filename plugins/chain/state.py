"""What the chain plugin keeps per service: ``CHAIN``, the configured chains and one RPC pool
per chain, all over one httpx client.

The pools are made on first use (a route may read a chain before the actors run; every URL
then checks its chain id before its first request). The ``chain.rpc`` actor opens them at
start: it checks every URL's ``eth_chainId`` at once, a URL serving another chain stops the
start with one line naming it (redacted) and both ids, and it closes the client at stop.
"""

from __future__ import annotations

import logging
import secrets
from dataclasses import dataclass
from typing import Any

import httpx
import trio

from plugins.chain.endpoint import open_client
from plugins.chain.indexer.metrics import IndexerMetrics
from plugins.chain.indexer.status import IndexerStatus
from plugins.chain.rpc import RpcPool
from plugins.chain.rpc_errors import ChainIdMismatch
from plugins.chain.rpc_metrics import RpcMetrics
from plugins.chain.settings import ChainConfig, ChainSettings
from runtime.actors import ActorSpec, Mailbox
from runtime.config import ConfigError
from runtime.service import Service, StateSlot

log = logging.getLogger("flowsvc.chain")

RPC_ACTOR = "chain.rpc"


@dataclass(frozen=True)
class ChainState:
    """The configured chains, their RPC pools and their indexers' status, by chain id."""

    settings: ChainSettings
    chains: dict[int, ChainConfig]
    pools: dict[int, RpcPool]
    clients: list[httpx.AsyncClient]
    rpc_metrics: RpcMetrics
    indexer_metrics: IndexerMetrics
    indexers: dict[int, IndexerStatus]
    # This process's name on the indexers' leases; it survives restarts of the actors.
    owner: str

    @classmethod
    def create(cls, service: Service) -> ChainState:
        settings = service.plugin_settings("chain", ChainSettings)
        rpc_metrics = RpcMetrics(service.metrics.registry)
        chains = {chain.id: chain for chain in settings.chains}
        pools = {}
        clients = []
        for chain in settings.chains:
            # One client (connection pool) per chain: a chain's requests then never wait
            # for another chain's connections.
            client = open_client()
            clients.append(client)
            pool = RpcPool(chain.rpc_urls, client, chain=chain.name,
                           attempt_timeout=chain.rpc_timeout_seconds,
                           observer=rpc_metrics.for_chain(chain.name))
            pool.expected_chain_id = chain.id  # each URL checks its id before its first use
            pools[chain.id] = pool
        return cls(settings, chains, pools, clients, rpc_metrics,
                   IndexerMetrics(service.metrics.registry),
                   {chain.id: IndexerStatus() for chain in settings.chains},
                   secrets.token_hex(8))

    async def check_chain_ids(self) -> None:
        """Ask every URL of every chain for its chain id, all at once. A URL that does not
        answer now checks it before its first use instead (logged).

        :raises ConfigError: one line naming each URL that serves another chain.
        """
        mismatches: list[str] = []

        async def check(chain: ChainConfig) -> None:
            pool = self.pools[chain.id]
            deadline = trio.current_time() + chain.rpc_timeout_seconds
            try:
                unchecked = await pool.check_chain_ids(chain.id, deadline=deadline)
            except ChainIdMismatch as error:
                mismatches.extend(f"{url} serves chain id {actual}, [plugins.chain] chain "
                                  f"{chain.name!r} is configured with id {chain.id}"
                                  for url, actual in error.mismatches)
                return
            for label in unchecked:
                log.warning("chain %s: RPC URL %s did not answer eth_chainId at start; it is "
                            "checked before its first use", chain.name, label)

        async with trio.open_nursery() as nursery:
            for chain in self.chains.values():
                nursery.start_soon(check, chain)
        if mismatches:
            raise ConfigError("; ".join(mismatches))


CHAIN: StateSlot[ChainState] = StateSlot("chain", ChainState.create)


def rpc_actor(service: Service) -> ActorSpec:
    """The actor that opens the pools at start (chain ids checked) and closes them at stop."""

    async def run(mailbox: Mailbox, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        state = service.state(CHAIN)
        try:
            await state.check_chain_ids()
            task_status.started()
            await trio.sleep_forever()
        finally:
            with trio.CancelScope(shield=True):
                for client in state.clients:
                    await client.aclose()

    return ActorSpec(RPC_ACTOR, run, restart="transient")
