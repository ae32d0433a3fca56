"""Who may use an agent, and on what terms (what each tool call costs the caller).

- The owner may always use their agent, in any state, for free.
- Anyone may use a published ``free`` or ``per_call`` agent; ``per_call`` charges every
  tool call its price, fixed when the run starts.
- A ``subscription`` agent needs a subscription in its period; subscribers keep using an
  agent that was unpublished until their period ends.
- A ``premium`` agent also needs the ``premiumAgents`` feature (set by billing through
  the ``flowsvc_user_features`` hook).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING

from sqlalchemy import Connection

from plugins.marketplace.catalog import Agent, load_agent
from plugins.marketplace.errors import AgentNotFound, PremiumRequired, SubscriptionRequired
from plugins.marketplace.subscriptions import find_subscription

if TYPE_CHECKING:
    from runtime.service import Service


@dataclass(frozen=True)
class Terms:
    """How ``user_id`` may use ``agent``: the price of each tool in micro-FLOW (empty when
    nothing is charged) and whether any call can cost anything."""

    agent: Agent
    user_id: int
    prices: dict[str, int]

    @property
    def paid(self) -> bool:
        return any(self.prices.values())


def terms_of_use(connection: Connection, slug: str, user_id: int, tools: list[str],
                 now: datetime) -> Terms:
    """The terms on which ``user_id`` may run agent ``slug`` with the platform's ``tools``.

    :raises AgentNotFound: no such agent, or it is unpublished and the caller is neither
        its owner nor a subscriber in their period.
    :raises SubscriptionRequired: a subscription agent used without a live subscription.
    """
    agent = load_agent(connection, slug)
    if agent is None:
        raise AgentNotFound(f"no agent {slug!r} in the marketplace")
    if agent.owner_id == user_id:
        return Terms(agent, user_id, {})
    monetization = agent.monetization
    subscribed = False
    if monetization.needs_subscription:
        subscription = find_subscription(connection, agent.id, user_id)
        subscribed = subscription is not None and subscription.live(now)
    if not agent.published and not subscribed:
        raise AgentNotFound(f"no agent {slug!r} in the marketplace")
    if monetization.needs_subscription and not subscribed:
        raise SubscriptionRequired(f"agent {slug!r} is used by subscription: "
                                   f"POST /agents/{slug}/subscribe first")
    if not monetization.charges_per_call:
        return Terms(agent, user_id, {})
    return Terms(agent, user_id, {tool: agent.tool_prices.get(
        tool, monetization.default_per_call_micro) for tool in tools})


async def check_premium(service: Service, agent: Agent, user_id: int) -> None:
    """:raises PremiumRequired: a premium agent and a caller (not its owner) without the
    ``premiumAgents`` feature."""
    if agent.premium and agent.owner_id != user_id and \
            not (await service.features(user_id)).get("premiumAgents", False):
        raise PremiumRequired(f"agent {agent.slug!r} is a premium agent: it needs a "
                              f"subscription tier with premium agents")
