"""Error codes of the projects plugin (the spec's Projects group, and some of our own)."""

from runtime.errors import Conflict, Forbidden, InvalidRequest, RateLimited


class TokenNoMatch(Forbidden):
    """Raised when the caller's address does not own the token a project would attach to."""

    code = "token_no_match"


class ProjectLocked(Conflict):
    """Raised when the token already has an active project (one not completed, failed or
    cancelled)."""

    code = "project_locked"


class TemplateUnknown(InvalidRequest):
    """Raised when ``agentTemplate`` is not one of the presets the enabled plugins provide."""

    code = "template_unknown"


class PrivateForbidden(Forbidden):
    """Raised when anyone but its owner asks for a private project, its stream or its files."""

    code = "private_forbidden"


class MessengerNotLinked(Conflict):
    """Raised when a user without a linked messaging identity subscribes to milestones:
    notifications go through the messaging platform's bot, so there is nowhere to send them."""

    code = "messenger_not_linked"


class PrivateProjectsRequired(Forbidden):
    """Raised when a caller without the ``privateProjects`` feature (the max tier) makes a
    project private."""

    code = "private_projects_required"


class TooManyStreams(RateLimited):
    """Raised when a client address already holds ``streams_per_client`` open streams;
    carries ``Retry-After``."""

    code = "too_many_streams"
