"""``EnvironmentRegistry``: environment classes by their ``type:`` name in the
``reef.environments`` entry-point group, and building one from a spec."""

from __future__ import annotations

from collections.abc import Mapping
from importlib.metadata import EntryPoint, entry_points
from typing import Any

from pydantic import BaseModel, ValidationError

from reef.environments.base import (
    Environment,
    EnvironmentConfig,
    EnvironmentSpecError,
    UnknownEnvironmentError,
)

ENVIRONMENT_GROUP = "reef.environments"


class EnvironmentRegistry:
    """Environment classes by type name: the ``reef.environments`` entry points, plus (or
    instead of) ``classes`` given here, which win over entry points of the same name.
    Entry points are loaded only when their type is used."""

    def __init__(
        self, classes: Mapping[str, type[Environment]] | None = None, entry_points_too: bool = True
    ) -> None:
        self._entry_points: dict[str, EntryPoint] = {}
        if entry_points_too:
            self._entry_points = {ep.name: ep for ep in entry_points(group=ENVIRONMENT_GROUP)}
        self._classes: dict[str, type[Environment]] = dict(classes or {})

    def known(self) -> list[str]:
        """Every registered type name, sorted."""
        return sorted(self._entry_points.keys() | self._classes.keys())

    def get(self, type_name: str) -> type[Environment]:
        """The class for ``type_name``; raises ``UnknownEnvironmentError`` listing the
        known names, or ``EnvironmentSpecError`` when the entry point is not an
        ``Environment``."""
        if type_name in self._classes:
            return self._classes[type_name]
        entry = self._entry_points.get(type_name)
        if entry is None:
            raise UnknownEnvironmentError(
                f"unknown environment type {type_name!r}; known types: {', '.join(self.known())}"
            )
        loaded = entry.load()
        if not (isinstance(loaded, type) and issubclass(loaded, Environment)):
            raise EnvironmentSpecError(
                f"entry point {type_name!r} = {entry.value!r} is not a reef Environment class"
            )
        self._classes[type_name] = loaded
        return loaded

    def config(self, type_name: str, settings: Mapping[str, Any], where: str) -> EnvironmentConfig:
        """Validate ``settings`` with the class's ``config_model``; raises
        ``EnvironmentSpecError`` naming each bad key under ``where`` and the allowed keys."""
        cls = self.get(type_name)
        try:
            return cls.config_model.model_validate(dict(settings))
        except ValidationError as error:
            raise EnvironmentSpecError(
                _explain(error, type_name, cls.config_model, where)
            ) from error

    def build(self, spec: Mapping[str, Any], where: str = "environment") -> Environment:
        """An environment from ``spec`` (``{"type": name, ...settings}``). Raises
        ``EnvironmentSpecError`` for a spec without a string ``type`` or with bad
        settings, ``UnknownEnvironmentError`` for an unregistered type."""
        if not isinstance(spec, Mapping):
            raise EnvironmentSpecError(
                f"{where}: an environment spec is a mapping with 'type', got {type(spec).__name__}"
            )
        settings = dict(spec)
        type_name = settings.pop("type", None)
        if not isinstance(type_name, str) or not type_name:
            raise EnvironmentSpecError(f"{where}: an environment spec needs a 'type' naming it")
        config = self.config(type_name, settings, where)
        return self.get(type_name)(config)


def build_environment(
    spec: Mapping[str, Any], registry: EnvironmentRegistry | None = None, where: str = "environment"
) -> Environment:
    """``EnvironmentRegistry.build`` on ``registry`` (default: the entry points)."""
    return (registry or EnvironmentRegistry()).build(spec, where)


def _explain(error: ValidationError, type_name: str, model: type[BaseModel], where: str) -> str:
    allowed = ", ".join(sorted(["type", *model.model_fields]))
    lines = [f"invalid settings for environment {type_name!r} at {where}:"]
    for problem in error.errors():
        key = ".".join([where, *(str(p) for p in problem["loc"])])
        if problem["type"] == "extra_forbidden":
            lines.append(f"  unknown key {key!r}; allowed keys here: {allowed}")
        else:
            lines.append(f"  {key}: {problem['msg']} (allowed keys here: {allowed})")
    return "\n".join(lines)
