"""API keys: ``/me/api-keys``, key authentication, the per-key rate and spend meter, usage log.

It owns the ``api_keys``, ``api_key_usage`` and ``api_key_usage_rollups`` tables (the log
and its rollups, kept by the core's retention actor: ``plugins.keys.rollups``), the
``keys.directory`` actor (the in-process cache of key records and its invalidation on every
process), the ``keys.meter``
actor (rate and spend per key, in process or in Redis; other plugins charge keys through
it, see ``plugins.keys.meter``) and the ``keys.usage`` actor (the batched usage log).
``docs/keys.md`` describes the endpoints, headers, algorithms and the charge message.
"""
