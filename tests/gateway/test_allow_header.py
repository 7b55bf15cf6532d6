"""A method a path does not serve is a 405 whose ``Allow`` lists every method the route
table serves there, even where the methods are separate routes (``GET`` and ``DELETE``
of a stored response)."""

from __future__ import annotations

import re
from collections import defaultdict

import pytest

from reef.gateway.routes import ROUTE_TABLE
from tests.gateway.harness import GatewayThread
from tests.gateway.rawhttp import call


def served_by_path() -> dict[str, set[str]]:
    """The table's methods per concrete path (each parameter filled with ``x1``)."""
    methods: dict[str, set[str]] = defaultdict(set)
    for rule in ROUTE_TABLE:
        methods[re.sub(r"{[^}]+}", "x1", rule.path)].add(rule.method)
    return methods


SERVED = served_by_path()


@pytest.mark.parametrize("path", sorted(SERVED))
def test_options_on_every_route_is_405_listing_every_served_method(
    module_gateway: GatewayThread, path: str
) -> None:
    expected = SERVED[path] | ({"HEAD"} if "GET" in SERVED[path] else set())
    response = call(module_gateway.port, "OPTIONS", path, json_default=False)
    assert response.status == 405, response.body
    assert set(response.headers["allow"].split(", ")) == expected


def test_a_stored_response_allows_get_and_delete(module_gateway: GatewayThread) -> None:
    response = call(module_gateway.port, "PUT", "/v1/responses/resp_1", b"{}")
    assert response.status == 405
    assert response.headers["allow"] == "DELETE, GET, HEAD"
    assert "PUT /v1/responses/resp_1" in response.json()["error"]["message"]
