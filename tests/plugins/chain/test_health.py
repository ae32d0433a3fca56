"""Health bookkeeping of one URL: backoff bounds, Retry-After, recovery and ranking."""

from __future__ import annotations

import random

import pytest

from plugins.chain.health import CooldownPolicy, EndpointHealth


def test_backoff_doubles_within_its_jittered_upper_half_up_to_the_cap() -> None:
    policy = CooldownPolicy(base=0.5, cap=30.0)
    rng = random.Random(11)
    for failures, ceiling in [(1, 0.5), (2, 1.0), (3, 2.0), (6, 16.0), (7, 30.0), (500, 30.0)]:
        draws = [policy.backoff(failures, rng) for _ in range(2000)]
        assert all(ceiling / 2 <= draw <= ceiling for draw in draws)
        # Jittered: the draws spread over the range instead of repeating one value.
        assert max(draws) - min(draws) > ceiling / 4


def test_a_failure_cools_down_and_a_success_after_it_resets_the_run() -> None:
    health = EndpointHealth()
    rng = random.Random(1)
    policy = CooldownPolicy(base=1.0, cap=8.0)
    assert health.available(0.0)
    cooldown = health.failed(100.0, policy, rng)
    assert 0.5 <= cooldown <= 1.0
    assert not health.available(100.0 + cooldown - 0.01)
    assert health.available(100.0 + cooldown)
    health.failed(200.0, policy, rng)
    assert health.consecutive_failures == 2
    health.succeeded(0.02)
    assert health.consecutive_failures == 0
    assert (health.requests, health.failures) == (3, 2)
    assert health.success_rate < 1.0


def test_retry_after_is_honoured_up_to_its_cap() -> None:
    health = EndpointHealth()
    policy = CooldownPolicy(retry_after_cap=60.0)
    assert health.failed(0.0, policy, random.Random(), retry_after=12.5) == 12.5
    assert health.cooling_until == 12.5
    assert health.failed(0.0, policy, random.Random(), retry_after=3600) == 60.0


def test_a_later_shorter_cooldown_does_not_cut_a_longer_one() -> None:
    health = EndpointHealth()
    health.failed(0.0, CooldownPolicy(), random.Random(), retry_after=100)
    health.failed(1.0, CooldownPolicy(), random.Random(), retry_after=1)
    assert health.cooling_until == 100


def test_score_prefers_fast_reliable_urls_and_tries_unmeasured_ones_first() -> None:
    fast, slow, flaky, fresh = (EndpointHealth() for _ in range(4))
    fast.succeeded(0.01)
    slow.succeeded(0.2)
    flaky.succeeded(0.01)
    for _ in range(10):
        flaky.failed(0.0, CooldownPolicy(), random.Random())
    ranked = sorted([slow, flaky, fast, fresh], key=EndpointHealth.score)
    assert ranked == [fresh, fast, slow, flaky]
    # The latency average moves a tenth of the way towards each new sample.
    slow.succeeded(0.1)
    assert slow.latency == pytest.approx(0.19)
