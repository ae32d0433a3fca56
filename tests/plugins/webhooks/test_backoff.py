"""Tests of the webhook retry schedule: bounds, means near 1, 2, 4 s, and argument checks."""

import random
import statistics

import pytest

from plugins.webhooks.backoff import retry_delay, retry_delays

SAMPLES = 20_000


def test_default_schedule_has_three_full_jitter_delays_with_means_near_1_2_4() -> None:
    rng = random.Random(20261122)
    schedules = [retry_delays(rng=rng) for _ in range(SAMPLES)]

    assert all(len(schedule) == 3 for schedule in schedules)
    for n, expected_mean in enumerate((1.0, 2.0, 4.0)):
        column = [schedule[n] for schedule in schedules]
        upper = 2 * expected_mean
        assert all(0.0 <= delay <= upper for delay in column)
        # Uniform on [0, 2m]: standard error of the mean is m / sqrt(3 * SAMPLES) < 0.3 % of m.
        assert statistics.fmean(column) == pytest.approx(expected_mean, rel=0.02)
        # Full jitter: the draws cover the whole range, down to almost 0 and up to almost 2m.
        assert min(column) < 0.01 * upper
        assert max(column) > 0.99 * upper


def test_base_scales_the_schedule() -> None:
    rng = random.Random(7)
    column = [retry_delays(attempts=1, base=0.25, rng=rng)[0] for _ in range(SAMPLES)]

    assert max(column) <= 0.5
    assert statistics.fmean(column) == pytest.approx(0.25, rel=0.02)


def test_cap_bounds_every_delay() -> None:
    delays = retry_delays(attempts=12, rng=random.Random(3), cap=10.0)

    assert len(delays) == 12
    assert all(0.0 <= delay <= 10.0 for delay in delays)


def test_same_seed_gives_same_schedule_and_default_rng_varies() -> None:
    assert retry_delays(rng=random.Random(42)) == retry_delays(rng=random.Random(42))
    # Two OS-seeded schedules colliding exactly would mean the default rng is not random.
    assert retry_delays() != retry_delays()


def test_zero_attempts_is_an_empty_schedule() -> None:
    assert retry_delays(attempts=0) == []


@pytest.mark.parametrize(
    ("attempts", "base", "cap"),
    [(-1, 1.0, 60.0), (3, 0.0, 60.0), (3, -1.0, 60.0), (3, 1.0, 0.0)],
)
def test_invalid_arguments_are_refused(attempts: int, base: float, cap: float) -> None:
    with pytest.raises(ValueError, match="must be"):
        retry_delays(attempts=attempts, base=base, cap=cap)


def test_one_retry_delay_is_drawn_from_its_own_full_jitter_range() -> None:
    rng = random.Random(7)
    draws = [retry_delay(2, 0.5, rng) for _ in range(2000)]

    assert all(0 <= delay <= 4.0 for delay in draws)
    assert 1.8 < statistics.fmean(draws) < 2.2  # mean base * 2**2
    assert retry_delay(10, 1.0, rng, cap=3.0) <= 3.0
    with pytest.raises(ValueError):
        retry_delay(-1)
