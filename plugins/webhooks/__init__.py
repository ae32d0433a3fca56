"""Webhooks: signed, retried, durable outbound deliveries of account events.

Owns the ``/me/webhooks`` routes (subscriptions, the event catalogue, test pings, delivery
history, redelivery and recovery), the transactional outbox that the ``flowsvc_event_emitted``
hook writes in the emitter's own transaction, and the ``webhooks.dispatcher`` actor that sends
due deliveries. The pure building blocks are ``signing`` (signatures, the envelope bytes and
``verify_delivery`` for receivers) and ``backoff`` (retry delays); the SSRF guard is the
core's (``runtime.netguard``). See ``docs/webhooks.md`` and ``docs/webhooks-receiving.md``.
"""
