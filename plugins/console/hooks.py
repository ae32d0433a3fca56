"""Hook implementations of the console plugin: its blueprint, nothing else."""

from __future__ import annotations

from typing import TYPE_CHECKING

from runtime.hookspecs import hookimpl

if TYPE_CHECKING:
    from quart import Blueprint

    from runtime.service import Service


@hookimpl
def flowsvc_blueprints(service: Service) -> list[Blueprint]:
    from plugins.console import account, activity, dev_wallet, projects, routes, webhooks

    return [routes.blueprint, activity.blueprint, webhooks.blueprint, projects.blueprint,
            account.blueprint, dev_wallet.blueprint]
