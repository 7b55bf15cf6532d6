"""Harness bundles: a directory holding ``harness.yaml`` and optional extra files, and
its canonical digest.

The digest is ``"sha256:" + sha256(canonical JSON)`` of::

    {"format": "reef.harness.bundle/1",
     "harness": <the parsed, validated harness with defaults filled in>,
     "files": [[relative posix path, sha256 hex of its bytes], ...]}   # sorted by path

so it does not depend on file order, timestamps, YAML formatting, comments or key
order — only on what the harness means and the bytes of the extra files.
"""

from __future__ import annotations

import contextlib
import hashlib
import re
import shutil
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from types import MappingProxyType
from typing import Any, cast

import yaml
from pydantic import ValidationError

from reef.core.digests import UnsafeTreeError, tree_files
from reef.core.errors import InvalidInputError
from reef.core.jsoncodec import canonical_json, sha256_hex
from reef.harness.errors import InvalidHarnessError, UnsafeBundleError
from reef.harness.model import Harness

HARNESS_FILE = "harness.yaml"
DEFAULT_MAX_BYTES = 50 * 1024 * 1024
DEFAULT_MAX_FILES = 1000
_DRIVE = re.compile(r"[A-Za-z]:")


def bundle_path_problem(name: str) -> str | None:
    """Why ``name`` is not a safe relative bundle path, or ``None`` when it is."""
    if not name:
        return "empty path"
    if name.startswith("/") or _DRIVE.match(name):
        return "absolute path"
    if "\\" in name or "\0" in name:
        return "backslash or NUL in path"
    parts = name.split("/")
    if ".." in parts:
        return "'..' in path"
    if any(part in ("", ".") for part in parts):
        return "empty or '.' path component"
    return None


@dataclass(frozen=True)
class Bundle:
    """A harness and its extra files (relative posix path -> bytes; never
    ``harness.yaml``). Raises ``UnsafeBundleError`` for an unsafe path."""

    harness: Harness
    files: Mapping[str, bytes] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name, data in self.files.items():
            problem = bundle_path_problem(name)
            if problem is None and name == HARNESS_FILE:
                problem = "harness.yaml is the harness itself, not an extra file"
            if problem is not None:
                raise UnsafeBundleError(f"bundle file {name!r}: {problem}")
            if not isinstance(data, bytes):
                raise InvalidInputError(f"bundle file {name!r}: content must be bytes")
        ordered = dict(sorted(self.files.items(), key=lambda item: item[0].encode("utf-8")))
        object.__setattr__(self, "files", MappingProxyType(ordered))


class _NoAliasLoader(yaml.SafeLoader):
    """Safe YAML without anchors/aliases: an alias can expand a small file into an
    enormous document ("billion laughs"), so a bundle may not use them."""

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            event = cast(Any, self).peek_event()  # untyped in types-PyYAML
            raise yaml.composer.ComposerError(
                None, None, "YAML aliases are not allowed in harness.yaml", event.start_mark
            )
        return super().compose_node(parent, index)


class _CanonicalDumper(yaml.SafeDumper):
    """Block style for multi-line strings, so prompts stay readable."""


def _represent_str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_CanonicalDumper.add_representer(str, _represent_str)


def parse_harness_yaml(data: bytes, source: str = HARNESS_FILE) -> Harness:
    """Parse and validate ``harness.yaml`` bytes; raises ``InvalidHarnessError``."""
    try:
        document = yaml.load(data.decode("utf-8"), Loader=_NoAliasLoader)  # noqa: S506 (a SafeLoader subclass)
    except UnicodeDecodeError as exc:
        raise InvalidHarnessError(f"{source}: not UTF-8 text ({exc})") from exc
    except yaml.YAMLError as exc:
        raise InvalidHarnessError(f"{source}: invalid YAML: {exc}") from exc
    if not isinstance(document, dict):
        raise InvalidHarnessError(f"{source}: must be a mapping of harness fields")
    try:
        return Harness.model_validate(document)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(part) for part in error['loc']) or '(root)'}: {error['msg']}"
            for error in exc.errors()
        )
        raise InvalidHarnessError(f"{source}: {problems}") from exc


