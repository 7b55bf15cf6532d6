"""Bundle schema, loading/writing, and the canonical digest."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from reef.core.errors import InvalidInputError
from reef.harness import (
    Bundle,
    Harness,
    InvalidHarnessError,
    UnsafeBundleError,
    bundle_digest,
    harness_yaml,
    load_bundle,
    parse_harness_yaml,
    write_bundle,
)

YAML_BLOCK = b"""\
schema_version: 1
system_prompt: |
  You are terse.
instructions:
  - Be kind.
  - Cite sources.
tools:
  - type: function
    function:
      name: search
      parameters:
        type: object
        properties:
          q: {type: string}
params:
  temperature: 0.5
  max_tokens: 64
"""

# Same meaning: flow style, other key order, comments, quoting.
YAML_FLOW = b"""\
# a comment
params: {max_tokens: 64, "temperature": 0.50}
tools: [{function: {parameters: {properties: {q: {type: "string"}}, type: object},
         name: 'search'}, type: function}]
instructions: ["Be kind.", 'Cite sources.']
system_prompt: "You are terse.\\n"
schema_version: 1
memory: []
"""


def _write_tree(root: Path, files: dict[str, bytes], order: list[str]) -> None:
    for name in order:
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(files[name])


def test_digest_ignores_yaml_formatting_and_key_order() -> None:
    first, second = parse_harness_yaml(YAML_BLOCK), parse_harness_yaml(YAML_FLOW)
    assert first == second
    assert bundle_digest(Bundle(first)) == bundle_digest(Bundle(second))


def test_digest_ignores_file_order_and_timestamps(tmp_path: Path) -> None:
    files = {"harness.yaml": YAML_BLOCK, "skills/b.md": b"b", "a.txt": b"a", "z/y/x": b"x"}
    _write_tree(tmp_path / "one", files, sorted(files))
    _write_tree(tmp_path / "two", {**files, "harness.yaml": YAML_FLOW}, sorted(files)[::-1])
    os.utime(tmp_path / "two" / "a.txt", (1, 1))
    one, two = load_bundle(tmp_path / "one"), load_bundle(tmp_path / "two")
    assert bundle_digest(one) == bundle_digest(two)
    reordered = Bundle(one.harness, dict(reversed(list(one.files.items()))))
    assert bundle_digest(reordered) == bundle_digest(one)


def test_digest_changes_with_content(bundle: Bundle) -> None:
    base = bundle_digest(bundle)
    assert base.startswith("sha256:") and len(base) == 71
    changed_file = Bundle(bundle.harness, {**bundle.files, "README.md": b"other"})
    renamed = dict(bundle.files)
    renamed["README2.md"] = renamed.pop("README.md")
    changed_prompt = Bundle(bundle.harness.model_copy(update={"system_prompt": "Hi"}))
    digests = {
        base,
        bundle_digest(changed_file),
        bundle_digest(Bundle(bundle.harness, renamed)),
        bundle_digest(changed_prompt),
    }
    assert len(digests) == 4


def test_write_then_load_round_trips(bundle: Bundle, tmp_path: Path) -> None:
    write_bundle(bundle, tmp_path / "b")
    loaded = load_bundle(tmp_path / "b")
    assert loaded == bundle
    assert bundle_digest(loaded) == bundle_digest(bundle)
    assert (tmp_path / "b" / "harness.yaml").read_bytes() == harness_yaml(bundle.harness)
    assert [p.name for p in tmp_path.iterdir()] == ["b"]  # no staging left behind
    with pytest.raises(InvalidInputError, match="not empty"):
        write_bundle(bundle, tmp_path / "b")


def test_canonical_yaml_is_readable_and_stable(bundle: Bundle) -> None:
    text = harness_yaml(bundle.harness).decode()
    assert text.startswith("schema_version: 1\nsystem_prompt: You are a travel assistant.\n")
    assert parse_harness_yaml(text.encode()) == bundle.harness
    multi = bundle.harness.model_copy(update={"system_prompt": "line one\nline two\n"})
    assert "system_prompt: |\n  line one\n  line two\n" in harness_yaml(multi).decode()


@pytest.mark.parametrize(
    ("yaml_text", "message"),
    [
        (b"system_prompt: hi\n", "schema_version: Field required"),
        (b"schema_version: 2\n", "schema_version: Input should be 1"),
        (b"schema_version: 1\nsurprise: 1\n", "surprise: Extra inputs are not permitted"),
        (b"schema_version: 1\ntools: [{type: function}]\n", "tools[0]: 'function' must be"),
        (
            b"schema_version: 1\ntools: [{type: function, function: {name: 'a b'}}]\n",
            "function name 'a b'",
        ),
        (b"schema_version: 1\nparams: {temperature: hot}\n", "params.temperature must be"),
        (b"schema_version: 1\nparams: {messages: []}\n", "params may not set ['messages']"),
        (b"schema_version: 1\nenforced_params: [seed]\n", "['seed'] have no value in params"),
        (
            b"schema_version: 1\nexamples: [{messages: [{role: system, content: x}]}]\n",
            "role must be one of",
        ),
        (b"schema_version: 1\norchestration: {tool_choice: maybe}\n", "tool_choice must be"),
        (b"- just a list\n", "must be a mapping"),
        (b"schema_version: [1\n", "invalid YAML"),
        (b"a: &x [1]\nb: *x\n", "YAML aliases are not allowed"),
        (b"\xff\xfe", "not UTF-8"),
    ],
)
def test_invalid_harness_yaml_is_refused_clearly(yaml_text: bytes, message: str) -> None:
    with pytest.raises(InvalidHarnessError, match=r"harness\.yaml") as caught:
        parse_harness_yaml(yaml_text)
    assert message in caught.value.message


def test_duplicate_tool_and_skill_names_are_refused(harness: Harness) -> None:
    data = harness.model_dump()
    with pytest.raises(ValueError, match="tool names must be unique"):
        Harness.model_validate({**data, "tools": data["tools"] * 2})
    with pytest.raises(ValueError, match="skill names must be unique"):
        Harness.model_validate({**data, "skills": data["skills"][:1] * 2})


def test_harness_is_frozen(harness: Harness) -> None:
    with pytest.raises(ValueError, match="frozen"):
        harness.system_prompt = "changed"


@pytest.mark.parametrize("name", ["/abs", "../up", "a/../../b", "a//b", "./a", "a\\b", ""])
def test_bundle_refuses_unsafe_file_names(harness: Harness, name: str) -> None:
    with pytest.raises(UnsafeBundleError, match="bundle file"):
        Bundle(harness, {name: b"x"})


def test_load_bundle_refuses_links_and_missing_yaml(tmp_path: Path) -> None:
    (tmp_path / "harness.yaml").write_bytes(YAML_BLOCK)
    (tmp_path / "link").symlink_to("/etc/hostname")
    with pytest.raises(UnsafeBundleError, match="symbolic link"):
        load_bundle(tmp_path)
    (tmp_path / "link").unlink()
    (tmp_path / "harness.yaml").unlink()
    with pytest.raises(InvalidHarnessError, match=r"holds no harness\.yaml"):
        load_bundle(tmp_path)


def test_load_bundle_enforces_limits(tmp_path: Path) -> None:
    (tmp_path / "harness.yaml").write_bytes(YAML_BLOCK)
    for index in range(3):
        (tmp_path / f"f{index}").write_bytes(b"x" * 100)
    with pytest.raises(UnsafeBundleError, match="more than 3 files"):
        load_bundle(tmp_path, max_files=3)
    with pytest.raises(UnsafeBundleError, match="exceeds 200 bytes"):
        load_bundle(tmp_path, max_bytes=200)
