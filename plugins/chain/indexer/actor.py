"""The indexer of one chain: an actor that holds the chain's lease and follows it.

Each pass asks the node for its head (a URL whose head is behind the final block is lagging:
the pool fails over, it is not a reorg) and then:

- **history**: while the next block is final (``head - finality_depth``), logs of the
  followed contracts come by adaptive ``eth_getLogs`` ranges (``logrange``); each range
  commits in one transaction with its cursor and its final work. The batch that fetches a
  range's last header also asks for the cursor block: a cursor block the node no longer has
  is a reorg seen late (the indexer was behind, restarted, or the node jumped).
- **tip**: block by block, the header (number, hash, parent hash) is kept while not final
  and its logs are fetched by block hash. A parent that is not the indexed head, or a head
  below the indexed one whose block differs, is a reorg.
- **reorgs**, however they are seen: walk back by number to the common ancestor, undo the
  dropped blocks (``store.roll_back``) and index the canonical chain from there. A reorg
  that reaches a block whose final work ran stops the indexer loudly (logged, ``/readyz``
  fails).
- blocks that became final run ``final`` in the same transaction as the step.

The dpnm tokens of the registry are read at start and while idle; one whose instance is no
dpnm instance is marked unreadable (``/readyz``, metrics, ``chain_unreadable_tokens``)
instead of followed. Requests to the node are ``node``'s.

A factory ``Launched`` of a dpnm instance adds its protocol and tree to the followed
contracts at once, and their logs of the same range are fetched before the range commits.
An outage (RPC or database down) is waited out with capped backoff; a URL whose head stops
advancing for ``stall_timeout_seconds`` is cooled down so another URL serves (the watchdog).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from functools import partial
from typing import Any

import trio

from plugins.chain import alerts
from plugins.chain.contracts import ERC20, TEMPLATES
from plugins.chain.indexer import store
from plugins.chain.indexer.committing import Committing
from plugins.chain.indexer.final import FinalWork, run_final
from plugins.chain.indexer.logs import Followed, RawLog, unique_in_order
from plugins.chain.indexer.node import ChainNode
from plugins.chain.indexer.store import BlockRef, Cursor, LeaseLost, Step, step_of
from plugins.chain.logrange import LogChunk, Topics
from plugins.chain.rpc_errors import RpcDeterministicError, RpcError
from plugins.chain.settings import ChainConfig
from plugins.chain.state import CHAIN
from plugins.chain.views import Ecosystem
from runtime.actors import ActorSpec, Mailbox
from runtime.contracts.chain import FinalTransfer, TransferWatch
from runtime.errors import is_outage
from runtime.service import Service

log = logging.getLogger("flowsvc.chain.indexer")

TRANSFER_TOPIC = "0x" + ERC20.events["Transfer"].topic0.hex()
FOLLOWED_TEMPLATES = ("dpnm", "dpnm-v2")
BACKOFF_INITIAL = 0.5
BACKOFF_MAX = 10.0
ZERO_ADDRESS = "0x" + "00" * 20
USDT_ALIAS = "usdt"  # a watch's token meaning the chain's configured USDT


class DeepReorg(Exception):
    """A reorg reached a block the indexer holds as final: nothing is rolled back."""


def indexer_actor(service: Service, chain: ChainConfig) -> ActorSpec:
    """The actor indexing ``chain`` (``chain.indexer.<name>``)."""

    async def run(mailbox: Mailbox, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        await ChainIndexer(service, chain).run()

    return ActorSpec(f"chain.indexer.{chain.name}", run, shutdown_timeout=10.0)


class ChainIndexer:
    def __init__(self, service: Service, chain: ChainConfig) -> None:
        state = service.state(CHAIN)
        self.service = service
        self.chain = chain
        self.owner = state.owner
        self.lease_seconds = state.settings.lease_seconds
        self.status = state.indexers[chain.id]
        self.metrics = state.indexer_metrics
        self.node = ChainNode(chain, state.pools[chain.id], state.indexer_metrics)
        self.followed = Followed(chain.factory)
        self.flow_token: str | None = None
        self.watched: dict[str, set[str]] = {}
        self.cursor = Cursor(None, None, {})
        self.renewed_at = -math.inf
        self.backoff = BACKOFF_INITIAL
        self.unreadable: dict[str, tuple[str, str]] = {}  # instance: name in /readyz, why
        self.registry_read_at = -math.inf

    async def run(self) -> None:
        try:
            while True:
                try:
                    await self.lead()
                except LeaseLost as error:
                    self.status.state = "standby"
                    log.warning("chain %s: %s", self.chain.name, error)
                except DeepReorg as error:
                    self.status.state = "stopped"
                    self.status.stopped_reason = str(error)
                    log.critical("chain %s: indexer stopped: %s (the indexed data stays as it "
                                 "was; see docs/chain.md)", self.chain.name, error)
                    await trio.sleep_forever()
                except Exception as error:
                    if not _waitable(error):
                        raise
                    self.status.waiting = str(error)
                    log.warning("chain %s: waiting %.1f s for an outage: %s", self.chain.name,
                                self.backoff, error)
                    await trio.sleep(self.backoff)
                    self.backoff = min(self.backoff * 2, BACKOFF_MAX)
        finally:
            # Give the chain back at once rather than after the lease runs out; a database
            # that is down now leaves that to the expiry.
            with trio.move_on_after(2) as cleanup:
                cleanup.shield = True
                try:
                    await self.service.db.write(store.release_lease, self.chain.id, self.owner)
                except Exception as error:
                    if not is_outage(error):
                        raise
                    log.warning("chain %s: the lease is left to expire: %s", self.chain.name,
                                error)

    async def lead(self) -> None:
        """Take the lease, then index until something stops it."""
        self.cursor = await self.acquire()
        await self.prepare()
        while True:
            progressed = await self.advance()
            self.status.waiting = None
            self.backoff = BACKOFF_INITIAL
            if not progressed:
                await self.renew_if_due()
                await self.follow_registered_if_due()
                await trio.sleep(self.chain.poll_interval_seconds)

    async def acquire(self) -> Cursor:
        while True:
            cursor = await self.service.db.write(store.take_lease, self.chain.id, self.owner,
                                                 self.lease_seconds)
            if cursor is not None:
                self.renewed_at = trio.current_time()
                self.status.indexed_hash = cursor.head.hash if cursor.head else None
                if self.status.state != "indexing":
                    log.info("chain %s: this process indexes the chain", self.chain.name)
                    self.status.state = "indexing"
                return cursor
            self.status.state = "standby"
            await trio.sleep(self.lease_seconds / 3)

    async def renew_if_due(self) -> None:
        if trio.current_time() - self.renewed_at >= self.lease_seconds / 3:
            await self.service.db.write(store.hold_lease, self.chain.id, self.owner,
                                        self.lease_seconds)
            self.renewed_at = trio.current_time()

    async def prepare(self) -> None:
        """The transfers watched on this chain, and the contracts followed: the factory, the
        configured FLOW instance, the dpnm tokens of the registry and those launched."""
        self.watched = {}
        for watches in self.service.pm.hook.flowsvc_chain_watches(service=self.service):
            for watch in watches or []:
                assert isinstance(watch, TransferWatch)
                if watch.chain_id == self.chain.id:
                    address = (self.chain.usdt if watch.token == USDT_ALIAS
                               else watch.token.lower())
                    self.watched.setdefault(address, set()).add(watch.recipient.lower())
        launched = await self.service.db.read(store.launched_instances, self.chain.id,
                                              self.chain.factory)
        self.unreadable = {}  # checked again each time the lease is taken
        await self.follow_instances({
            self.chain.flow_instance: "flow_instance",
            **{instance: instance for instance, template in map(_launched, launched)
               if template in FOLLOWED_TEMPLATES},
            **await self.service.db.read(store.registered_instances, self.chain.id)})

    async def follow_registered_if_due(self) -> None:
        """Follow the dpnm tokens registered since the registry was last read; a slug moved
        off an unreadable instance (its registration fixed) is named no more."""
        if trio.current_time() - self.registry_read_at < self.chain.registry_interval_seconds:
            return
        registered = await self.service.db.read(store.registered_instances, self.chain.id)
        slugs = set(registered.values())
        self.unreadable = {instance: (name, why) for instance, (name, why)
                           in self.unreadable.items()
                           if name not in slugs or registered.get(instance) == name}
        await self.follow_instances(registered)

    async def follow_instances(self, names: dict[str, str]) -> None:
        """Follow the dpnm instances of ``names`` (instance to the name ``/readyz`` gives it:
        the slug) not followed yet. One whose ``ecosystem()`` cannot be read (an EOA,
        Multicall3, another contract) is marked unreadable: logged, named in ``/readyz`` and
        the metrics, and stored for the on-chain endpoint; the others are indexed as usual."""
        self.registry_read_at = trio.current_time()
        readable: list[str] = []
        unreadable: dict[str, str] = {}
        try:
            for instance, name in names.items():
                if instance in self.followed.instances or instance in self.unreadable:
                    continue
                ecosystem = await self.node.ecosystem(instance, "latest")
                if ecosystem is not None:
                    self.follow(instance, ecosystem)
                    readable.append(instance)
                    continue
                unreadable[instance] = (f"{instance}: ecosystem() reverts or answers nothing a "
                                        "dpnm instance answers: not a FLOW (dpnm) instance")
                self.unreadable[instance] = (name, unreadable[instance])
                log.error("chain %s: token %s is unreadable and not indexed: %s",
                          self.chain.name, name, unreadable[instance])
        finally:
            # What was learnt before an outage stopped the loop is stored too: an instance
            # followed now is not checked again, so its old mark must go.
            self.status.unreadable = dict(self.unreadable.values())
            self.metrics.unreadable.labels(self.chain.name).set(len(self.unreadable))
            if readable or unreadable:
                await self.service.db.write(store.mark_unreadable, self.chain.id, unreadable,
                                            readable)

    def follow(self, instance: str, ecosystem: Ecosystem) -> list[str]:
        if instance == self.chain.flow_instance:
            self.flow_token = ecosystem.flow.lower()
        return self.followed.add(instance, ecosystem.protocol.lower(), ecosystem.tree.lower())

    async def advance(self) -> bool:
        """One step forward (or back, on a reorg); False when there was nothing to do."""
        head = await self.node.head(self.cursor.final_number)
        final_head = head - self.chain.finality_depth
        current = self.cursor.head
        self.status.head = head
        self.metrics.head_lag.labels(self.chain.name).set(
            head - current.number if current is not None else head)
        next_number = current.number + 1 if current is not None else self.chain.start_block
        if next_number <= final_head:
            await self.history(next_number, final_head)
            return True
        if current is not None and head < current.number:
            return await self.check_shorter_chain(head)
        if next_number <= head:
            await self.tip(next_number, head)
            return True
        return False

    # ---- history: final ranges

    async def history(self, first: int, last: int) -> None:
        """Index final blocks ``first..last`` range by range. Each range's transaction runs in
        the background while the next range is read from the node (``Committing``); ranges
        still commit one after the other, and nothing commits after one that failed."""
        error: Exception | None = None
        async with trio.open_nursery() as nursery:
            committing = Committing(nursery, self.commit)
            try:
                await self.ranges(first, last, committing)
                await committing.wait()
            except Exception as raised:  # raised as itself, not in an exception group
                error = raised
        if error is not None:
            raise error

    async def ranges(self, first: int, last: int, committing: Committing) -> None:
        """Index ``first..last`` range by range until a reorg or a new contract stops the
        walk. The followed contracts' logs come in the same ``eth_getLogs`` as the FLOW
        token's (one range scan in the node instead of two): its ``Transfer``s are what the
        final work needs, its other logs are dropped. Each range is fetched while the one
        before is indexed (``fetch_ahead``): the node scans the next range meanwhile."""
        addresses = self.followed.addresses()
        flow = self.flow_token
        if flow is not None and flow not in self.followed.by_address:
            addresses = sorted([*addresses, flow])
        send, receive = trio.open_memory_channel[LogChunk | Exception](0)
        error: Exception | None = None
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self.fetch_ahead, send, addresses, first, last)
            try:
                async for chunk in receive:
                    if isinstance(chunk, Exception):
                        raise chunk
                    if not await self.index_range(chunk, flow, committing):
                        break
            except Exception as raised:  # raised as itself, not in an exception group
                error = raised
            finally:
                nursery.cancel_scope.cancel()  # the range fetched ahead, if any, is dropped
        if error is not None:
            raise error

    async def fetch_ahead(self, send: trio.MemorySendChannel[LogChunk | Exception],
                          addresses: list[str], first: int, last: int) -> None:
        """Send the logs of ``first..last`` chunk by chunk, then close ``send``; what fails
        is sent as the last item. ``send`` holds nothing: one chunk is fetched ahead of the
        one being indexed."""
        async with send:
            try:
                async with self.node.walk(addresses, [], first, last) as chunks:
                    async for chunk in chunks:
                        await send.send(chunk)
            except Exception as error:
                await send.send(error)

    async def index_range(self, chunk: LogChunk, flow: str | None,
                          committing: Committing) -> bool:
        """Index one range fetched by ``fetch_ahead`` (``flow``: the FLOW token whose logs it
        holds, if any); False when the walk must stop: a reorg was rolled back, or new
        contracts are followed (the next ranges follow them too)."""
        start, end, raw = chunk

        async def more(addresses: list[str], since: int) -> list[RawLog]:
            return await self.node.logs_in(addresses, [], since, end)

        fetched = [RawLog.of(item) for item in raw]
        followed = self.followed.by_address
        logs, grew = await self.discover(
            [raw_log for raw_log in fetched if raw_log.address in followed], more, hex(end))
        header = await self.canonical_header(end)
        if header is None:
            await committing.wait()
            assert self.cursor.head is not None
            await self.reorg(self.cursor.head.number)
            return False
        flow_logs = None
        if flow is not None and flow == self.flow_token:
            flow_logs = (start, [raw_log for raw_log in fetched if raw_log.address == flow])
        work = await self.final_work(self.first_unfinal(), end, flow_logs)
        step = step_of(self.chain.id, self.followed, logs, [header], header, end,
                       partial(run_final, self.service, self.chain, work))
        await committing.wait()
        committing.start(step)
        # The next range is checked against this one's block: the cursor it commits.
        self.cursor = Cursor(header, end, {end: header})
        return not grew

    # ---- tip: block by block

    async def tip(self, number: int, head: int) -> None:
        header = await self.node.header(number)
        previous = self.cursor.head
        if previous is not None and header.parent_hash != previous.hash:
            await self.reorg(previous.number)
            return

        async def by_hash(addresses: list[str], _since: int) -> list[RawLog]:
            return await self.node.logs_of_block(header, addresses)

        logs, _ = await self.discover(
            await self.node.logs_of_block(header, self.followed.addresses()), by_hash,
            hex(number))
        old_final = self.cursor.final_number
        final_number = min(number, head - self.chain.finality_depth)
        if old_final is not None:
            final_number = max(final_number, old_final)
        first_final = self.first_unfinal()
        on_final = None
        if first_final <= final_number:
            work = await self.final_work(first_final, final_number)
            on_final = partial(run_final, self.service, self.chain, work)
        await self.commit(step_of(self.chain.id, self.followed, logs, [header], header,
                                  final_number, on_final))
        recent = {n: block for n, block in self.cursor.recent.items() if n >= final_number}
        recent[number] = header
        self.cursor = Cursor(header, final_number, recent)

    def first_unfinal(self) -> int:
        """The first block whose final work has not run: blocks counted at the tip stay
        unfinal until a later step (at the tip or by history ranges) makes them final."""
        final = self.cursor.final_number
        return max(final + 1 if final is not None else 0, self.chain.start_block)

    async def canonical_header(self, number: int) -> BlockRef | None:
        """The header of block ``number``, or None when the block the cursor is on is no
        longer the node's: a reorg seen late (the indexer was behind, restarted, or the node
        jumped more than ``finality_depth`` blocks). One request: a batch of both headers,
        asked after the range's logs, so a reorg during the range is seen too."""
        current = self.cursor.head
        if current is None:
            return await self.node.header(number)
        header, node = await self.node.headers([number, current.number])
        return header if node.hash == current.hash else None

    async def check_shorter_chain(self, head: int) -> bool:
        """The node's head is below the indexed one: a reorg to a shorter branch if its block
        at that height differs from ours, else a node behind (wait for it)."""
        stored = self.cursor.recent.get(head)
        if stored is not None and (await self.node.header(head)).hash != stored.hash:
            await self.reorg(head)
            return True
        return False

    async def reorg(self, number: int) -> None:
        """Walk back from ``number`` to the newest block the node and the index share, and
        roll back everything after it.

        :raises DeepReorg: the walk reaches the final block and it differs too.
        """
        final = self.cursor.final_number
        while True:
            stored = self.cursor.recent.get(number)
            if stored is None:
                raise DeepReorg(f"block {number} differs from the indexed one and is not kept "
                                f"(final block {final})")
            node = await self.node.header(number)
            if node.hash == stored.hash:
                break
            if final is not None and number <= final:
                raise DeepReorg(f"final block {number} changed from {stored.hash} to "
                                f"{node.hash}: a reorg deeper than finality_depth "
                                f"{self.chain.finality_depth}")
            number -= 1
        assert self.cursor.head is not None
        depth = self.cursor.head.number - stored.number
        await self.service.db.write(store.roll_back, self.chain.id, self.owner,
                                    self.lease_seconds, self.followed, stored)
        self.renewed_at = trio.current_time()
        self.metrics.reorgs.labels(self.chain.name).inc()
        self.metrics.reorg_depth.labels(self.chain.name).observe(depth)
        log.warning("chain %s: reorg: %d block(s) after %d (%s) rolled back", self.chain.name,
                    depth, stored.number, stored.hash)
        self.status.indexed_hash = stored.hash
        self.cursor = Cursor(stored, final, {n: block for n, block in self.cursor.recent.items()
                                             if n <= stored.number})

    # ---- contracts launched on the way

    async def discover(self, logs: list[RawLog],
                       more: Callable[[list[str], int], Awaitable[list[RawLog]]],
                       block: str) -> tuple[list[RawLog], bool]:
        """Follow the dpnm instances launched in ``logs`` and add their contracts' logs
        (``more(addresses, since_block)``); return every log in order and whether any new
        contract is followed."""
        found, pending, grew = list(logs), logs, False
        while pending:
            new: list[str] = []
            since = math.inf
            for raw in pending:
                if raw.address != self.chain.factory:
                    continue
                instance, template = _launched(raw)
                if template not in FOLLOWED_TEMPLATES or instance in self.followed.instances:
                    continue
                ecosystem = await self.node.ecosystem(instance, block)
                if ecosystem is None:
                    log.warning("chain %s: launched instance %s has no ecosystem(): not "
                                "followed", self.chain.name, instance)
                    continue
                new.extend(self.follow(instance, ecosystem))
                since = min(since, raw.block_number)
            pending = await more(new, int(since)) if new else []
            found.extend(pending)
            grew = grew or bool(new)
        return unique_in_order(found), grew

    # ---- final blocks

    async def final_work(self, first: int, last: int,
                         flow_logs: tuple[int, list[RawLog]] | None = None) -> FinalWork:
        """Read what final blocks ``first..last`` need besides the followed logs: the watched
        transfers (with their blocks' times) and the FLOW balances of alerted users whose
        FLOW moved, at ``last``. ``flow_logs``: (``since``, the FLOW token's logs of blocks
        ``since..last``) when they came with the followed logs; the blocks before ``since``
        are asked for here."""
        transfers: list[FinalTransfer] = []
        for token, recipients in sorted(self.watched.items()):
            topics: Topics = [TRANSFER_TOPIC, None,
                              [_topic(address) for address in sorted(recipients)]]
            found = await self.node.logs_in([token], topics, first, last)
            times = await self.node.block_times(sorted({raw.block_number for raw in found}))
            transfers.extend(_transfer(self.chain.id, raw, times[raw.block_number])
                             for raw in found)
        balances: dict[str, int] = {}
        if self.flow_token is not None:
            since, found = flow_logs if flow_logs is not None else (last + 1, [])
            if first < since:
                found = [*await self.node.logs_in([self.flow_token], [TRANSFER_TOPIC], first,
                                                  since - 1), *found]
            moved = {"0x" + topic[-40:] for raw in found
                     if raw.topics[:1] == (TRANSFER_TOPIC,) and raw.block_number >= first
                     for topic in raw.topics[1:3]}
            alerted = await self.service.db.read(alerts.alerted_addresses,
                                                 sorted(moved - {ZERO_ADDRESS}))
            balances = await self.node.balances(self.flow_token, alerted, last)
        return FinalWork(first, last, transfers, balances)

    async def commit(self, step: Step) -> None:
        await self.service.db.write(store.commit_step, self.chain.id, self.owner,
                                    self.lease_seconds, step)
        self.renewed_at = trio.current_time()
        self.metrics.logs.labels(self.chain.name).inc(len(step.rows))
        self.metrics.indexed_block.labels(self.chain.name).set(step.head.number)
        self.status.indexed = step.head.number
        self.status.indexed_hash = step.head.hash
        self.status.final = step.final_number

def _waitable(error: BaseException) -> bool:
    """An outage to wait out: the database or every RPC URL down, a range refused again and
    again. A deterministic RPC error means our request is wrong: a bug."""
    return is_outage(error) or (isinstance(error, RpcError)
                                and not isinstance(error, RpcDeterministicError))


def _launched(raw: RawLog) -> tuple[str, str | None]:
    """(instance, template) of a factory ``Launched`` log."""
    event = raw.event
    if event is None or event.interface != "LaunchpadFactory":
        return "", None
    return event.args["instance"].lower(), TEMPLATES.get(bytes(event.args["id"]))


def _topic(address: str) -> str:
    return "0x" + "00" * 12 + address.lower().removeprefix("0x")


def _transfer(chain_id: int, raw: RawLog, time: int) -> FinalTransfer:
    return FinalTransfer(
        chain_id=chain_id, token=raw.address, sender="0x" + raw.topics[1][-40:],
        recipient="0x" + raw.topics[2][-40:], amount=int(raw.data, 16), tx_hash=raw.tx_hash,
        log_index=raw.log_index, block_number=raw.block_number, block_hash=raw.block_hash,
        block_time=datetime.fromtimestamp(time, UTC))