def _sorted_keys(value: Any) -> Any:
    if isinstance(value, dict):
        return {key: _sorted_keys(value[key]) for key in sorted(value)}
    if isinstance(value, list):
        return [_sorted_keys(item) for item in value]
    return value


def harness_yaml(harness: Harness) -> bytes:
    """The canonical ``harness.yaml`` text: top-level fields in schema order, nested
    keys sorted, defaults left out, multi-line strings as literal blocks."""
    dumped = harness.model_dump(mode="json", exclude_defaults=True)
    document = {key: _sorted_keys(dumped[key]) for key in Harness.model_fields if key in dumped}
    text = yaml.dump(
        document,
        Dumper=_CanonicalDumper,
        sort_keys=False,
        allow_unicode=True,
        default_flow_style=False,
        width=100,
    )
    return text.encode("utf-8")


def bundle_digest(bundle: Bundle) -> str:
    """The canonical digest of ``bundle`` (see module docstring)."""
    document = {
        "format": "reef.harness.bundle/1",
        "harness": bundle.harness.model_dump(mode="json"),
        "files": [[name, sha256_hex(data)] for name, data in bundle.files.items()],
    }
    return "sha256:" + hashlib.sha256(canonical_json(document)).hexdigest()


def check_limits(count: int, total: int, name: str, max_bytes: int, max_files: int) -> None:
    """Raise ``UnsafeBundleError`` naming ``name`` when ``count`` files or ``total``
    bytes exceed the limits."""
    if count > max_files:
        raise UnsafeBundleError(f"bundle entry {name!r}: more than {max_files} files")
    if total > max_bytes:
        raise UnsafeBundleError(f"bundle entry {name!r}: bundle exceeds {max_bytes} bytes")


def load_bundle(
    directory: Path,
    *,
    max_bytes: int = DEFAULT_MAX_BYTES,
    max_files: int = DEFAULT_MAX_FILES,
) -> Bundle:
    """Read the bundle in ``directory``. Raises ``InvalidHarnessError`` (no or bad
    ``harness.yaml``) or ``UnsafeBundleError`` (links, too many files or bytes)."""
    root = Path(directory)
    try:
        files = tree_files(root)
    except UnsafeTreeError as exc:
        raise UnsafeBundleError(f"bundle {exc.message}") from exc
    contents: dict[str, bytes] = {}
    total = 0
    for count, (relative, full) in enumerate(files, start=1):
        total += full.stat().st_size
        check_limits(count, total, relative, max_bytes, max_files)
        contents[relative] = full.read_bytes()
    if HARNESS_FILE not in contents:
        raise InvalidHarnessError(f"{str(root)!r} holds no {HARNESS_FILE}")
    harness = parse_harness_yaml(contents.pop(HARNESS_FILE), f"{root / HARNESS_FILE}")
    return Bundle(harness, contents)


def write_files(files: Mapping[str, bytes], directory: Path) -> None:
    """Write ``files`` (already checked relative paths) into ``directory`` atomically:
    into a temporary sibling, then renamed. ``directory`` must not exist or be empty;
    raises ``InvalidInputError`` otherwise."""
    target = Path(directory)
    if target.is_symlink() or (target.exists() and any(target.iterdir())):
        raise InvalidInputError(f"{str(target)!r} already exists and is not empty")
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = target.parent / f".{target.name}.tmp-{uuid.uuid4().hex}"
    try:
        staging.mkdir()
        for name, data in files.items():
            path = staging.joinpath(*PurePosixPath(name).parts)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
        with contextlib.suppress(FileNotFoundError):
            target.rmdir()  # an empty directory is replaced
        staging.rename(target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def write_bundle(bundle: Bundle, directory: Path) -> None:
    """Write ``bundle`` (canonical ``harness.yaml`` + extra files) into ``directory``,
    atomically; ``directory`` must not exist or be empty (else ``InvalidInputError``)."""
    write_files({HARNESS_FILE: harness_yaml(bundle.harness), **bundle.files}, directory)
