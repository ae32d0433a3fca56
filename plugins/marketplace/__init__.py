"""Marketplace: agents, their publication, per-tool FLOW prices, subscriptions to agents,
ratings, runs of published agents billed to the caller's API key, and the ranked listing."""
