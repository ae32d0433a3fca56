"""Billing: subscriptions (tiers plus, pro, max) paid through three providers, and the
feature flags they grant.

It owns ``POST /subscriptions/checkout``, ``/me/subscription`` (read, cancel, change, the
payment history), the providers' inbound callbacks (``/billing/webhooks/<provider>``), the
internal clock and payment list, the ``billing_*`` tables, the ``billing.scheduler`` actor
(renewals, grace, retries, lapses), the ``flowsvc_user_features`` flags of the tier table
and the ``usdt_bep20`` treasury watch of the chain contract. Subscriptions grant no FLOW.
``docs/billing.md`` describes it all.
"""
