"""The chain indexer: one actor per configured chain follows it and fills what no contract
exposes as a view (``docs/chain.md``, section "The indexer").

- ``logs``: the raw logs kept (``RawLog``), which contracts are followed (``Followed``).
- ``derive``: what each log adds to the derived tables, and its inverse on a reorg.
- ``store``: the indexer's transactions: its lease, a step (blocks, logs, cursor) and a
  rollback to a common ancestor.
- ``node``: what the indexer asks the chain's node (head, headers, logs, reads).
- ``final``: what runs once a block is final: the token registry, ``flowsvc_chain_transfer``,
  ``payout.sent`` and ``flow.balance.low``.
- ``actor``: the loop of one chain (history, tip, reorgs, the stall watchdog, outages).
"""
