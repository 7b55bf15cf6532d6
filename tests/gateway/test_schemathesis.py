"""Schemathesis over the gateway's own OpenAPI document, against a real gateway on
loopback (in front of the fake upstream), with and without keys: no input answers 5xx,
every answer matches what the document says (status codes, content types, bodies), and
the document is exactly as strict as the gateway's checks:

- ``negative_data_rejection`` (ST201): a request the document calls invalid is refused;
- ``positive_data_acceptance`` (ST202): a request the document calls valid is not
  refused with a 400 (except where ``NOT_IN_THE_DOCUMENT`` names a rule JSON Schema
  cannot state);
- ``allow_header_conformance`` (ST205): ``OPTIONS`` lists in ``Allow`` the methods the
  document declares for the path.

Examples are bounded (``MAX_EXAMPLES`` per operation, derandomized) so the run is the same
every time and fits the suite's budget.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis import checks
from schemathesis.config import SchemathesisConfig

from reef.gateway.openapi.document import openapi_document
from reef.gateway.routes import IMPORT_BODY_MEDIA
from tests.fakes.upstream import FakeUpstreamThread
from tests.gateway.harness import GatewayThread, make_settings

MAX_EXAMPLES = 20
ADMIN_KEY = "sk-schema-admin"

ACCEPTED = ["2xx", "3xx", "401", "403", "404", "409", "429", "5xx"]  # schemathesis's default
NOT_IN_THE_DOCUMENT = {
    # `cursor` is opaque: only a `next_cursor` the gateway made is one (else a 400).
    "GET /reef/scenarios/{scenario}/records": "a cursor the gateway did not make",
    # `score` must lie in the scenario's `scenarios.<s>.score_range`: configuration.
    "POST /reef/feedback": "a score outside the scenario's score_range",
    "POST /reef/report": "a score outside the scenario's score_range",
    # The body is text to the document; its lines must be in the chosen format (with
    # `auto`, a first line that fits none, or no line at all, is a 400).
    "POST /reef/scenarios/{scenario}/import": "JSON Lines that no import format reads",
    # `since`'s pattern cannot state the calendar: 2026-13-45 fits it.
    "GET /reef/costs": "a date that is not in the calendar",
}
"""Operations whose valid-looking requests may be refused with a 400, and why."""

CONFIG = SchemathesisConfig.from_dict(
    {
        "operations": [
            {
                "include-name": name,
                "checks": {"positive_data_acceptance": {"expected-statuses": [*ACCEPTED, "400"]}},
            }
            for name in NOT_IN_THE_DOCUMENT
        ]
    }
)


@schemathesis.serializer(*IMPORT_BODY_MEDIA)
def _json_lines(ctx: Any, value: Any) -> bytes:
    """The upload route's JSON Lines body (text to the document) as generated; anything
    else as its JSON, so a negative case reaches the gateway."""
    return value.encode() if isinstance(value, str) else json.dumps(value).encode()


schema = schemathesis.openapi.from_dict(openapi_document(), config=CONFIG)


@pytest.fixture(scope="module", params=["no keys", "keys"])
def target(
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[GatewayThread, dict[str, str]]]:
    keyed = request.param == "keys"
    auth = {"keys": [{"id": "ops", "key": ADMIN_KEY, "role": "admin"}]} if keyed else {}
    headers = {"authorization": f"Bearer {ADMIN_KEY}"} if keyed else {}
    with FakeUpstreamThread() as fake:
        home: Path = tmp_path_factory.mktemp("schemathesis")
        with GatewayThread(make_settings(home, fake.base_url, auth=auth)) as gateway:
            yield gateway, headers


@schema.parametrize()
@settings(
    max_examples=MAX_EXAMPLES,
    derandomize=True,
    database=None,
    deadline=None,
    suppress_health_check=list(HealthCheck),
)
def test_no_5xx_and_answers_match_the_document(
    case: schemathesis.Case, target: tuple[GatewayThread, dict[str, str]]
) -> None:
    gateway, headers = target
    case.call_and_validate(base_url=gateway.url, headers=headers, checks=CHECKS)


# Schemathesis's auth probes strip the key it generated, not the one sent here; keys are
# covered by tests/gateway (every route refuses a missing or wrong key when keys are set).


CHECKS = [
    checks.not_a_server_error,
    checks.status_code_conformance,
    checks.content_type_conformance,
    checks.response_schema_conformance,
    checks.response_headers_conformance,
    checks.negative_data_rejection,
    checks.positive_data_acceptance,
    checks.allow_header_conformance,
]
