"""The health of one RPC URL: success rate, latency, consecutive failures, cooldown, and the
methods it does not serve.

Pure bookkeeping: every method takes ``now`` (Trio's clock in the pool), so tests drive it
without sleeping. The floats here are seconds and rates, never amounts.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

# Weight of the newest sample in the moving averages: about the last ten requests count.
_ALPHA = 0.1
# What a failed request costs in the ranking, in seconds: about a timeout and a failover.
_FAILURE_COST = 1.0


@dataclass(frozen=True)
class CooldownPolicy:
    """How long a failing URL rests.

    :param base: seconds of the first cooldown; each consecutive failure doubles it.
    :param cap: the longest backoff cooldown, in seconds.
    :param retry_after_cap: the longest ``Retry-After`` honoured, in seconds (a server asking
        for a day must not remove a URL for a day).
    :param unsupported_seconds: how long a method the URL said it does not serve is sent to
        the other URLs before this one is asked again (a plan may change, rarely).
    """

    base: float = 0.5
    cap: float = 30.0
    retry_after_cap: float = 300.0
    unsupported_seconds: float = 3600.0

    def backoff(self, failures: int, rng: random.Random) -> float:
        """Return the cooldown after ``failures`` consecutive failures (at least 1): capped
        exponential, jittered over its upper half so that pools sharing a URL spread out
        while a cooldown never shrinks to nothing."""
        ceiling = min(self.cap, self.base * 2.0 ** min(failures - 1, 62))
        return rng.uniform(ceiling / 2, ceiling)


@dataclass
class EndpointHealth:
    """Health of one URL, updated after every request to it."""

    success_rate: float = 1.0
    latency: float = 0.0
    consecutive_failures: int = 0
    cooling_until: float = float("-inf")
    requests: int = 0
    failures: int = 0
    # Method -> until when this URL is not asked for it (it answered that it does not serve it).
    unsupported: dict[str, float] = field(default_factory=dict)

    def available(self, now: float) -> bool:
        """Whether the URL may be used at ``now`` (its cooldown, if any, is over)."""
        return now >= self.cooling_until

    def score(self) -> float:
        """Rank among available URLs, lower is better: the expected seconds of a request,
        its latency plus the cost of failing as often as it recently did. A URL never
        measured scores 0, so each URL gets tried and measured early."""
        return self.latency + (1.0 - self.success_rate) * _FAILURE_COST

    def succeeded(self, seconds: float) -> None:
        """Record an answer that took ``seconds``; a success ends the run of failures."""
        self.requests += 1
        self.consecutive_failures = 0
        self.success_rate += _ALPHA * (1.0 - self.success_rate)
        # The first measurement replaces the unmeasured 0 instead of being averaged with it.
        self.latency = seconds if self.latency == 0.0 else (
            self.latency + _ALPHA * (seconds - self.latency))

    def failed(self, now: float, policy: CooldownPolicy, rng: random.Random,
               retry_after: float | None = None) -> float:
        """Record a failure at ``now`` and cool the URL down: for ``retry_after`` seconds when
        the server said (capped by the policy), else by the backoff. Returns the cooldown."""
        self.requests += 1
        self.failures += 1
        self.consecutive_failures += 1
        self.success_rate -= _ALPHA * self.success_rate
        cooldown = (min(retry_after, policy.retry_after_cap) if retry_after is not None
                    else policy.backoff(self.consecutive_failures, rng))
        self.cooling_until = max(self.cooling_until, now + cooldown)
        return cooldown

    def supports(self, method: str, now: float) -> bool:
        """Whether ``method`` may be sent to the URL at ``now`` (not marked unsupported, or
        the mark expired)."""
        return self.unsupported.get(method, float("-inf")) <= now

    def mark_unsupported(self, method: str, now: float, policy: CooldownPolicy) -> bool:
        """Record that the URL does not serve ``method``: not asked for it for the policy's
        ``unsupported_seconds``. Returns whether this is news (it was not marked before)."""
        news = self.supports(method, now)
        self.unsupported[method] = now + policy.unsupported_seconds
        return news

    def expired_unsupported(self, now: float) -> list[str]:
        """Forget the marks that ran out at ``now``; returns their methods."""
        expired = [method for method, until in self.unsupported.items() if until <= now]
        for method in expired:
            del self.unsupported[method]
        return expired
