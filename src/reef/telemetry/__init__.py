"""Live export: each recorded exchange as an OpenTelemetry GenAI span over OTLP.

Owns: the shape of what is sent (``gen_ai.*`` and ``reef.*`` attributes, the
``gen_ai.evaluation.result`` events of feedback) and the OpenTelemetry SDK pipeline that
sends it off the request path (a batch span processor; failed exports counted).
Does not own: what is recorded or when (the gateway calls in once a record is written),
the store, or any import of traces (``reef import``).
How to extend: attributes are built by plain functions in ``reef.telemetry.attributes``
(no OpenTelemetry import); the SDK is an optional extra (``reef-agent[otel]``) that only
``open_live_export`` loads, so ``import reef`` never does.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from reef.core.errors import ReefError

if TYPE_CHECKING:
    from reef.config import OtelConfig
    from reef.telemetry.live import LiveExport


class TelemetryUnavailableError(ReefError):
    """``otel.enabled`` is set but the OpenTelemetry SDK is not installed."""


def open_live_export(config: OtelConfig) -> LiveExport | None:
    """The live exporter ``config`` asks for, started; None when ``otel.enabled`` is off.

    Raises ``TelemetryUnavailableError`` when the ``otel`` extra is not installed."""
    if not config.enabled:
        return None
    try:
        from reef.telemetry.live import LiveExport
    except ImportError as exc:
        raise TelemetryUnavailableError(
            f"otel.enabled is set but the OpenTelemetry SDK is missing ({exc.name}): "
            "pip install 'reef-agent[otel]', or set otel.enabled: false"
        ) from exc
    return LiveExport(config)


__all__ = ["TelemetryUnavailableError", "open_live_export"]
