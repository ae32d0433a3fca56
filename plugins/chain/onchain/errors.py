"""Error codes of the on-chain read endpoints (the spec's On-chain group, and ours)."""

from runtime.errors import Conflict, InvalidRequest, NotFound, ServiceError, Unavailable


class ChainUnsupported(InvalidRequest):
    """Raised when ``?chainId=`` names a chain this deployment does not configure (400, like
    ``provider_unsupported``: a value the deployment does not accept)."""

    code = "chain_unsupported"


class AddressNotActivated(NotFound):
    """Raised when the caller never called ``activate()`` on the chain they asked for: they
    have no position there."""

    code = "address_not_activated"


class AddressRequired(Conflict):
    """Raised when a caller signed in by access code or messenger only (no EVM address)
    asks for their on-chain state: there is nothing to read until they link a wallet."""

    code = "address_required"


class ChainUnavailable(Unavailable):
    """Raised when no chain asked for could be read (every RPC URL down or too slow, or no
    chain configured); a request over several chains answers the healthy ones instead."""

    code = "chain_unavailable"


class TokenNotIndexed(Unavailable):
    """Raised when a bonding-curve token's launch is not indexed yet, so the service does not
    know which launcher (Bonding contract) to read it from."""

    code = "token_not_indexed"


class TokenUnreadable(Conflict):
    """Raised for a registered dpnm token whose instance the indexer could not read: the
    address is no dpnm (FLOW) instance on its chain (an EOA, another contract). The
    registration is wrong; an operator fixes it (``PUT /internal/tokens/<slug>``)."""

    code = "token_unreadable"


class EndpointRemoved(ServiceError):
    """Raised by the endpoints the spec removed (``/me/flow-balance``) or deprecated
    (``/me/payouts``); the message names the replacement."""

    status = 410
    code = "endpoint_removed"
