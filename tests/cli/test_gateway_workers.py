"""What ``reef serve --workers N`` hands every gateway process: settings whose limits
hold for the whole port, and that survive the trip to the child with their secrets."""

from __future__ import annotations

from pathlib import Path

import pytest

from reef.cli.gateway_workers import for_workers, settings_json
from reef.cli.serving import with_gate_key
from reef.config import ConfigError, ReefSettings


def _settings(tmp_path: Path, **extra: object) -> ReefSettings:
    return ReefSettings.model_validate(
        {
            "home": str(tmp_path),
            "server": {"workers": 3},
            "auth": {"keys": [{"id": "app", "key": "sk-app-0123456789abcdef", "role": "admin"}]},
            "upstreams": {
                "up": {
                    "type": "openai",
                    "base_url": "http://127.0.0.1:9/v1",
                    "api_key": "sk-upstream-secret",
                }
            },
            **extra,
        }
    )


def test_spend_is_counted_in_the_store_and_rate_limits_are_shared(tmp_path: Path) -> None:
    settings = _settings(
        tmp_path,
        budgets={"global": [{"window": "day", "tokens": 1000}]},
        rate_limits={"replicas": 2, "keys": {"app": {"requests_per_minute": 60}}},
    )
    assert settings.budgets.ledger == "auto"
    shared = for_workers(settings)
    assert shared.budgets.ledger == "store"
    assert shared.rate_limits.replicas == 6  # 2 gateways of 3 workers each


def test_a_memory_ledger_with_budgets_is_refused_naming_the_fields(tmp_path: Path) -> None:
    settings = _settings(
        tmp_path, budgets={"ledger": "memory", "global": [{"window": "day", "tokens": 1000}]}
    )
    with pytest.raises(ConfigError, match=r"budgets\.ledger.*server\.workers"):
        for_workers(settings)


def test_settings_reach_the_child_equal_secrets_included(tmp_path: Path) -> None:
    settings = with_gate_key(_settings(tmp_path))
    again = ReefSettings.model_validate_json(settings_json(settings))
    assert again == settings
    key = again.upstreams["up"].api_key
    assert key is not None and key.get_secret_value() == "sk-upstream-secret"
    assert again.evaluation.api_key == settings.evaluation.api_key
