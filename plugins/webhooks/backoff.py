"""Retry delays of a failed webhook delivery: full-jitter exponential backoff.

The spec promises "up to 3 retries with full-jitter exponential backoff of about 1 s, 2 s and
4 s". Classic full jitter (AWS, "Exponential Backoff And Jitter") draws retry ``n`` (from 0)
uniformly from ``[0, base * 2**n]``; its *ceiling* is 1, 2, 4 s but its average is only 0.5, 1,
2 s, so a receiver would typically see retries twice as fast as the spec says. We keep the full
jitter (any value down to 0, which spreads a burst of failed deliveries the most) and draw from
``[0, 2 * base * 2**n]`` instead, so the *expected* delays are exactly ``base * 2**n``: 1, 2 and
4 s with the defaults, each ranging over [0, 2], [0, 4], [0, 8] s. Every range is capped at
``cap`` so that a larger ``attempts`` cannot produce absurd waits.
"""

import random


def retry_delay(
    retry: int, base: float = 1.0, rng: random.Random | None = None, *, cap: float = 60.0
) -> float:
    """Return the seconds to wait before retry number ``retry`` (counting from 0).

    Uniform on ``[0, min(cap, 2 * base * 2**retry)]``, so its mean is ``base * 2**retry`` while
    below the cap. Pass a seeded ``rng`` for reproducible delays; by default a fresh OS-seeded
    generator is used, so concurrent dispatchers do not retry in step.

    Raises ``ValueError`` if ``retry`` is negative or ``base`` or ``cap`` is not positive.
    """
    if retry < 0:
        raise ValueError("retry must be non-negative")
    if base <= 0 or cap <= 0:
        raise ValueError("base and cap must be positive")
    draw = rng if rng is not None else random.Random()
    return draw.uniform(0.0, min(cap, 2.0 * base * 2.0**retry))


def retry_delays(
    attempts: int = 3,
    base: float = 1.0,
    rng: random.Random | None = None,
    *,
    cap: float = 60.0,
) -> list[float]:
    """Return the seconds to wait before each of ``attempts`` retries (see ``retry_delay``).

    Raises ``ValueError`` if ``attempts`` is negative or ``base`` or ``cap`` is not positive.
    """
    if attempts < 0:
        raise ValueError("attempts must be non-negative")
    if base <= 0 or cap <= 0:
        raise ValueError("base and cap must be positive")
    draw = rng if rng is not None else random.Random()
    return [retry_delay(n, base, draw, cap=cap) for n in range(attempts)]
