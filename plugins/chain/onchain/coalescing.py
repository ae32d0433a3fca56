"""The ``eth_call``s of concurrent reads of one chain, sent together.

A call made while no exchange of its chain's ``CallCoalescer`` is under way leaves at once,
as one ``eth_call``. A call made while one is under way waits for it to end, then leaves
with every other call that came meanwhile as ONE JSON-RPC batch (one HTTP exchange), sent by
the first of them (a plain ``eth_call`` when it is alone); the exchange after it likewise.
Alone, a call costs what it did; under load one exchange serves several requests: these
reads ask the node at most once at a time per chain, and the HTTP exchange (the per-chain
cost of an on-chain read) is paid once per batch instead of once per request.

Every call keeps its own answer and its own error: a batch item the node refused
(``BatchAnswer.error``) fails only its caller; a failure of the whole exchange (no URL
answered, ...) fails every caller of the batch. A caller whose deadline passes while it
waits leaves the queue with ``RpcUnavailable``. A sender cancelled during its exchange (its
request went away) puts the other callers of its batch back at the front of the queue: the
next of them sends them again (an ``eth_call`` is a read, safe to repeat).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import trio

from plugins.chain.endpoint import BatchAnswer
from plugins.chain.rpc import RpcPool
from plugins.chain.rpc_errors import RpcError, RpcUnavailable


class _Queued:
    """One call waiting for its chain's exchange: woken to be answered or to send."""

    __slots__ = ("params", "deadline", "woken", "sends", "gone", "answer", "error")

    def __init__(self, params: Sequence[Any], deadline: float) -> None:
        self.params = params
        self.deadline = deadline
        self.woken = trio.Event()
        self.sends = False  # woken to send the next batch
        self.gone = False  # its caller left before an answer (cancelled, deadline passed)
        self.answer: BatchAnswer | None = None
        self.error: RpcError | None = None

    def settle(self, answer: BatchAnswer | None, error: RpcError | None) -> None:
        self.answer, self.error = answer, error
        self.woken.set()


class CallCoalescer:
    """The ``eth_call``s of one chain's reads (one per chain per service, see the module)."""

    def __init__(self, pool: RpcPool) -> None:
        self.pool = pool
        self.busy = False  # an exchange is under way, or its next sender is woken
        self.queue: list[_Queued] = []

    async def call(self, params: Sequence[Any], *, deadline: float) -> Any:
        """The result of ``eth_call(*params)``.

        :raises RpcError: as ``RpcPool.call`` (``RpcUnavailable`` once ``deadline`` passed).
        """
        if not self.busy:
            self.busy = True
            try:
                return await self.pool.call("eth_call", params, deadline=deadline)
            finally:
                self._hand_over()
        queued = _Queued(params, deadline)
        self.queue.append(queued)
        try:
            with trio.move_on_at(deadline):
                await queued.woken.wait()
        except BaseException:  # cancelled: its request went away
            self._leave(queued)
            raise
        if not queued.woken.is_set():
            self._leave(queued)
            raise RpcUnavailable(f"chain {self.pool.chain}: no answer before the deadline "
                                 "(queued behind another exchange)")
        if queued.sends:
            await self._send_queue(queued)
        if queued.error is not None:
            raise queued.error
        assert queued.answer is not None
        return queued.answer.unwrap()

    async def _send_queue(self, sender: _Queued) -> None:
        """Send every queued call (``sender`` first among them) as one batch and settle
        each; what is left unsettled (``sender`` cancelled) is queued again."""
        batch, self.queue = self.queue, []
        deadline = max(queued.deadline for queued in batch)
        try:
            if len(batch) == 1:  # alone in the queue: a plain eth_call
                answers = [BatchAnswer(result=await self.pool.call(
                    "eth_call", sender.params, deadline=deadline))]
            else:
                answers = await self.pool.batch(
                    [("eth_call", queued.params) for queued in batch], deadline=deadline)
        except RpcError as error:
            for queued in batch:
                queued.settle(None, error)
        else:
            for queued, answer in zip(batch, answers, strict=True):
                queued.settle(answer, None)
        finally:
            self.queue[:0] = [queued for queued in batch if queued is not sender
                              and not queued.woken.is_set() and not queued.gone]
            self._hand_over()

    def _leave(self, queued: _Queued) -> None:
        """``queued``'s caller leaves before its answer. Woken to send (a cancellation can
        come after the wake-up), it is still first in the queue: the next call sends."""
        if queued.sends:
            self.queue.remove(queued)
            self._hand_over()
        elif not queued.woken.is_set():
            queued.gone = True
            if queued in self.queue:  # else it is in a batch under way
                self.queue.remove(queued)

    def _hand_over(self) -> None:
        """An exchange ended: wake the first queued call to send the queue, or free the
        chain."""
        if self.queue:
            first = self.queue[0]
            first.sends = True
            first.woken.set()
        else:
            self.busy = False
