"""Serving the dashboard's static files: an allow-list read once at startup.

Every file under ``static/`` is loaded into memory when ``DashboardFiles`` is built; a
request names a key of that mapping or gets a 404, so no request path ever reaches the
file system (no traversal). Every answer carries a strict Content-Security-Policy (only
this origin's scripts, styles and API; no inline script), ``nosniff`` and no framing.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from importlib import resources
from importlib.resources.abc import Traversable

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from reef.core import dumps

STATIC_PACKAGE = "reef.dashboard"
STATIC_DIR = "static"
INDEX = "index.html"
AUTH_HINT = "auth.json"

CONTENT_SECURITY_POLICY = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'none'; "
    "frame-ancestors 'none'"
)
SECURITY_HEADERS = {
    "content-security-policy": CONTENT_SECURITY_POLICY,
    "x-content-type-options": "nosniff",
    "x-frame-options": "DENY",
    "referrer-policy": "no-referrer",
}
MEDIA_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".svg": "image/svg+xml",
    ".json": "application/json",
}


@dataclass(frozen=True)
class StaticFile:
    """One served file: its bytes, media type and a strong ETag."""

    data: bytes
    media_type: str
    etag: str


def _walk(folder: Traversable, prefix: str) -> dict[str, StaticFile]:
    found: dict[str, StaticFile] = {}
    for entry in folder.iterdir():
        name = prefix + entry.name
        if entry.is_dir():
            found.update(_walk(entry, name + "/"))
            continue
        suffix = "." + entry.name.rpartition(".")[2]
        media_type = MEDIA_TYPES.get(suffix)
        if media_type is None:
            continue  # only the kinds of file the app is made of are served
        data = entry.read_bytes()
        etag = '"' + hashlib.sha256(data).hexdigest()[:32] + '"'
        found[name] = StaticFile(data, media_type, etag)
    return found


def load_static_files() -> dict[str, StaticFile]:
    """Every servable file of the installed package, keyed by its path under ``static/``."""
    return _walk(resources.files(STATIC_PACKAGE).joinpath(STATIC_DIR), "")


class DashboardFiles:
    """The ``/ui`` routes. ``keys_required`` tells the page, before any data call, that
    it will need a key (``/ui/auth.json``), so a first visit asks for one instead of
    failing a request first."""

    def __init__(self, keys_required: bool) -> None:
        self.files = load_static_files()
        if INDEX not in self.files:
            raise RuntimeError(f"the dashboard's {STATIC_DIR}/{INDEX} is missing from the package")
        self.keys_required = keys_required

    async def root(self, request: Request) -> Response:
        """``GET /ui``: redirect to ``/ui/`` so the page's relative asset paths resolve."""
        return RedirectResponse(str(request.url.path) + "/", status_code=308)

    async def asset(self, request: Request) -> Response:
        """``GET /ui/{path}``: a file of the allow-list (``/ui/`` is the HTML shell)."""
        path = request.path_params.get("path") or INDEX
        if path == AUTH_HINT:
            return Response(
                dumps({"keys_required": self.keys_required}),
                media_type="application/json",
                headers={**SECURITY_HEADERS, "cache-control": "no-store"},
            )
        found = self.files.get(path)
        if found is None:
            return Response(
                dumps({"error": {"message": f"no dashboard file {path!r}", "type": "not_found"}}),
                status_code=404,
                media_type="application/json",
                headers=SECURITY_HEADERS,
            )
        headers = {**SECURITY_HEADERS, "etag": found.etag, "cache-control": "no-cache"}
        if request.headers.get("if-none-match") == found.etag:
            return Response(status_code=304, headers=headers)
        return Response(found.data, media_type=found.media_type, headers=headers)
