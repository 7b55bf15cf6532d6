"""``EnvironmentRegistry``: environment classes by their ``type:`` name in the
``reef.environments`` entry-point group, and building one from a spec."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from reef.core.plugins import PluginRegistry
from reef.environments.base import Environment, EnvironmentConfig, UnknownEnvironmentError
from reef.environments.tasks import EnvironmentSpecError

ENVIRONMENT_GROUP = "reef.environments"


class EnvironmentRegistry(PluginRegistry[Environment, EnvironmentConfig]):
    """Environment classes by type name: the ``reef.environments`` entry points, plus (or
    instead of) ``classes`` given here, which win over entry points of the same name.
    Entry points are loaded only when their type is used."""

    group = ENVIRONMENT_GROUP
    kind = "environment"
    base = Environment
    unknown_error = UnknownEnvironmentError
    settings_error = EnvironmentSpecError

    def check(self, spec: Mapping[str, Any], where: str = "environment") -> EnvironmentConfig:
        """The validated settings of ``spec`` (``{"type": name, ...settings}``), without
        building the environment. Raises as :meth:`build` does."""
        type_name, settings = self.spec_settings(spec, where)
        return self.config(type_name, settings, where)

    def build(self, spec: Mapping[str, Any], where: str = "environment") -> Environment:
        """An environment from ``spec`` (``{"type": name, ...settings}``). Raises
        ``EnvironmentSpecError`` for a spec without a string ``type`` or with bad
        settings, ``UnknownEnvironmentError`` for an unregistered type."""
        config = self.check(spec, where)
        return self.get(str(spec["type"]))(config)


def build_environment(
    spec: Mapping[str, Any], registry: EnvironmentRegistry | None = None, where: str = "environment"
) -> Environment:
    """``EnvironmentRegistry.build`` on ``registry`` (default: the entry points)."""
    return (registry or EnvironmentRegistry()).build(spec, where)
