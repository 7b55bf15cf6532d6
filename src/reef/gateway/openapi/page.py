"""``GET /docs``: the OpenAPI document rendered as one self-contained HTML page.

Server-rendered from the document, so it cannot drift from ``/openapi.json``; no script
and no external resource, so its Content-Security-Policy allows nothing but its own
stylesheet (by hash).
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
from html import escape
from typing import Any

_STYLE = """
body { font: 15px/1.5 system-ui, sans-serif; max-width: 62rem; margin: 2rem auto;
       padding: 0 1rem; color: #1d2430; }
code, pre { font: 13px/1.4 ui-monospace, monospace; }
pre { background: #f4f6f8; padding: .6rem; overflow-x: auto; }
section { border-top: 1px solid #d8dde3; padding: .4rem 0 .8rem; }
.method { display: inline-block; min-width: 3.5rem; font-weight: 700; }
.get { color: #17653a; } .post { color: #8a4b00; }
table { border-collapse: collapse; margin: .4rem 0; }
td, th { border: 1px solid #d8dde3; padding: .2rem .5rem; text-align: left;
         vertical-align: top; }
nav a { margin-right: 1rem; }
"""


def style_hash(style: str = _STYLE) -> str:
    """The CSP source expression that allows exactly ``style``."""
    digest = hashlib.sha256(style.encode()).digest()
    return "sha256-" + base64.b64encode(digest).decode()


def _text(text: str) -> str:
    """Escaped prose, with `backticked` spans as code."""
    return re.sub(r"`([^`]+)`", r"<code>\1</code>", escape(text))


def _parameters(parameters: list[dict[str, Any]]) -> str:
    if not parameters:
        return ""
    rows = "".join(
        f"<tr><td><code>{escape(p['name'])}</code></td><td>{escape(p['in'])}</td>"
        f"<td>{'yes' if p.get('required') else 'no'}</td>"
        f"<td>{_text(p.get('description', ''))}</td></tr>"
        for p in parameters
    )
    return (
        "<table><tr><th>parameter</th><th>in</th><th>required</th><th>meaning</th></tr>"
        f"{rows}</table>"
    )


def _body(operation: dict[str, Any], schemas: dict[str, Any]) -> str:
    body = operation.get("requestBody")
    if body is None:
        return ""
    if "application/json" not in body["content"]:  # an upload: text of these media types
        types = ", ".join(f"<code>{escape(media)}</code>" for media in body["content"])
        return f"<p>Body: {types}</p>"
    ref = body["content"]["application/json"]["schema"]["$ref"]
    name = ref.rsplit("/", 1)[1]
    schema = json.dumps(schemas[name], indent=2, sort_keys=True)
    return f"<p>Body: <code>{escape(name)}</code></p><pre>{escape(schema)}</pre>"


def _responses(responses: dict[str, Any]) -> str:
    items = []
    for status, response in responses.items():
        headers = ", ".join(f"<code>{escape(h)}</code>" for h in response.get("headers", {}))
        types = ", ".join(f"<code>{escape(t)}</code>" for t in response.get("content", {}))
        extra = "".join(
            f" {label}: {value}." for label, value in (("as", types), ("headers", headers)) if value
        )
        items.append(f"<li><b>{escape(status)}</b> {_text(response['description'])}{extra}</li>")
    return f"<ul>{''.join(items)}</ul>"


def _operation_html(method: str, path: str, operation: dict[str, Any], schemas: Any) -> str:
    return (
        f'<section id="{escape(operation["operationId"])}">'
        f'<h3><span class="method {method}">{method.upper()}</span> <code>{escape(path)}</code>'
        f"</h3><p><b>{escape(operation['summary'])}</b>. {_text(operation['description'])}</p>"
        f"{_parameters(operation.get('parameters', []))}{_body(operation, schemas)}"
        f"{_responses(operation['responses'])}</section>"
    )


def render_page(document: dict[str, Any]) -> tuple[bytes, str]:
    """The page's bytes and the CSP hash of its stylesheet."""
    by_tag: dict[str, list[str]] = {tag["name"]: [] for tag in document["tags"]}
    schemas = document["components"]["schemas"]
    for path, methods in document["paths"].items():
        for method, operation in methods.items():
            html = _operation_html(method, path, operation, schemas)
            by_tag[operation["tags"][0]].append(html)
    info = document["info"]
    title = f"{info['title']} {info['version']}"
    nav = "".join(f'<a href="#tag-{escape(name)}">{escape(name)}</a>' for name in by_tag)
    parts = [
        f"<!doctype html><html lang=en><head><meta charset=utf-8><title>{escape(title)}"
        f"</title><meta name=viewport content='width=device-width'><style>{_STYLE}</style>"
        f"</head><body><h1>{escape(title)}</h1><p>{_text(info['description'])}</p>"
        '<p>Machine-readable: <a href="/openapi.json"><code>/openapi.json</code></a> '
        f"(OpenAPI {escape(document['openapi'])}).</p><nav>{nav}</nav>"
    ]
    for tag in document["tags"]:
        name = tag["name"]
        parts.append(f'<h2 id="tag-{escape(name)}">{escape(name)}</h2>')
        parts.append(f"<p>{_text(tag['description'])}</p>")
        parts.extend(by_tag[name])
    parts.append("</body></html>")
    return "".join(parts).encode(), style_hash()
