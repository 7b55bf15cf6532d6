"""The one retry helper on a fake clock and sleep: no test here waits for real."""

from __future__ import annotations

import asyncio
import email.utils

import pytest

from reef.core.retrying import Retrier, RetryPolicy, parse_retry_after

NOW = 1_800_000_000.0  # a fixed wall clock, seconds since the epoch


class FakeClock:
    """A monotonic clock that moves only when something sleeps on it."""

    def __init__(self) -> None:
        self.now = 100.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds

    async def sleep_async(self, seconds: float) -> None:
        self.sleep(seconds)


def http_date(seconds: float) -> str:
    return email.utils.formatdate(seconds, usegmt=True)


def test_retry_after_is_read_as_seconds_or_as_an_http_date() -> None:
    assert parse_retry_after(None) is None
    assert parse_retry_after("") is None
    assert parse_retry_after("2") == 2.0
    assert parse_retry_after("1.5") == 1.5
    assert parse_retry_after("-1") == 0.0
    assert parse_retry_after("soon") is None
    assert parse_retry_after("nan") is None
    assert parse_retry_after(http_date(NOW + 30), now=lambda: NOW) == 30.0
    assert parse_retry_after(http_date(NOW - 30), now=lambda: NOW) == 0.0  # passed already
    assert parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT") == 0.0


def test_a_hint_replaces_the_backoff_and_is_capped() -> None:
    policy = RetryPolicy(retries=3, base_seconds=1.0, cap_seconds=8.0, hint_cap_seconds=10.0)
    retrier = Retrier(policy, draw=lambda: 0.5)
    assert retrier.delay(3.0) == 3.0
    assert retrier.delay(60.0) == 10.0
    assert retrier.delay(-2.0) == 0.0
    assert retrier.delay(3.0) is None  # three retries granted: no fourth
    assert retrier.attempts == 4


def test_full_jitter_draws_between_zero_and_the_doubling_capped_ceiling() -> None:
    policy = RetryPolicy(retries=8, base_seconds=0.25, cap_seconds=2.0)
    ceilings = [0.25, 0.5, 1.0, 2.0, 2.0, 2.0]
    assert [policy.ceiling(n) for n in range(6)] == ceilings
    lowest = Retrier(policy, draw=lambda: 0.0)
    assert [lowest.delay() for _ in ceilings] == [0.0] * 6
    highest = Retrier(policy, draw=lambda: 1.0)  # the bound a draw below 1 approaches
    assert [highest.delay() for _ in ceilings] == ceilings
    assert policy.ceiling(5000) == 2.0  # no overflow however many retries


def test_no_wait_reaches_past_the_deadline() -> None:
    clock = FakeClock()
    policy = RetryPolicy(retries=10, base_seconds=1.0, cap_seconds=1.0, deadline_seconds=2.5)
    retrier = Retrier(policy, clock=clock, draw=lambda: 1.0)
    assert retrier.pause_blocking(sleep=clock.sleep)
    assert retrier.pause_blocking(sleep=clock.sleep)
    assert retrier.remaining() == 0.5
    assert not retrier.pause_blocking(sleep=clock.sleep)  # 1 s would end past the deadline
    assert not retrier.pause_blocking(0.5, sleep=clock.sleep)  # so would a hint ending on it
    assert retrier.pause_blocking(0.25, sleep=clock.sleep)  # a shorter hint fits
    assert clock.slept == [1.0, 1.0, 0.25]
    assert not retrier.expired()
    clock.now += 1
    assert retrier.expired()


def test_async_pause_sleeps_on_the_given_sleep() -> None:
    clock = FakeClock()
    policy = RetryPolicy(retries=2, base_seconds=0.5, cap_seconds=4.0, deadline_seconds=60)
    retrier = Retrier(policy, clock=clock, draw=lambda: 1.0)

    async def go() -> list[bool]:
        return [await retrier.pause(sleep=clock.sleep_async) for _ in range(3)]

    assert asyncio.run(go()) == [True, True, False]
    assert clock.slept == [0.5, 1.0]
    assert retrier.remaining() == 58.5


def test_a_negative_setting_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match=r"RetryPolicy\.retries must be >= 0"):
        RetryPolicy(retries=-1, base_seconds=1, cap_seconds=1)
    with pytest.raises(ValueError, match=r"RetryPolicy\.deadline_seconds"):
        RetryPolicy(retries=1, base_seconds=1, cap_seconds=1, deadline_seconds=-1)
