"""Opening live export: off by default, a clear error without the extra, checked sizes."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

import reef.telemetry
from reef.config import OtelConfig, ReefSettings, masked_dump
from reef.telemetry import TelemetryUnavailableError, open_live_export


def test_off_by_default_opens_nothing() -> None:
    assert ReefSettings().otel.enabled is False
    assert open_live_export(ReefSettings().otel) is None


def test_without_the_extra_the_error_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(reef.telemetry, "_installed", lambda module: module != "opentelemetry.sdk")
    with pytest.raises(TelemetryUnavailableError) as caught:
        open_live_export(OtelConfig(enabled=True))
    assert "pip install 'reef-agent[otel]'" in caught.value.message
    assert "opentelemetry.sdk" in caught.value.message


def test_a_batch_larger_than_the_queue_is_refused() -> None:
    with pytest.raises(ValidationError, match="max_export_batch_size"):
        OtelConfig(max_queue_size=10, max_export_batch_size=20)


def test_headers_are_masked_in_the_shown_config() -> None:
    settings = ReefSettings(otel={"headers": {"authorization": "Bearer s3cret"}})
    shown = masked_dump(settings)["otel"]["headers"]
    assert shown == {"authorization": "**********"}
    assert settings.otel.headers["authorization"].get_secret_value() == "Bearer s3cret"
