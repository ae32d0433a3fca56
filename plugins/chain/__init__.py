"""Chain: read-only aggregation of the FLOW token's on-chain state for the caller (balances,
limits, claimable GWT, tree position) and watching balances.

Not built yet. For now the plugin only declares the webhook event it will emit,
``flow.balance.low``, so that integrators can subscribe to it.
"""
