"""Error codes of the marketplace (the spec's Marketplace group, plus the plugin's own)."""

from runtime.errors import Forbidden, InvalidRequest, NotFound


class AgentNotFound(NotFound):
    """Raised when no agent has this slug, or it is unpublished and the caller is not its owner."""

    code = "agent_not_found"


class NotOwner(Forbidden):
    """Raised when someone other than the agent's owner tries to change it."""

    code = "not_owner"


class InvalidMonetization(InvalidRequest):
    """Raised for an unknown monetization model, or a required field missing or invalid."""

    code = "invalid_monetization"


class ToolUnknown(InvalidRequest):
    """Raised when a tool price names a tool outside the platform's allowed tool list."""

    code = "tool_unknown"


class TemplateUnknown(InvalidRequest):
    """Raised when an agent's ``agentTemplate`` is not one of the platform's presets."""

    code = "template_unknown"


class PremiumRequired(Forbidden):
    """Raised when a premium agent is used by a caller without the ``premiumAgents`` feature."""

    code = "premium_required"


class SubscriptionRequired(Forbidden):
    """Raised when a subscription-model agent is used without a subscription in its period."""

    code = "subscription_required"


class ApiKeyRequired(Forbidden):
    """Raised when a paid use of an agent comes without an API key to bill it to."""

    code = "api_key_required"
