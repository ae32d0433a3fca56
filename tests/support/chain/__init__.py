"""A real EVM chain for the chain plugin's tests: anvil, our reference contracts, a faulty proxy.

``anvil`` runs anvil processes; ``rpc`` is a JSON-RPC client; ``contracts`` loads the compiled
artifacts of ``contracts/`` and sends signed transactions; ``deploy`` puts the whole stack on a
chain; ``actions`` are what users and tests do on it (trades, time travel, reorgs);
``rpc_proxy`` stands in front of an anvil and misbehaves on demand.
"""
