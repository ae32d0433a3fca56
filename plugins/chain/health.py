"""The health of one RPC URL: success rate, latency, consecutive failures and cooldown.

Pure bookkeeping: every method takes ``now`` (Trio's clock in the pool), so tests drive it
without sleeping. The floats here are seconds and rates, never amounts.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

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
    """

    base: float = 0.5
    cap: float = 30.0
    retry_after_cap: float = 300.0

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
