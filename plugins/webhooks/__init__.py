"""Webhooks: signed, retried outbound deliveries of account events."""
