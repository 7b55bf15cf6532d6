"""Driving Debian's Chromium with Playwright (no browser download): find the browser or
skip, open dashboard pages and wait until they rendered, collect console errors, and
check screenshots are real pictures."""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

# CI sets this so that a missing browser fails the run instead of skipping the test.
REQUIRE_ENV = "REEF_TEST_REQUIRE_BROWSER"
CHROMIUM_ENV = "REEF_TEST_CHROMIUM"
TIMEOUT_MS = 15_000


def chromium_path() -> str:
    """The Chromium executable, or skip (fail under ``REEF_TEST_REQUIRE_BROWSER=1``)."""
    found = os.environ.get(CHROMIUM_ENV) or shutil.which("chromium")
    found = found or shutil.which("chromium-browser")
    problem = None
    if not found:
        problem = "Chromium is not installed (Debian: apt-get install chromium)"
    else:
        try:
            import playwright.sync_api  # noqa: F401
        except ImportError:
            problem = "playwright is not installed (pip install -e '.[dev]')"
    if problem is not None:
        if os.environ.get(REQUIRE_ENV) == "1":
            pytest.fail(f"{problem}, and {REQUIRE_ENV}=1 requires the browser test")
        pytest.skip(f"dashboard browser test: {problem}")
    assert found is not None
    return found


@dataclass
class DashboardPage:
    """One browser tab on the dashboard of ``base_url``, recording console problems."""

    page: Any
    base_url: str
    shots: Path
    problems: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.page.set_default_timeout(TIMEOUT_MS)
        self.page.on("console", self._console)
        self.page.on("pageerror", lambda error: self.problems.append(f"page error: {error}"))

    def _console(self, message: Any) -> None:
        if message.type in ("error", "warning"):
            self.problems.append(f"console {message.type}: {message.text}")

    def open(self, route: str, state: str = "ready") -> None:
        """Go to ``/ui/<route>`` (``#/...``) and wait until it shows ``state``."""
        self.page.goto(f"{self.base_url}/ui/{route}")
        self.wait(route, state)

    def sign_in(self, key: str) -> None:
        """Enter ``key`` in the key prompt the page shows."""
        self.page.fill("#admin-key", key)
        self.page.click("#key-form button")

    def wait(self, route: str, state: str = "ready") -> None:
        # a selector, not a JS predicate: the page's CSP forbids eval
        self.page.wait_for_selector(f'body[data-path="{route}"][data-state="{state}"]')

    def text(self, selector: str = "#view") -> str:
        return str(self.page.inner_text(selector))

    def texts(self, selector: str) -> list[str]:
        """The text of every element matching ``selector``."""
        found = self.page.eval_on_selector_all(selector, "nodes => nodes.map(n => n.textContent)")
        return [str(text) for text in found]

    def count(self, selector: str) -> int:
        return int(self.page.locator(selector).count())

    def screenshot(self, name: str) -> Path:
        """A full-page PNG under the test's folder, checked to be a real picture."""
        path = self.shots / f"{name}.png"
        self.page.screenshot(path=str(path), full_page=True)
        check_screenshot(path)
        return path


def check_screenshot(path: Path) -> None:
    """The PNG is page-sized and not blank: many colours, no single colour covering
    nearly all of it, and some dark ink (text, lines)."""
    import numpy as np
    from matplotlib.image import imread

    pixels = (imread(str(path))[..., :3] * 255).round().astype(int)
    height, width = pixels.shape[:2]
    assert width >= 1000 and height >= 600, f"{path.name}: {width}x{height}"
    flat = pixels.reshape(-1, 3)
    _, counts = np.unique(flat[:, 0] * 65536 + flat[:, 1] * 256 + flat[:, 2], return_counts=True)
    assert len(counts) > 100, f"{path.name} has only {len(counts)} colours"
    dominant = counts.max() / len(flat)
    assert dominant < 0.95, f"{path.name} is {dominant:.1%} one colour"
    ink = (flat.min(axis=1) < 150).mean()
    assert ink > 0.002, f"{path.name} has almost no text ({ink:.2%} dark pixels)"
