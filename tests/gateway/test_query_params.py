"""Admin listing query parameters are bounded: anything else is a 400 naming the
parameter, never a 500 (an integer too large for SQLite, a digit `int()` refuses)."""

from __future__ import annotations

from typing import Any

import pytest

from reef.gateway.openapi.document import openapi_document
from tests.gateway.harness import GatewayThread
from tests.gateway.rawhttp import call

S = "/reef/scenarios/support"
LISTINGS = [
    (f"{S}/records", 500),
    (f"{S}/releases", 1000),
    (f"{S}/candidates", 1000),
    (f"{S}/evaluations", 1000),
    (f"{S}/curve", 1000),
    (f"{S}/jobs", 1000),
]
NOT_AN_INTEGER = ["abc", "1.5", "1e3", "%C2%B2", "%EF%BC%91", "", "%2B5", "%205", "0x10"]
OUT_OF_RANGE = ["0", "-1", "-100000000000000000000", "99999999999999999999", "9" * 40]


@pytest.mark.parametrize(("path", "most"), LISTINGS)
@pytest.mark.parametrize("value", NOT_AN_INTEGER + OUT_OF_RANGE)
def test_a_bad_limit_is_400_naming_it(
    module_gateway: GatewayThread, path: str, most: int, value: str
) -> None:
    response = call(module_gateway.port, "GET", f"{path}?limit={value}")
    assert response.status == 400, response.body
    message = response.json()["error"]["message"]
    assert "'limit'" in message and f"1 to {most}" in message, message


@pytest.mark.parametrize(("path", "most"), LISTINGS)
def test_limits_within_bounds_are_served(
    module_gateway: GatewayThread, path: str, most: int
) -> None:
    for value in ("1", str(most)):
        assert call(module_gateway.port, "GET", f"{path}?limit={value}").status == 200


@pytest.mark.parametrize("value", NOT_AN_INTEGER + OUT_OF_RANGE + ["-1e20", str(2**63)])
def test_a_bad_before_seq_is_400_naming_it(module_gateway: GatewayThread, value: str) -> None:
    response = call(module_gateway.port, "GET", f"{S}/releases?before_seq={value}")
    assert response.status == 400, response.body
    assert "'before_seq'" in response.json()["error"]["message"]


def test_before_seq_within_bounds_is_served(module_gateway: GatewayThread) -> None:
    for value in ("1", str(2**63 - 1)):
        response = call(module_gateway.port, "GET", f"{S}/releases?before_seq={value}")
        assert response.status == 200, response.body


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "1e400", "x"])
def test_a_min_score_that_is_not_a_finite_number_is_400(
    module_gateway: GatewayThread, value: str
) -> None:
    response = call(module_gateway.port, "GET", f"{S}/records?min_score={value}")
    assert response.status == 400, response.body
    assert "'min_score'" in response.json()["error"]["message"]


def documented(path: str, name: str) -> dict[str, Any]:
    operation = openapi_document()["paths"][path.replace("/support", "/{scenario}")]["get"]
    return next(p["schema"] for p in operation["parameters"] if p["name"] == name)


@pytest.mark.parametrize(("path", "most"), LISTINGS)
def test_the_document_states_each_bound(path: str, most: int) -> None:
    assert documented(path, "limit") == {"type": "integer", "minimum": 1, "maximum": most}


def test_the_document_states_the_bounds_of_before_seq() -> None:
    schema = documented(f"{S}/releases", "before_seq")
    assert (schema["minimum"], schema["maximum"]) == (1, 2**63 - 1)


def datetime_query_params() -> list[tuple[str, str]]:
    """``(path, name)`` of every GET query parameter the document types as a date-time,
    each ``{param}`` of the path filled with ``support``."""
    found = []
    for path, item in openapi_document()["paths"].items():
        for parameter in item.get("get", {}).get("parameters", []):
            if parameter["in"] == "query" and parameter["schema"].get("format") == "date-time":
                found.append((path.replace("{scenario}", "support"), parameter["name"]))
    return found


IMPOSSIBLE_TIMES = [
    "9999-12-31T23:59:59%2B14:00",  # 09:59 UTC on the last day: past it in other zones
    "9999-12-31T23:59:59-14:00",  # past year 9999 in UTC
    "0001-01-01T00:00:00%2B01:00",  # before year 1 in UTC
    "2025-02-30T00:00:00Z",
    "2025-01-01T25:00:00Z",
    "yesterday",
    "",
]


def test_every_date_time_query_parameter_is_found() -> None:
    assert (f"{S}/records", "since") in datetime_query_params()


@pytest.mark.parametrize(("path", "name"), datetime_query_params())
@pytest.mark.parametrize("value", IMPOSSIBLE_TIMES)
def test_an_impossible_time_is_400_naming_the_parameter(
    module_gateway: GatewayThread, path: str, name: str, value: str
) -> None:
    response = call(module_gateway.port, "GET", f"{path}?{name}={value}")
    assert response.status == 400, response.body
    message = response.json()["error"]["message"]
    assert f"query parameter {name!r}" in message, message


@pytest.mark.parametrize(("path", "name"), datetime_query_params())
@pytest.mark.parametrize(
    "value", ["2025-01-31T12:00:00Z", "2025-01-31T12:00:00%2B14:00", "2025-01-31", "9999-12-29"]
)
def test_a_possible_time_is_served(
    module_gateway: GatewayThread, path: str, name: str, value: str
) -> None:
    response = call(module_gateway.port, "GET", f"{path}?{name}={value}")
    assert response.status == 200, response.body
