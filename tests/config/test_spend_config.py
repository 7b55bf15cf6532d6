"""Prices, budgets and rate limits: contradictions and bad values are config errors
naming the field."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from reef.config import ReefSettings

UPSTREAM = {"type": "openai", "base_url": "http://127.0.0.1:9", "model": "m"}


def settings(**values: Any) -> ReefSettings:
    return ReefSettings(**{"upstreams": {"o": UPSTREAM}, **values})


def error_of(**values: Any) -> str:
    with pytest.raises(ValidationError) as caught:
        settings(**values)
    return str(caught.value)


def test_defaults_have_no_prices_budgets_or_limits() -> None:
    loaded = settings()
    assert loaded.upstreams["o"].prices == {}
    assert not loaded.budgets.any and not loaded.rate_limits.any


def test_a_price_table_and_budgets_load() -> None:
    loaded = ReefSettings(
        upstreams={"o": {**UPSTREAM, "prices": {"m": {"input_per_mtok": 1, "output_per_mtok": 4}}}},
        budgets={
            "global": [{"window": "month", "money": 100}],
            "scenarios": {"s": [{"window": "day", "tokens": 10}]},
        },
    )
    assert loaded.upstreams["o"].prices["m"].output_per_mtok == 4
    assert loaded.budgets.global_[0].money == 100
    assert loaded.budgets.scenarios["s"][0].tokens == 10


def test_a_negative_price_names_its_field() -> None:
    message = error_of(
        upstreams={"o": {**UPSTREAM, "prices": {"m": {"input_per_mtok": -1, "output_per_mtok": 4}}}}
    )
    assert "upstreams.o.prices.m.input_per_mtok" in message


def test_an_unknown_model_in_a_fixed_model_upstreams_price_table() -> None:
    priced = {"gpt-x": {"input_per_mtok": 1, "output_per_mtok": 4}}
    message = error_of(upstreams={"o": {**UPSTREAM, "prices": priced}})
    assert "upstreams.o.prices: unknown model(s) ['gpt-x']" in message
    # an upstream that passes the client's model names on may price any model
    passthrough = {k: v for k, v in UPSTREAM.items() if k != "model"}
    assert ReefSettings(upstreams={"o": {**passthrough, "prices": priced}}).upstreams["o"].prices
    # a distilled scenario's teacher on it is asked as its own model: that one is known
    teacher = {"upstream": "o", "model": "gpt-x"}
    known = ReefSettings(
        upstreams={"s": {**UPSTREAM, "model": "student"}, "o": {**UPSTREAM, "prices": priced}},
        scenarios={"d": {"upstream": "s", "distill": {"teacher": teacher}}},
    )
    assert known.upstreams["o"].prices


def test_a_day_budget_above_its_month_budget_is_a_contradiction() -> None:
    message = error_of(
        budgets={
            "scenarios": {"s": [{"window": "month", "money": 5}, {"window": "day", "money": 9}]}
        }
    )
    assert "budgets.scenarios.s: the day money budget (9.0) exceeds the month one (5.0)" in message


def test_two_budgets_for_one_window() -> None:
    message = error_of(
        budgets={"global": [{"window": "day", "money": 5}, {"window": "day", "tokens": 9}]}
    )
    assert "budgets.global: two budgets for the window 'day'" in message


def test_a_budget_without_a_limit() -> None:
    assert "a month budget needs tokens, money or both" in error_of(
        budgets={"global": [{"window": "month"}]}
    )


def test_budgets_and_limits_of_unknown_keys() -> None:
    assert "budgets.keys: unknown api key id(s) ['ci']" in error_of(
        budgets={"keys": {"ci": [{"window": "day", "money": 1}]}}
    )
    assert "rate_limits.keys: unknown api key id(s) ['ci']" in error_of(
        rate_limits={"keys": {"ci": {"requests_per_minute": 1}}}
    )


def test_a_rate_limit_without_a_rate() -> None:
    assert "needs requests_per_minute, tokens_per_minute or both" in error_of(
        rate_limits={"scenarios": {"s": {}}}
    )


def test_budgets_of_a_scenario_the_gateway_rejects() -> None:
    message = error_of(
        server={"unknown_scenarios": "reject"},
        budgets={"scenarios": {"nope": [{"window": "day", "money": 1}]}},
    )
    assert "budgets.scenarios: unknown scenario(s) ['nope']" in message
