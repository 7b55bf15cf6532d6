"""The docs pages: recipe examples parse, every page is indexed, links and anchors resolve."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from reef.learning.recipes import parse_recipe
from reef.learning.registry import LearnerRegistry

DOCS = Path(__file__).resolve().parents[2] / "docs"
_FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.MULTILINE | re.DOTALL)
_LINK = re.compile(r"\]\(([^)\s]+)\)")


def _blocks(page: str, language: str) -> list[str]:
    text = (DOCS / page).read_text(encoding="utf-8")
    return [body for lang, body in _FENCE.findall(text) if lang == language]


def _recipe_blocks() -> list[str]:
    blocks = []
    for body in _blocks("recipes.md", "yaml"):
        lines = [line for line in body.splitlines() if line and not line.startswith("#")]
        if lines and lines[0].startswith("schema_version"):
            blocks.append(body)
    return blocks


def test_recipes_page_has_recipes() -> None:
    assert len(_recipe_blocks()) >= 3


@pytest.mark.parametrize("index", range(len(_recipe_blocks())))
def test_every_recipe_example_parses(index: int) -> None:
    body = _recipe_blocks()[index]
    recipe = parse_recipe(yaml.safe_load(body), f"docs/recipes.md block {index}", LearnerRegistry())
    assert recipe.learners


def test_the_index_links_every_page() -> None:
    index = (DOCS / "README.md").read_text(encoding="utf-8")
    linked = set(_LINK.findall(index))
    missing = [page.name for page in DOCS.glob("*.md") if page.name != "README.md"]
    missing = [name for name in missing if name not in linked]
    assert not missing, f"docs/README.md does not link: {missing}"


def _anchors(path: Path) -> set[str]:
    anchors = set()
    text = _FENCE.sub("", path.read_text(encoding="utf-8"))
    for heading in re.findall(r"^#+ (.+)$", text, re.MULTILINE):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        anchors.add(slug)
    return anchors


def test_relative_links_and_anchors_resolve() -> None:
    broken = []
    for page in [*sorted(DOCS.glob("*.md")), DOCS.parent / "README.md"]:
        text = _FENCE.sub("", page.read_text(encoding="utf-8"))
        for target in _LINK.findall(text):
            if target.startswith(("http://", "https://", "mailto:")):
                continue
            file_part, _, anchor = target.partition("#")
            resolved = (page.parent / file_part).resolve() if file_part else page
            if not resolved.exists():
                broken.append(f"{page.name}: {target} (no such file)")
            elif anchor and resolved.suffix == ".md" and anchor not in _anchors(resolved):
                broken.append(f"{page.name}: {target} (no such heading)")
    assert not broken, "broken links in docs/ and the README:\n" + "\n".join(broken)
