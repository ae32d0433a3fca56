"""Billing: subscription checkout and payments through an external provider, tier grants and
(deprecated) payouts.

Not built yet. For now the plugin only declares the webhook events it will emit, so that
integrators can subscribe to them: ``payment.received``, ``subscription.granted``,
``payout.sent`` and ``payout.failed`` (the ``/me/payouts`` endpoints are deprecated, their
events stay subscribable).
"""
