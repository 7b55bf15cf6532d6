"""``GET /openapi.json`` describes every route of the app; ``GET /docs`` renders it."""

from __future__ import annotations

import base64
import hashlib
import re
from collections.abc import Callable
from typing import Any

import jsonschema
import pytest
from openapi_spec_validator import validate
from starlette.routing import Route

from reef.gateway.openapi.document import INFERENCE_HEADERS, RECEIPT_HEADERS, openapi_document
from tests.gateway.harness import GatewayThread
from tests.gateway.rawhttp import call

KEYS = {"keys": [{"id": "app", "key": "sk-app", "role": "inference"}]}


def _app_operations(gateway: GatewayThread) -> set[tuple[str, str]]:
    found = set()
    for route in gateway.app.app.routes:
        assert isinstance(route, Route), f"not a plain Route, document it by hand: {route!r}"
        if not route.include_in_schema:
            continue
        path = re.sub(r"{(\w+):\w+}", r"{\1}", route.path)  # {path:path} -> {path}
        for method in route.methods or ():
            if method != "HEAD":  # Starlette adds HEAD to every GET
                found.add((method.lower(), path))
    return found


def test_every_route_of_the_app_is_in_the_document(gateway: GatewayThread) -> None:
    document = openapi_document()
    documented = {(method, path) for path, ops in document["paths"].items() for method in ops}
    served = _app_operations(gateway)
    assert served - documented == set(), "routes missing from reef.gateway.openapi.document"
    assert documented - served == set(), "documented operations the app does not serve"


def test_the_document_is_valid_openapi_3_1() -> None:
    document = openapi_document()
    assert document["openapi"].startswith("3.1")
    validate(document)  # raises on any structural error
    for path, operations in document["paths"].items():
        declared = set(re.findall(r"{([^}]+)}", path))
        for operation in operations.values():
            in_path = {p["name"] for p in operation.get("parameters", []) if p["in"] == "path"}
            assert in_path == declared, (path, in_path)


def test_bodies_come_from_the_pydantic_models() -> None:
    document = openapi_document()
    schemas = document["components"]["schemas"]
    assert schemas["FeedbackIn"]["additionalProperties"] is False
    assert schemas["FeedbackIn"]["anyOf"][1]["required"] == ["record_ids"]
    assert schemas["ReportIn"]["anyOf"][1]["required"] == ["references"]
    assert "record_ids" not in schemas["ReportIn"]["properties"]
    assert set(schemas["RollbackIn"]["required"]) == {"to"}
    assert set(schemas["PromoteIn"]["required"]) == {"candidate_id"}
    rollback = document["paths"]["/reef/scenarios/{scenario}/rollback"]["post"]
    ref = rollback["requestBody"]["content"]["application/json"]["schema"]["$ref"]
    assert ref == "#/components/schemas/RollbackIn"
    abandon = document["paths"]["/reef/candidates/{candidate_id}/abandon"]["post"]
    assert abandon["requestBody"]["content"]["application/json"]["schema"]["$ref"].endswith(
        "/AbandonIn"
    )


def test_inference_routes_carry_the_reef_headers() -> None:
    document = openapi_document()
    for path in (
        "/v1/chat/completions",
        "/v1/messages",
        "/v1/responses",
        "/v1/completions",
        "/v1/embeddings",
    ):
        operation = document["paths"][path]["post"]
        names = {p["name"] for p in operation["parameters"] if p["in"] == "header"}
        assert {h["name"] for h in INFERENCE_HEADERS} <= names
        assert set(operation["responses"]["200"]["headers"]) == set(RECEIPT_HEADERS)
    assert set(document["components"]["securitySchemes"]) == {"bearer", "apiKey"}
    assert document["paths"]["/healthz"]["get"]["security"] == []
    assert "security" not in document["paths"]["/reef/status"]["get"]  # the global one applies


def test_served_without_a_key_and_rendered(make_gateway: Callable[..., GatewayThread]) -> None:
    gateway = make_gateway(auth=KEYS)
    served = call(gateway.port, "GET", "/openapi.json")
    assert served.status == 200, served.body
    assert served.json() == openapi_document()
    assert call(gateway.port, "GET", "/reef/status").status == 401  # the rest still needs one

    page = call(gateway.port, "GET", "/docs")
    assert page.status == 200
    assert page.headers["content-type"].startswith("text/html")
    csp = page.headers["content-security-policy"]
    assert "default-src 'none'" in csp and "script" not in csp
    text = page.body.decode()
    assert "<script" not in text and "src=" not in text and 'href="http' not in text
    style = text.split("<style>", 1)[1].split("</style>", 1)[0]
    digest = base64.b64encode(hashlib.sha256(style.encode()).digest()).decode()
    assert f"style-src 'sha256-{digest}'" in csp  # the page's own stylesheet, nothing else
    for path in openapi_document()["paths"]:
        assert f"<code>{path}</code>" in text, path


FEEDBACK_TARGETS = [
    # (body, valid): what ``reef.gateway.feedback._check_targets`` accepts
    ({"record_ids": ["r1"]}, True),
    ({"record_ids": ["r1", "r2"]}, True),
    ({"session_id": "s1"}, True),
    ({"session_id": "s1", "record_ids": ["r1"]}, True),
    ({"session_id": "s1", "record_ids": ["r1", "r2"]}, False),
    ({"record_ids": []}, False),
    ({"record_ids": ["r1"], "session_id": None}, True),
    ({"session_id": None}, False),
    ({}, False),
]


@pytest.mark.parametrize(("body", "valid"), FEEDBACK_TARGETS)
def test_the_document_states_what_feedback_must_be_about(body: dict[str, Any], valid: bool) -> None:
    root = {"$ref": "#/components/schemas/FeedbackIn", **openapi_document()}
    errors = list(jsonschema.Draft202012Validator(root).iter_errors(body))
    assert (not errors) is valid
    report = {("references" if k == "record_ids" else k): v for k, v in body.items()}
    root["$ref"] = "#/components/schemas/ReportIn"
    assert (not list(jsonschema.Draft202012Validator(root).iter_errors(report))) is valid
