"""Configuration: pydantic-settings models, YAML loading, env overrides.

Owns: the shape of ``reef.yaml`` (``ReefSettings`` and its sections), loading it with
``REEF_…`` environment overrides (nested with ``__``), rejecting unknown keys, and
printing it with secrets masked.
Does not own: what the settings do; it imports nothing from gateway or learning.
Extend: add a field to a section model; the docs test lists every field.
"""

from reef.config.loading import ConfigError, load_settings, masked_dump
from reef.config.models import (
    ActivationConfig,
    ApiKeyConfig,
    ArtifactsConfig,
    AuthConfig,
    CaptureConfig,
    EvaluationConfig,
    OtelConfig,
    ReefSettings,
    ScenarioConfig,
    ServerConfig,
    StoreConfig,
    UpstreamConfig,
)

__all__ = [
    "ActivationConfig",
    "ApiKeyConfig",
    "ArtifactsConfig",
    "AuthConfig",
    "CaptureConfig",
    "ConfigError",
    "EvaluationConfig",
    "OtelConfig",
    "ReefSettings",
    "ScenarioConfig",
    "ServerConfig",
    "StoreConfig",
    "UpstreamConfig",
    "load_settings",
    "masked_dump",
]
