"""Live export: each recorded exchange as an OpenTelemetry GenAI span over OTLP.

Owns: the shape of what is sent (``gen_ai.*`` and ``reef.*`` attributes, the
``gen_ai.evaluation.result`` events of feedback) and the pipeline that sends it off the request
path: a bounded queue in the gateway, and an export process that encodes OTLP protobuf
(``otlp_proto``) and sends it with the OpenTelemetry SDK's OTLP exporters (failed exports
counted); and ``reef export --format otel``'s OTLP/JSON file (``otlp_json``).
Does not own: what is recorded or when (the gateway calls in once a record is written),
the store, or any import of traces (``reef import``).
How to extend: attributes are built by plain functions in ``reef.telemetry.attributes``
(no OpenTelemetry import); the SDK is an optional extra (``reef-agent[otel]``) that only the
export process (``reef.telemetry.exporter``) imports, so the gateway never loads it.
"""

from __future__ import annotations

import importlib.util
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
    exporter = (
        "opentelemetry.exporter.otlp.proto.grpc"
        if config.protocol == "grpc"
        else "opentelemetry.exporter.otlp.proto.http"
    )
    for module in ("opentelemetry.sdk", exporter):
        if not _installed(module):
            raise TelemetryUnavailableError(
                f"otel.enabled is set but {module} is not installed: "
                "pip install 'reef-agent[otel]', or set otel.enabled: false"
            )
    from reef.telemetry.live import LiveExport

    return LiveExport(config)


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # a parent package is missing
        return False


__all__ = ["TelemetryUnavailableError", "open_live_export"]
