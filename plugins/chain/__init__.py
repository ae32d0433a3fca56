"""Chain: the token registry, and (not built yet) read-only aggregation of the FLOW token's
on-chain state for the caller (balances, limits, claimable GWT, tree position) and
watching balances.

The token registry (``tokens``) holds the tokens projects attach to and agents link to:
operators maintain it with ``flowsvc tokens`` and ``PUT /internal/tokens/<slug>``, and
other plugins read it through the ``runtime.contracts.tokens.TOKENS`` contract. The plugin
also declares the webhook event it will emit, ``flow.balance.low``, so that integrators
can subscribe to it. ``docs/chain.md`` documents it.
"""
