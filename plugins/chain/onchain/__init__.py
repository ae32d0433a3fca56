"""The on-chain read endpoints of the chain plugin: ``GET /me/flow-onchain``, ``GET /me/tree``,
``GET /tokens/<slug>/onchain``, and the 410 answers of the removed ``/me/flow-balance`` and
``/me/payouts``. ``multicall`` batches reads into Multicall3, ``reads`` reads a chain,
``routes`` serves them (``docs/chain.md``, section Endpoints)."""
