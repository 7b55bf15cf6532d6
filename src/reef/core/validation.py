"""Pydantic validation errors as the lines a person reads: one per problem, naming the
key by its dotted path (list items as ``[i]``), and for an unknown key the keys allowed
there. Shared by the configuration, recipes and request bodies."""

from __future__ import annotations

from typing import Any, get_args, get_origin

from pydantic import BaseModel, ValidationError


def problem_lines(error: ValidationError, root: type[BaseModel] | None = None) -> list[str]:
    """One line per problem of ``error``; with ``root`` (the model validated), an unknown
    key lists the keys allowed where it stands."""
    lines = []
    for problem in error.errors():
        loc = tuple(problem["loc"])
        key = dotted(loc)
        if problem["type"] == "extra_forbidden":
            owner = model_at(root, loc) if root is not None else None
            allowed = ", ".join(sorted(owner.model_fields)) if owner else "?"
            lines.append(f"unknown key {key!r}; allowed keys here: {allowed}")
        elif not loc and problem["type"] == "value_error":
            # a check across keys: its message names the setting itself
            lines.append(str(problem.get("ctx", {}).get("error", problem["msg"])))
        else:
            lines.append(f"{key}: {problem['msg']}")
    return lines


def dotted(loc: tuple[int | str, ...]) -> str:
    """``("learners", 0, "lr")`` as ``learners[0].lr``; the empty path as ``(top level)``."""
    key = ".".join(f"[{part}]" if isinstance(part, int) else str(part) for part in loc)
    return key.replace(".[", "[") or "(top level)"


def model_at(root: type[BaseModel], loc: tuple[int | str, ...]) -> type[BaseModel] | None:
    """The model class that owns the key at ``loc`` (the path without its last part),
    stepping through optional, list and dict fields; None when the path leaves the models
    (e.g. a tagged union's member)."""
    model: Any = root
    for part in loc[:-1]:
        if isinstance(model, type) and issubclass(model, BaseModel):
            if isinstance(part, int):
                return None
            field = model.model_fields.get(str(part))
            if field is None:
                return None
            model = field.annotation
        else:
            # a dict[str, Model] or list[Model]: step into the value type
            args = [a for a in get_args(model) if a is not type(None)]
            model = args[-1] if args else None
        while get_origin(model) is not None and get_origin(model) not in (dict, list):
            args = [a for a in get_args(model) if a is not type(None)]
            model = args[0] if args else None
    if isinstance(model, type) and issubclass(model, BaseModel):
        return model
    return None
