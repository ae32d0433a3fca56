"""Chain: the token registry, the RPC pools of the configured chains, the indexer and the
read-only on-chain endpoints. The service never signs anything on chain.

- The token registry (``tokens``) holds the tokens projects attach to and agents link to:
  operators maintain it with ``flowsvc tokens`` and ``PUT /internal/tokens/<slug>``, the
  indexer adds the instances the factory launches, and other plugins read it through the
  ``runtime.contracts.tokens.TOKENS`` contract.
- ``settings`` and ``state``: the chains of ``[plugins.chain]`` and one ``RpcPool`` per
  chain (``rpc``, ``endpoint``, ``logrange``...), opened and checked by the ``chain.rpc``
  actor.
- ``indexer``: one actor per chain filling what no contract exposes as a view (``indexed``
  reads it), calling ``flowsvc_chain_transfer`` and emitting ``payout.sent`` and
  ``flow.balance.low`` (``alerts``, ``alert_routes``).
- ``onchain``: ``/me/flow-onchain``, ``/me/tree``, ``/tokens/<slug>/onchain``.

``docs/chain.md`` and ``docs/chain-reads.md`` document it.
"""
