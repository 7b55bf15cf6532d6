"""Cost from every API's usage shape, cached input included (``reef.core.prices``)."""

from __future__ import annotations

import pytest

from reef.core.prices import Price, Tokens, cost_of, usage_tokens

PRICE = Price("m", input_per_mtok=2.0, output_per_mtok=10.0, cached_input_per_mtok=0.5)


def test_openai_chat_usage_counts_cached_prompt_tokens_at_the_cached_price() -> None:
    usage = {
        "prompt_tokens": 1000,
        "completion_tokens": 200,
        "total_tokens": 1200,
        "prompt_tokens_details": {"cached_tokens": 400},
    }
    assert usage_tokens(usage) == Tokens(input=1000, cached_input=400, output=200)
    assert cost_of(usage, PRICE) == pytest.approx((600 * 2.0 + 400 * 0.5 + 200 * 10.0) / 1e6)


def test_responses_usage_counts_input_token_details() -> None:
    usage = {
        "input_tokens": 1000,
        "output_tokens": 50,
        "total_tokens": 1050,
        "input_tokens_details": {"cached_tokens": 1000},
        "output_tokens_details": {"reasoning_tokens": 10},
    }
    assert usage_tokens(usage) == Tokens(1000, 1000, 50)
    assert cost_of(usage, PRICE) == pytest.approx((1000 * 0.5 + 50 * 10.0) / 1e6)


def test_anthropic_usage_adds_cache_reads_and_writes_to_the_input() -> None:
    usage = {
        "input_tokens": 100,
        "output_tokens": 30,
        "cache_read_input_tokens": 900,
        "cache_creation_input_tokens": 50,
    }
    assert usage_tokens(usage) == Tokens(1050, 900, 30)
    # cache writes at the input price: Reef does not guess a surcharge
    assert cost_of(usage, PRICE) == pytest.approx((150 * 2.0 + 900 * 0.5 + 30 * 10.0) / 1e6)


def test_cached_input_without_its_own_price_costs_the_input_price() -> None:
    price = Price("m", input_per_mtok=3.0, output_per_mtok=15.0)
    usage = {
        "prompt_tokens": 10,
        "completion_tokens": 0,
        "prompt_tokens_details": {"cached_tokens": 10},
    }
    assert cost_of(usage, price) == pytest.approx(30 / 1e6)


@pytest.mark.parametrize("usage", [None, {}, "12", {"total_tokens": 5}, [1]])
def test_no_usage_is_no_cost(usage: object) -> None:
    assert usage_tokens(usage) is None
    assert cost_of(usage, PRICE) is None


def test_unpriced_is_no_cost() -> None:
    assert cost_of({"prompt_tokens": 3, "completion_tokens": 4}, None) is None


def test_bad_counts_count_as_zero_and_cached_never_exceeds_input() -> None:
    usage = {
        "prompt_tokens": 5,
        "completion_tokens": -3,
        "prompt_tokens_details": {"cached_tokens": 9},
    }
    assert usage_tokens(usage) == Tokens(5, 5, 0)
    assert usage_tokens({"input_tokens": True, "output_tokens": 2}) == Tokens(0, 0, 2)
