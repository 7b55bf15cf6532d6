"""Loading ``reef.yaml`` with environment overrides, and printing it safely."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from reef.config.models import ReefSettings, yaml_data
from reef.core.errors import InvalidInputError
from reef.core.validation import problem_lines

DEFAULT_CONFIG_FILE = Path("reef.yaml")


class ConfigError(InvalidInputError):
    """The configuration file or environment is invalid; the message says where."""


def _read_yaml(path: Path) -> dict[str, Any]:
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from exc
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the top level must be a mapping of sections")
    return data


def load_settings(path: Path | None = None, **overrides: Any) -> ReefSettings:
    """Load settings: ``overrides`` > ``REEF_…`` env > YAML file > defaults.

    ``path`` defaults to ``./reef.yaml`` when that file exists (or ``REEF_CONFIG``).
    Raises ``ConfigError`` naming each bad key, with the allowed keys for unknown ones.
    """
    if path is None:
        env_path = os.environ.get("REEF_CONFIG")
        path = Path(env_path) if env_path else DEFAULT_CONFIG_FILE
        explicit = env_path is not None
    else:
        explicit = True
    data: dict[str, Any] = {}
    if path.exists():
        data = _read_yaml(path)
    elif explicit:
        raise ConfigError(f"config file {path} does not exist")
    token = yaml_data.set(data)
    try:
        return ReefSettings(**overrides)
    except ValidationError as exc:
        raise ConfigError(format_validation_error(exc, source=str(path))) from exc
    finally:
        yaml_data.reset(token)


def format_validation_error(exc: ValidationError, source: str) -> str:
    """One line per problem, naming the dotted key; unknown keys list the allowed ones."""
    lines = [f"invalid configuration ({source} and REEF_* environment):"]
    lines += [f"  {line}" for line in problem_lines(exc, ReefSettings)]
    return "\n".join(lines)


def masked_dump(settings: ReefSettings) -> dict[str, Any]:
    """The merged settings as plain data, secrets replaced by ``**********``."""
    data: dict[str, Any] = settings.model_dump(mode="json")
    data["store_url_effective"] = _mask_url(settings.store_url())
    if data["store"].get("url"):
        data["store"]["url"] = _mask_url(data["store"]["url"])
    for key in data["auth"]["keys"]:
        key["sha256"] = (key["sha256"] or "")[:8] + "…"
    return data


def _mask_url(url: str) -> str:
    """Hide a password inside a database URL."""
    scheme, sep, rest = url.partition("://")
    if not sep or "@" not in rest:
        return url
    creds, _, host = rest.rpartition("@")
    user, has_pw, _ = creds.partition(":")
    return f"{scheme}://{user}{':**********' if has_pw else ''}@{host}"
