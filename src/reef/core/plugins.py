"""``PluginRegistry``: plugin classes by their ``type:`` name in an entry-point group.

Learners (``reef.learners``), scorers (``reef.scorers``) and environments
(``reef.environments``) are all found the same way: the built-ins register in
``pyproject.toml`` exactly as a third-party plugin would, a test or an embedding
application may pass ``classes`` instead (they win over entry points of the same name),
and an entry point is loaded only when its type is used, so listing names imports
nothing. YAML only ever selects a registered name; it never names a ``module:callable``
to import, so a config file cannot run arbitrary code.

A registry validates a plugin's settings with the class's pydantic ``config_model`` and
says what is wrong in the words of the recipe: each bad key by its path under ``where``
and the keys allowed there (``spec_settings`` splits a ``{"type": ..., ...}`` spec).
"""

from __future__ import annotations

from collections.abc import Mapping
from importlib.metadata import EntryPoint, entry_points
from typing import Any, ClassVar, Generic, TypeVar, cast

from pydantic import BaseModel, ValidationError

from reef.core.errors import InvalidInputError
from reef.core.validation import dotted

PluginT = TypeVar("PluginT")
ConfigT = TypeVar("ConfigT", bound=BaseModel)


class PluginRegistry(Generic[PluginT, ConfigT]):
    """Plugin classes of one kind by type name. A subclass names the kind: ``group``
    (the entry-point group), ``kind`` (the word in messages: "learner"), ``base`` (the
    class every plugin subclasses; each has a ``config_model``), and the errors it
    raises: ``unknown_error`` for an unregistered name, ``settings_error`` for bad
    settings or an entry point that is not a ``base``."""

    group: ClassVar[str]
    kind: ClassVar[str]
    base: ClassVar[type[Any]]
    unknown_error: ClassVar[type[InvalidInputError]] = InvalidInputError
    settings_error: ClassVar[type[InvalidInputError]] = InvalidInputError

    def __init__(
        self, classes: Mapping[str, type[PluginT]] | None = None, entry_points_too: bool = True
    ) -> None:
        self._entry_points: dict[str, EntryPoint] = {}
        if entry_points_too:
            self._entry_points = {ep.name: ep for ep in entry_points(group=self.group)}
        self._classes: dict[str, type[PluginT]] = dict(classes or {})

    def known(self) -> list[str]:
        """Every registered type name, sorted."""
        return sorted(self._entry_points.keys() | self._classes.keys())

    def get(self, type_name: str) -> type[PluginT]:
        """The class for ``type_name``; raises ``unknown_error`` listing the known
        names, or ``settings_error`` when the entry point is not a ``base`` class."""
        if type_name in self._classes:
            return self._classes[type_name]
        entry = self._entry_points.get(type_name)
        if entry is None:
            raise self.unknown_error(
                f"unknown {self.kind} type {type_name!r}; known types: {', '.join(self.known())}"
            )
        loaded = entry.load()
        if not (isinstance(loaded, type) and issubclass(loaded, self.base)):
            raise self.settings_error(
                f"entry point {type_name!r} = {entry.value!r} is not a reef "
                f"{self.base.__name__} class"
            )
        self._classes[type_name] = loaded
        return cast(type[PluginT], loaded)

    def config(self, type_name: str, settings: Mapping[str, Any], where: str) -> ConfigT:
        """``settings`` validated by the class's ``config_model`` (nothing is built);
        raises ``settings_error`` naming each bad key under ``where`` (e.g.
        ``learners[0]``) and the keys allowed there."""
        model: type[ConfigT] = getattr(self.get(type_name), "config_model")  # noqa: B009 (typed here)
        try:
            return model.model_validate(dict(settings))
        except ValidationError as error:
            raise self.settings_error(
                settings_problems(error, model, f"{self.kind} {type_name!r}", where)
            ) from error

    def spec_settings(
        self, spec: Mapping[str, Any] | str, where: str, names_allowed: bool = False
    ) -> tuple[str, dict[str, Any]]:
        """A spec's type name and its other settings. A spec is a mapping with a string
        ``type``, or (``names_allowed``) a bare type name; else ``settings_error``."""
        if isinstance(spec, str) and names_allowed:
            return spec, {}
        if not isinstance(spec, Mapping):
            shape = "a type name or a mapping" if names_allowed else "a mapping"
            raise self.settings_error(
                f"{where}: {_a(self.kind)} spec is {shape} with 'type', got {type(spec).__name__}"
            )
        settings = dict(spec)
        type_name = settings.pop("type", None)
        if not isinstance(type_name, str) or not type_name:
            raise self.settings_error(f"{where}: {_a(self.kind)} spec needs a 'type' naming it")
        return type_name, settings


def settings_problems(error: ValidationError, model: type[BaseModel], what: str, where: str) -> str:
    """The message for plugin settings that ``model`` refused: a heading naming ``what``
    and ``where``, then one line per problem with its key's path and the keys allowed
    (a field's alias where it has one, as a spec spells it)."""
    allowed = ", ".join(
        sorted(["type", *(field.alias or name for name, field in model.model_fields.items())])
    )
    lines = [f"invalid settings for {what} at {where}:"]
    for problem in error.errors():
        key = dotted((where, *problem["loc"]))
        if problem["type"] == "extra_forbidden":
            lines.append(f"  unknown key {key!r}; allowed keys here: {allowed}")
        else:
            lines.append(f"  {key}: {problem['msg']} (allowed keys here: {allowed})")
    return "\n".join(lines)


def _a(word: str) -> str:
    return f"{'an' if word[:1] in 'aeiou' else 'a'} {word}"
