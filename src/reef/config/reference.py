"""The configuration reference (docs/configuration.md), generated from the models so
that no setting can go undocumented."""

from __future__ import annotations

from pathlib import PurePath
from typing import Any, get_args, get_origin

from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from reef.config.models import ReefSettings

_HEADER = """# Configuration reference

Reef reads `reef.yaml` in the working directory (or the file given with `-c PATH`, or
`REEF_CONFIG`), then applies environment overrides: `REEF_<SECTION>__<KEY>`, e.g.
`REEF_SERVER__PORT=9000` or `REEF_STORE__DURABILITY=async`. Unknown keys are errors that
name the key and the allowed ones. `reef config show` prints the merged result with
secrets masked; `reef config schema` prints the JSON schema.

This page is generated from the settings models (`python -m reef.config.reference`);
a test fails when it is out of date.
"""


def _type_name(annotation: Any) -> str:
    origin = get_origin(annotation)
    if origin is None:
        return getattr(annotation, "__name__", str(annotation))
    args = ", ".join(_type_name(a) for a in get_args(annotation))
    name = getattr(origin, "__name__", str(origin)).replace("UnionType", "union")
    if name in ("union", "Union"):
        return " | ".join(_type_name(a) for a in get_args(annotation))
    if name == "Literal":
        return " | ".join(repr(a) for a in get_args(annotation))
    return f"{name}[{args}]"


def _default(field: FieldInfo) -> str:
    if field.default_factory is not None:
        value = field.default_factory()  # type: ignore[call-arg]
        if isinstance(value, BaseModel):
            return "(section)"
        if isinstance(value, dict) and value:
            return "`" + ", ".join(sorted(value)) + "`"
        return f"`{value!r}`" if value else "empty"
    if isinstance(field.default, PurePath):
        return f"`{field.default}`"
    if field.default is PydanticUndefined:
        return "required"
    return f"`{field.default!r}`"


def _section_models(annotation: Any) -> list[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    found: list[type[BaseModel]] = []
    for arg in get_args(annotation):
        found += _section_models(arg)
    return found


def _table(title: str, model: type[BaseModel], lines: list[str]) -> None:
    lines += ["", f"## `{title}`", "", (model.__doc__ or "").strip(), ""]
    lines += ["| key | type | default | description |", "|---|---|---|---|"]
    for name, field in model.model_fields.items():
        description = (field.description or "").replace("|", "\\|").replace("\n", " ")
        type_name = _type_name(field.annotation).replace("NoneType", "null")
        type_name = type_name.replace("|", "\\|")
        key = field.alias or name  # ``budgets.global`` (a keyword in Python)
        lines.append(f"| `{key}` | {type_name} | {_default(field)} | {description} |")


def reference_markdown() -> str:
    """The whole reference page."""
    lines = [_HEADER.rstrip()]
    _table("(top level)", ReefSettings, lines)
    seen: set[type[BaseModel]] = set()
    pending = [(name, field.annotation) for name, field in ReefSettings.model_fields.items()]
    while pending:
        name, annotation = pending.pop(0)
        for model in _section_models(annotation):
            if model in seen:
                continue
            seen.add(model)
            container = get_origin(annotation)
            title = (
                f"{name}.<name>"
                if container is dict
                else f"{name}[]"
                if container is list
                else name
            )
            _table(title, model, lines)
            pending += [
                (f"{title}.{f.alias or n}", f.annotation) for n, f in model.model_fields.items()
            ]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(reference_markdown(), end="")
