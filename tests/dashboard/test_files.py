"""Serving the dashboard: an allow-list of packaged files under a strict CSP, no path
traversal, no inline script, and every file shipped in the wheel's package data."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

from reef.dashboard.files import CONTENT_SECURITY_POLICY, load_static_files
from tests.dashboard.world import DashboardWorld
from tests.fakes.upstream import FakeUpstreamThread
from tests.gateway import rawhttp
from tests.gateway.harness import GatewayThread, make_settings

ROOT = Path(__file__).resolve().parents[2]
STATIC = ROOT / "src" / "reef" / "dashboard" / "static"


def _get(world: DashboardWorld, path: str, **headers: str) -> rawhttp.RawResponse:
    return rawhttp.call(world.gateway.port, "GET", path, headers=headers)


def test_the_shell_is_served_without_a_key_under_a_strict_policy(world: DashboardWorld) -> None:
    redirect = _get(world, "/ui")
    assert redirect.status == 308 and redirect.headers["location"].endswith("/ui/")
    page = _get(world, "/ui/")
    assert page.status == 200
    assert page.headers["content-type"].startswith("text/html")
    assert page.headers["content-security-policy"] == CONTENT_SECURITY_POLICY
    assert "default-src 'self'" in CONTENT_SECURITY_POLICY
    assert "unsafe" not in CONTENT_SECURITY_POLICY
    assert page.headers["x-content-type-options"] == "nosniff"
    assert b'<script type="module" src="app.js">' in page.body
    # the key is asked for before any data call fails
    assert _get(world, "/ui/auth.json").json() == {"keys_required": True}


@pytest.mark.parametrize(
    ("path", "media_type"),
    [
        ("app.js", "text/javascript"),
        ("pages/candidate.js", "text/javascript"),
        ("pages/feedback.js", "text/javascript"),
        ("app.css", "text/css"),
        ("favicon.svg", "image/svg+xml"),
    ],
)
def test_assets_have_their_media_type_and_revalidate(
    world: DashboardWorld, path: str, media_type: str
) -> None:
    first = _get(world, f"/ui/{path}")
    assert first.status == 200
    assert first.headers["content-type"].startswith(media_type)
    assert first.headers["content-security-policy"] == CONTENT_SECURITY_POLICY
    again = _get(world, f"/ui/{path}", **{"if-none-match": first.headers["etag"]})
    assert again.status == 304 and again.body == b""


@pytest.mark.parametrize(
    "path",
    [
        "/ui/../pyproject.toml",
        "/ui/%2e%2e/files.py",
        "/ui/..%2f__init__.py",
        "/ui/files.py",
        "/ui/__init__.py",
        "/ui/static/app.js",
        "/ui/pages/../../files.py",
        "/ui//etc/passwd",
        "/ui/nothing.js",
    ],
)
def test_nothing_outside_the_allow_list_is_served(world: DashboardWorld, path: str) -> None:
    response = _get(world, path)
    assert response.status == 404, (path, response.body[:200])
    assert b"import" not in response.body


def test_without_keys_the_page_says_none_are_needed(tmp_path: Path) -> None:
    with (
        FakeUpstreamThread() as fake,
        GatewayThread(make_settings(tmp_path, fake.base_url)) as gateway,
    ):
        hint = rawhttp.call(gateway.port, "GET", "/ui/auth.json")
        assert hint.json() == {"keys_required": False}
        scenarios = rawhttp.call(gateway.port, "GET", "/reef/scenarios")
        assert scenarios.status == 200


def test_no_inline_script_or_style_and_no_html_from_strings() -> None:
    html = (STATIC / "index.html").read_text(encoding="utf-8")
    assert not re.search(r"<script(?![^>]*\bsrc=)", html), "inline <script> in index.html"
    assert not re.search(r"\sstyle=|\son[a-z]+=", html), "inline style or handler in index.html"
    for path in STATIC.rglob("*.js"):
        source = path.read_text(encoding="utf-8")
        for banned in (".innerHTML", ".outerHTML", "insertAdjacentHTML", "eval(", "new Function"):
            assert banned not in source, f"{path.name} uses {banned}"


def test_every_module_import_resolves_to_a_served_file() -> None:
    served = load_static_files()
    for name in served:
        if not name.endswith(".js"):
            continue
        source = served[name].data.decode()
        for target in re.findall(r'from "(\.[^"]+)"', source):
            resolved = (Path("/", name).parent / target).resolve().as_posix().lstrip("/")
            assert resolved in served, f"{name} imports {target}, which is not served"


def test_every_static_file_is_in_the_package_data() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    patterns = config["tool"]["setuptools"]["package-data"]["reef"]
    package = ROOT / "src" / "reef"
    shipped = {path for pattern in patterns for path in package.glob(pattern)}
    files = {path for path in STATIC.rglob("*") if path.is_file()}
    missing = sorted(path.relative_to(package).as_posix() for path in files - shipped)
    assert not missing, f"not in [tool.setuptools.package-data]: {missing}"
    assert set(load_static_files()) == {path.relative_to(STATIC).as_posix() for path in files}
