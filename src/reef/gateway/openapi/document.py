"""The gateway's OpenAPI 3.1 document (``GET /openapi.json``) and its rendered page
(``GET /docs``, server-rendered HTML from the same document: no script, no CDN).

The operations are described here by hand, one per rule of the route table
(``reef.gateway.routes``), whose access rule each operation states: who may call it is
read from the table the guard enforces, never written twice. ``tests/gateway/
test_openapi.py`` fails when a route of the app is missing here (or the other way round)
and validates the document as OpenAPI 3.1. Request bodies that the gateway parses with a
pydantic model are described by that model's JSON schema.

Neither route needs a key: the document describes the API, not its data.
"""

from __future__ import annotations

import copy
import functools
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel
from starlette.requests import Request
from starlette.responses import Response

import reef
from reef.core import dumps
from reef.core.clock import SINCE_PATTERN
from reef.experience import IMPORT_FORMATS
from reef.gateway.admin.evaluations import AbandonIn
from reef.gateway.admin.experience import MAX_RECORDS_PAGE, record_origins
from reef.gateway.admin.releases import AdoptConfigIn, PromoteIn, RollbackIn
from reef.gateway.feedback import FeedbackIn
from reef.gateway.openapi.bodies import (
    chat_completion_request,
    completion_request,
    embeddings_request,
    messages_request,
    responses_request,
)
from reef.gateway.openapi.page import render_page
from reef.gateway.openapi.trajectory import trajectory_schemas
from reef.gateway.requests import (
    MAX_IDEMPOTENCY_KEY_CHARS,
    MAX_QUERY_INT,
    MAX_RELEASE_ID_CHARS,
    MAX_SESSION_ID_CHARS,
    MAX_TAG_NAME_CHARS,
    MAX_TAG_VALUE_CHARS,
    MAX_TAGS,
    SCENARIO_PATTERN,
    SESSION_ID_PATTERN,
)
from reef.gateway.responses.stored import MAX_ITEMS_PAGE
from reef.gateway.routes import IMPORT_BODY_MEDIA, Access, ScenarioFrom, rule_for
from reef.jobs import JOB_STATES
from reef.releases import CANDIDATE_STATES, MAX_PAGE

_JSON = "application/json"
_REF = "#/components/schemas/{model}"


@dataclass(frozen=True)
class Operation:
    """One method on one path, as the document describes it."""

    method: str
    path: str
    tag: str
    summary: str
    description: str = ""
    parameters: tuple[dict[str, Any], ...] = ()
    body: str | None = None  # a schema name under components.schemas
    responses: dict[str, str] = field(default_factory=dict)
    media: str = _JSON  # of the success response
    inference: bool = False  # takes the x-reef-* request headers, sends the receipt headers
    streams: bool = True  # an inference route's answer may be an event stream
    schema: str | None = None  # the success body's schema name under components.schemas
    body_media: tuple[str, ...] = ()  # a body of these media types (text), not JSON


def _param(where: str, name: str, description: str, schema: Any = None) -> dict[str, Any]:
    return {
        "name": name,
        "in": where,
        "required": where == "path",
        "description": description,
        "schema": schema or {"type": "string"},
    }


def _path(name: str, description: str) -> dict[str, Any]:
    return _param("path", name, description)


def _query(name: str, description: str, schema: dict[str, Any] | None = None) -> dict[str, Any]:
    return _param("query", name, description, schema)


def _header(name: str, description: str, schema: dict[str, Any] | None = None) -> dict[str, Any]:
    return _param("header", name, description, schema)


def _limit(most: int, default: int = 50) -> dict[str, Any]:
    return _query(
        "limit",
        f"Most items returned (default {default}).",
        {"type": "integer", "minimum": 1, "maximum": most},
    )


def _bounded(pattern: str | None, most: int) -> dict[str, Any]:
    """A path value of 1 to ``most`` characters (matching ``pattern``, if any)."""
    schema: dict[str, Any] = {"type": "string", "minLength": 1, "maxLength": most}
    if pattern is not None:
        schema["pattern"] = f"^{pattern}$"
    return schema


def _optional_header(pattern: str | None, most: int) -> dict[str, Any]:
    """A Reef header's value: at most ``most`` characters (matching ``pattern``, if
    any), or empty, which the gateway reads as the header's absence."""
    schema: dict[str, Any] = {"type": "string", "maxLength": most}
    if pattern is not None:
        schema["pattern"] = f"^(?:{pattern})?$"
    return schema


SCENARIO = _param("path", "scenario", "The scenario's name.", _bounded(SCENARIO_PATTERN, 64))
SCENARIO_HEADER_SCHEMA = _optional_header(SCENARIO_PATTERN, 64)
LIMIT = _limit(MAX_PAGE)
# ``x-reef-purpose``: read without case; empty is the default, ``serve``.
_PURPOSE_PATTERN = "^(?:[Ss][Ee][Rr][Vv][Ee]|[Ee][Vv][Aa][Ll])?$"
_EMPTY_IS_ABSENT = " An empty value is the same as none."

INFERENCE_HEADERS = (
    _header(
        "x-reef-scenario",
        "The scenario; else `model: reef/<scenario>`; else a scenario's model alias "
        "(`scenarios.<s>.model_aliases`); else `default`." + _EMPTY_IS_ABSENT,
        SCENARIO_HEADER_SCHEMA,
    ),
    _header(
        "x-reef-session",
        "The session; else inferred by message-prefix matching. Letters, digits and "
        "`._:@~+=-`, so it reads back at `/reef/scenarios/{scenario}/sessions/{session_id}`."
        + _EMPTY_IS_ABSENT,
        _optional_header(SESSION_ID_PATTERN, MAX_SESSION_ID_CHARS),
    ),
    _header(
        "x-reef-release",
        "Pin a release on this scenario's chain; a candidate only with the gate's or an "
        "admin key (another scenario's id: 404; a candidate for an inference key: 403)."
        + _EMPTY_IS_ABSENT,
        _optional_header(None, MAX_RELEASE_ID_CHARS),
    ),
    _header(
        "x-reef-capture",
        "`off`, `0` or `false` (in any case): serve without recording; anything else records.",
    ),
    _header(
        "x-reef-purpose",
        "`serve` (default) or `eval` (recorded, never trained on), in any case." + _EMPTY_IS_ABSENT,
        {"type": "string", "pattern": _PURPOSE_PATTERN},
    ),
    _header(
        "x-reef-idempotency-key",
        "One answer per key and body: requests sent while the first is in flight wait "
        "for it, later ones are answered from its record; same receipt, one upstream "
        "call. Another body under the key is a 409." + _EMPTY_IS_ABSENT,
        _optional_header(None, MAX_IDEMPOTENCY_KEY_CHARS),
    ),
    _header(
        "x-reef-escalate",
        "`teacher`: a distilled release asks its teacher, not the student, when its "
        "`escalation.header` rule is on (docs/distillation.md); anything else: no effect.",
    ),
    _header(
        "x-reef-end-user",
        "The end user this request speaks for, when one key carries many (kept as tag "
        "`end_user`; the request's `user` or `metadata.user_id` field wins): conversation "
        "signals name that user as their author." + _EMPTY_IS_ABSENT,
        _optional_header(None, MAX_TAG_VALUE_CHARS),
    ),
)
"""Request headers of the inference routes (``x-reef-tag-<name>`` too: stored as tags)."""

FEEDBACK_HEADERS = (
    _header(
        "x-reef-scenario",
        "Scenario when the body names none." + _EMPTY_IS_ABSENT,
        SCENARIO_HEADER_SCHEMA,
    ),
    _header(
        "x-reef-idempotency-key",
        "When the body has none." + _EMPTY_IS_ABSENT,
        _optional_header(None, MAX_IDEMPOTENCY_KEY_CHARS),
    ),
)

RECEIPT_HEADERS = {
    "x-reef-record-id": "The receipt: the id of the stored record.",
    "x-reef-agent-record-id": "The same id, under the name Reef (Human-Agent-Society) uses.",
    "x-reef-release-id": "The release (or canary candidate) that served the request.",
    "x-reef-session-id": "The session the exchange belongs to.",
    "x-reef-served-by": "`student` or `teacher`: who answered, when the release routes "
    "between them (docs/distillation.md).",
}

_COMMON_ERRORS = {
    "400": "Malformed request (the message names the problem).",
    "401": "No key, or an unknown key (when `auth.keys` is configured).",
    "403": "The key lacks the role or the scenario.",
}
_NOT_FOUND = {**_COMMON_ERRORS, "404": "Not found (the message names it)."}
_ADMIN_READ = {"200": "Found.", **_NOT_FOUND}
_CONFLICT = {**_NOT_FOUND, "409": "Conflict: the head moved, or a state change not allowed."}
_INFERENCE_NOT_FOUND = (
    "Unknown pinned release, or a model that an upstream with no configured model does "
    "not serve (the message lists those it does), or, with `server.unknown_scenarios: "
    "reject`, a scenario the configuration does not name (the message lists those it does)."
)
_NOT_JSON = "The body is not declared JSON: send `Content-Type: application/json`."
_NOT_JSON_LINES = "The body is not declared JSON Lines: send `Content-Type: application/x-ndjson`."
_JSON_LINES = "JSON Lines: one JSON object per line, in the chosen format."
_NO_BODY = "A body or Content-Type other than JSON (the route takes no body)."
_KEY_IN_USE = (
    "The idempotency key names another request (body, API or key), or another gateway on "
    "the store is still answering it after this request waited its lease."
)
_NO_ROUTE = (
    "The scenario's upstream has no such route (an Anthropic upstream; an upstream that "
    "answered 501, as the embedded engine does for embeddings). Not recorded."
)

# fmt: off
OPERATIONS: tuple[Operation, ...] = (
    Operation("post", "/v1/chat/completions", "inference", "OpenAI chat completion",
              "Streaming (SSE) or not, tools included; proxied to the scenario's upstream, "
              "recorded with its release and session.", inference=True,
              body="ChatCompletionRequest",
              responses={"200": "The upstream's completion (`text/event-stream` when "
                         "`stream` is true).", **_COMMON_ERRORS,
                         "404": _INFERENCE_NOT_FOUND, "409": _KEY_IN_USE,
                         "413": "Body too large.", "502": "The upstream failed.",
                         "504": "The upstream timed out."}),
    Operation("post", "/v1/completions", "inference", "OpenAI legacy text completion",
              "Streaming (SSE) or not; relayed to the scenario's OpenAI-compatible upstream "
              "(`/completions`) and recorded like a chat completion, its canonical form "
              "the prompt as the user's message and the text as the reply. No harness is "
              "rendered into a raw prompt. An Anthropic upstream has no text completions: "
              "501, not recorded.", inference=True, body="CompletionRequest",
              responses={"200": "The upstream's `text_completion` (`text/event-stream` "
                         "when `stream` is true).", **_COMMON_ERRORS,
                         "404": _INFERENCE_NOT_FOUND, "409": _KEY_IN_USE,
                         "413": "Body too large.",
                         "501": _NO_ROUTE, "502": "The upstream failed.",
                         "504": "The upstream timed out."}),
    Operation("post", "/v1/embeddings", "inference", "OpenAI embeddings",
              "Relayed to the scenario's OpenAI-compatible upstream (`/embeddings`) under "
              "the client's own model name (`reef/<scenario>` or an alias: the scenario's "
              "configured model; never a release's adapter). Recorded without the vectors "
              "(model, usage and each vector's dimension count) unless "
              "`capture.embedding_vectors: keep`; never trained on.", inference=True,
              streams=False, body="EmbeddingsRequest",
              responses={"200": "The upstream's embeddings `list`.", **_COMMON_ERRORS,
                         "404": _INFERENCE_NOT_FOUND, "409": _KEY_IN_USE,
                         "413": "Body too large.",
                         "501": _NO_ROUTE, "502": "The upstream failed.",
                         "504": "The upstream timed out."}),
    Operation("post", "/v1/messages", "inference", "Anthropic messages",
              "Streaming or not; translated for OpenAI-compatible upstreams, passed through to "
              "Anthropic ones. Errors use Anthropic's shape.", inference=True,
              body="MessagesRequest",
              responses={"200": "The message (`text/event-stream` when `stream` is true).",
                         **_COMMON_ERRORS, "404": _INFERENCE_NOT_FOUND, "409": _KEY_IN_USE,
                         "413": "Body too large.", "502": "The upstream failed.",
                         "504": "The upstream timed out."}),
    Operation("post", "/v1/messages/count_tokens", "inference", "Count a message's tokens",
              "Anthropic's token count by the scenario's upstream: relayed to an "
              "Anthropic upstream; counted by the embedded engine's (or vLLM's) tokenizer "
              "on the request's chat translation; 501 for any other upstream. Not recorded. "
              "Errors use Anthropic's shape.",
              parameters=(INFERENCE_HEADERS[0],), body="MessagesRequest",
              responses={"200": "`{input_tokens}`.", **_COMMON_ERRORS,
                         "404": "With `server.unknown_scenarios: reject`, a scenario the "
                         "configuration does not name.",
                         "501": "The scenario's upstream cannot count tokens.",
                         "502": "The upstream failed.", "504": "The upstream timed out."}),
    Operation("post", "/v1/responses", "inference", "OpenAI responses",
              "The Responses API, translated into chat completions for the scenario's "
              "upstream (an OpenAI-compatible one) and back, streams included (the typed "
              "`response.*` events; `response.failed` when the upstream fails mid-way); "
              "passed through to an upstream with `responses: native` (under Reef's "
              "response ids). "
              "`previous_response_id` continues a response Reef stored (the continuation "
              "joins its session); `store: false` keeps nothing retrievable, and with "
              "`x-reef-capture: off` nothing is kept (`store: true` is then a 400). Reasoning "
              "items, built-in tools and any other untranslatable field are a 400 naming "
              "them.", inference=True, body="ResponsesRequest",
              responses={"200": "The response (`text/event-stream` when `stream` is true).",
                         **_COMMON_ERRORS,
                         "404": "`previous_response_id` names no stored response of the "
                         "scenario that the key may use; or " + _INFERENCE_NOT_FOUND[0].lower()
                         + _INFERENCE_NOT_FOUND[1:],
                         "409": _KEY_IN_USE, "413": "Body too large.",
                         "502": "The upstream failed.", "504": "The upstream timed out."}),
    Operation("get", "/v1/responses/{response_id}", "inference", "A stored response",
              "The response as it was answered. The key that created it, or an admin "
              "key, reads it; a response of another key or another scenario (than the "
              "key's, or `x-reef-scenario`) is a 404 like an unknown id.",
              parameters=(_path("response_id", "The response's id (`resp_…`)."),
                          _header("x-reef-scenario", "Only a response of this scenario."
                                  + _EMPTY_IS_ABSENT, SCENARIO_HEADER_SCHEMA)),
              responses={"200": "The response object.", **_NOT_FOUND}),
    Operation("delete", "/v1/responses/{response_id}", "inference", "Delete a stored response",
              "It can no longer be read or continued; the record of its exchange "
              "stays (records are experience).",
              parameters=(_path("response_id", "The response's id (`resp_…`)."),
                          _header("x-reef-scenario", "Only a response of this scenario."
                                  + _EMPTY_IS_ABSENT, SCENARIO_HEADER_SCHEMA)),
              responses={"200": "`{id, object: response, deleted: true}`.", **_NOT_FOUND}),
    Operation("get", "/v1/responses/{response_id}/input_items", "inference",
              "A stored response's input items",
              "Every item the response answered, earlier turns included, each with its id.",
              parameters=(_path("response_id", "The response's id (`resp_…`)."),
                          _header("x-reef-scenario", "Only a response of this scenario."
                                  + _EMPTY_IS_ABSENT, SCENARIO_HEADER_SCHEMA),
                          _limit(MAX_ITEMS_PAGE, 20),
                          _query("order", "`desc` (default, newest first) or `asc`.",
                                 {"enum": ["asc", "desc"]}),
                          _query("after", "List the items after this item id."),
                          _query("before", "List the items before this item id.")),
              responses={"200": "An OpenAI list: `{object, data, first_id, last_id, "
                         "has_more}`.", **_NOT_FOUND}),
    Operation("get", "/v1/models", "inference", "List models",
              "`reef/<scenario>` for each configured scenario, the scenarios' model aliases, "
              "then the upstreams' models.",
              responses={"200": "An OpenAI model list.", "401": _COMMON_ERRORS["401"]}),
    Operation("get", "/v1/models/{model_id}", "inference", "A model",
              "One model as `/v1/models` lists it: `reef/<scenario>` of any scenario the key "
              "may use, a scenario's model alias, or a model an upstream lists.",
              parameters=(_path("model_id", "The model's id; it may hold `/` "
                                "(`reef/support`)."),),
              responses={"200": "`{id, object: model, created, owned_by}`.",
                         "401": _COMMON_ERRORS["401"],
                         "404": "Not served here (the message says what is)."}),
    Operation("post", "/reef/feedback", "feedback", "Give feedback on records",
              "Score, text and/or correction for one or more records; idempotent with a key.",
              parameters=FEEDBACK_HEADERS,
              body="FeedbackIn",
              responses={"201": "Stored: `{id, created: true, record_ids}`.",
                         "200": "Same idempotency key and body: the first feedback's id.",
                         **_COMMON_ERRORS, "404": "An unknown record id.",
                         "409": "Idempotency key reused with a different body."}),
    Operation("post", "/reef/report", "feedback", "Report (Reef-compatible feedback)",
              "`/reef/feedback` with `references` naming the records.",
              parameters=FEEDBACK_HEADERS,
              body="ReportIn",
              responses={"201": "Stored.", "200": "Same idempotency key and body.",
                         **_COMMON_ERRORS, "404": "An unknown record id.",
                         "409": "Idempotency key reused with a different body."}),
    Operation("get", "/reef/scenarios/{scenario}/feedback", "feedback",
              "A scenario's feedback",
              "Newest first, with each row's principal, trust level and quarantine state; "
              "`quarantined=true` lists what screening holds back, with the reason.",
              parameters=(SCENARIO,
                          _query("limit", "Most rows returned.",
                                 {"type": "integer", "minimum": 1, "maximum": 500}),
                          _query("quarantined", "true or false.", {"type": "boolean"}),
                          _query("before", "`next_before` of the last page.",
                                 {"type": "string", "maxLength": 64})),
              responses=_ADMIN_READ),
    Operation("post", "/reef/feedback/{feedback_id}/release", "feedback",
              "Release quarantined feedback",
              "Lets feedback that screening quarantined train and count as evidence again.",
              parameters=(_path("feedback_id", "The feedback's id."),),
              responses={"200": "The released feedback.", **_CONFLICT}),
    Operation("get", "/reef/records/{record_id}", "records", "One record with its feedback",
              parameters=(_path("record_id", "The record's id (the receipt)."),),
              responses=_ADMIN_READ),
    Operation("get", "/reef/scenarios/{scenario}/records", "records", "A scenario's records",
              "Newest first, paged by `cursor`; `next_cursor` is null on the last page.",
              parameters=(SCENARIO, _limit(MAX_RECORDS_PAGE),
                          _query("cursor", "`next_cursor` of the last page."),
                          _query("session", "Only this session."),
                          _query("has_feedback", "true or false.", {"type": "boolean"}),
                          _query("min_score", "Mean feedback score at least this.",
                                 {"type": "number"}),
                          _query("origin", "`live` (traffic through the gateway) or "
                                 "`import:<format>` (records imported from that format).",
                                 {"type": "string", "enum": record_origins()}),
                          _query("since", "ISO 8601 time (UTC without an offset), from "
                                 "0001-01-02 to 9999-12-30 in UTC.",
                                 {"type": "string", "format": "date-time"})),
              responses=_ADMIN_READ),
    Operation("post", "/reef/scenarios/{scenario}/import", "records",
              "Import a JSON Lines file",
              "The files `reef import` reads (docs/import-export.md), uploaded as the body "
              "and read a line at a time as they arrive (never held whole): records and "
              "feedback join the scenario marked `reef.origin: import:<format>`, redacted "
              "before they are stored, deduplicated by source id (a second upload adds "
              "nothing). A malformed line is skipped and listed with its number and why "
              "(`strict=true`: a 400 at the first; lines before it may be written, and "
              "are deduplicated when the file is sent again); a line longer "
              "than `server.max_body_bytes` is skipped too.",
              parameters=(SCENARIO,
                          _query("format", "`auto` (default: told from the first line) or "
                                 "a format.", {"type": "string", "enum": ["auto",
                                                                          *IMPORT_FORMATS]}),
                          _query("dry_run", "true: read and check every line, write nothing.",
                                 {"type": "boolean"}),
                          _query("strict", "true: stop at the first malformed line (400).",
                                 {"type": "boolean"}),
                          _query("demo_trust", "Trust of the imported feedback (default: "
                                 "the uploading key's trust in the scenario; above it: "
                                 "403). No row is written above the key's trust, a `reef` "
                                 "line's own level included.",
                                 {"type": "string", "enum": ["operator", "user",
                                                             "untrusted"]})),
              body_media=IMPORT_BODY_MEDIA, schema="ImportSummary",
              responses={"200": "The summary: counts, the format read, skipped lines.",
                         **_COMMON_ERRORS}),
    Operation("get", "/reef/scenarios/{scenario}/sessions/{session_id}", "records",
              "A session's records and trajectory",
              "`turns`: the session's records in turn order. `trajectory`: the tree of its "
              "turns (a retry is an attempt of its turn, a fork a second child), each with "
              "its messages, the tools offered, the reply and its tool calls, and the tool "
              "results the next request carried; `branches` lists every root-to-leaf path "
              "with the record that answered each turn; `outcomes` the feedback given on "
              "the session as a whole. See docs/http-api.md.",
              parameters=(SCENARIO, _path("session_id", "The session's id.")),
              responses=_ADMIN_READ, schema="Session"),
    Operation("get", "/reef/scenarios", "releases", "Scenarios with their heads",
              "Every scenario with its head, the release this gateway serves, and whether "
              "the configuration names it (`configured`).",
              responses={"200": "The scenarios.", **_COMMON_ERRORS}),
    Operation("delete", "/reef/scenarios/{scenario}", "releases", "Delete an unused scenario",
              "Deletes a scenario the configuration does not name that holds nothing: no "
              "record, candidate, learning job, evaluation or stored response, and no "
              "release but the `create` one its first request made. Otherwise 409 naming "
              "what it holds (deleting would drop experience); a configured scenario is "
              "409 too.",
              parameters=(SCENARIO,),
              responses={"200": "`{name, deleted: true}`.", **_CONFLICT}),
    Operation("get", "/reef/scenarios/{scenario}/releases", "releases", "The release chain",
              "Newest first.",
              parameters=(SCENARIO, LIMIT, _query("before_seq", "Only releases before this seq.",
                                                  {"type": "integer", "minimum": 1,
                                                   "maximum": MAX_QUERY_INT})),
              responses=_ADMIN_READ),
    Operation("post", "/reef/scenarios/{scenario}/rollback", "releases", "Roll back",
              "Appends a release whose components equal `to`'s and makes it the head.",
              parameters=(SCENARIO,), body="RollbackIn",
              responses={"201": "The new release.", **_CONFLICT}),
    Operation("post", "/reef/scenarios/{scenario}/promote", "releases",
              "Promote a reviewed candidate",
              "Publishes a `passed` (or `canary`) candidate as the new head.",
              parameters=(SCENARIO,), body="PromoteIn",
              responses={"201": "The new release.", **_CONFLICT}),
    Operation("post", "/reef/scenarios/{scenario}/adopt-config", "releases",
              "Adopt the configured model",
              "Appends a release serving the model the gateway's configuration names "
              "(`scenarios.<s>.model`, else `upstreams.<u>.model`) with the head's harness; "
              "an adapter or checkpoint trained on the old base is dropped. The release "
              "chain decides what serves: editing the model in the configuration alone "
              "changes nothing.",
              parameters=(SCENARIO,), body="AdoptConfigIn",
              responses={"201": "The new release.", **_NOT_FOUND,
                         "409": "The head already serves the configured model (nothing "
                         "to adopt), or the head moved."}),
    Operation("post", "/reef/scenarios/{scenario}/learn", "learning", "Queue a learning job",
              "A queued or running job of the scenario is returned instead of a "
              "second one. A scenario without a recipe is refused (409) naming "
              "`scenarios.<s>.recipe`. No body.", parameters=(SCENARIO,),
              responses={"202": "The job.", **_COMMON_ERRORS,
                         "409": "The scenario has no recipe to learn with."}),
    Operation("get", "/reef/scenarios/{scenario}/harness", "harness", "The serving harness",
              "As JSON, with `ETag` = the bundle digest and `x-reef-release-id`.",
              parameters=(SCENARIO, _query("release", "A release to read instead of the head."),
                          _header("x-reef-release", "Same as `release`."),
                          _header("if-none-match", "An ETag: 304 when unchanged.")),
              responses={**_ADMIN_READ, "304": "Unchanged."}),
    Operation("get", "/reef/scenarios/{scenario}/harness.tar.gz", "harness",
              "The serving harness bundle",
              "The deterministic `.tar.gz` that `reef harness install` verifies and unpacks.",
              parameters=(SCENARIO, _query("release", "A release to read instead of the head."),
                          _header("x-reef-release", "Same as `release`.")),
              responses=_ADMIN_READ, media="application/gzip"),
    Operation("get", "/reef/releases/{release_id}", "releases", "One release",
              "Manifest (components by digest), operation, parent, who, why, evidence.",
              parameters=(_path("release_id", "The release's id."),), responses=_ADMIN_READ),
    Operation("get", "/reef/candidates/{candidate_id}", "candidates", "One candidate",
              "Manifest, state and gate evidence.",
              parameters=(_path("candidate_id", "The candidate's id."),), responses=_ADMIN_READ),
    Operation("post", "/reef/candidates/{candidate_id}/abandon", "candidates",
              "Abandon a candidate",
              "Stops a pending, passed or canary candidate; a canary's traffic returns to the "
              "head.", parameters=(_path("candidate_id", "The candidate's id."),),
              body="AbandonIn", responses={"200": "The candidate, abandoned.", **_CONFLICT}),
    Operation("get", "/reef/scenarios/{scenario}/candidates", "candidates",
              "A scenario's candidates", "Newest first, with their gate evidence.",
              parameters=(SCENARIO, LIMIT, _query("state", "Only candidates in this state.",
                                                  {"enum": list(CANDIDATE_STATES)})),
              responses=_ADMIN_READ),
    Operation("get", "/reef/scenarios/{scenario}/evaluations", "candidates",
              "A scenario's evaluations", "The gate's evaluations, newest first.",
              parameters=(SCENARIO, LIMIT), responses=_ADMIN_READ),
    Operation("get", "/reef/evaluations/{evaluation_id}", "candidates", "One evaluation",
              "Every scored answer and episode; with `items=1` the items asked too.",
              parameters=(_path("evaluation_id", "The evaluation's id."),
                          _query("items", "`1` or `true`: include the items.")),
              responses=_ADMIN_READ),
    Operation("get", "/reef/evaluations/{evaluation_id}/episodes", "candidates",
              "An evaluation's episodes",
              "The episodes of `gate.episodes` with their conversations, by task, repeat and "
              "side; `task` picks one task's.",
              parameters=(_path("evaluation_id", "The evaluation's id."),
                          _query("task", "Only this task's episodes (both sides).")),
              responses=_ADMIN_READ),
    Operation("get", "/reef/status", "operations", "What this gateway serves",
              "Per scenario: head, serving release, activation state, live canary; loaded "
              "adapters; the capture queue; `tool_isolation`, the OS boundary of the python "
              "environment's tools here; `spend`: each budget in its window, what was "
              "served since start and the requests refused per budget or rate limit, the "
              "cost of each release over 30 days (`releases`) and of each recent learning "
              "job and its gate decision (`learning`); "
              "`distill`: per distilled scenario, the student share, requests by arm, "
              "escalations by rule, the escalation rate and teacher calls.",
              responses={"200": "The status.", **_COMMON_ERRORS}),
    Operation("get", "/reef/costs", "operations", "What the recorded traffic cost",
              "Per scenario, key (or, `by=release`, the release that served) and purpose: "
              "requests, unpriced ones, input, cached and output tokens and the cost, "
              "costliest first, from each record's own `cost` (what `reef costs` prints); "
              "a key limited to scenarios sees theirs.",
              parameters=(_query("since", "An age (`30m`, `24h`, `7d`; default `7d`) or an "
                                 "ISO 8601 date or time.",
                                 {"type": "string", "pattern": SINCE_PATTERN}),
                          _query("by", "`key` (default) or `release`.",
                                 {"type": "string", "enum": ["key", "release"]})),
              responses={"200": "`{since, by, data: [row]}`.", **_COMMON_ERRORS}),
    Operation("get", "/reef/scenarios/{scenario}/curve", "releases", "Learning curve",
              "Per release, oldest first: live requests served, how many were "
              "scored and their mean feedback score, and the gate's means when the gate "
              "admitted it.",
              parameters=(SCENARIO, _query("limit", "Newest releases included (default 200).",
                                           {"type": "integer", "minimum": 1,
                                            "maximum": 1000})),
              responses=_ADMIN_READ),
    Operation("get", "/reef/scenarios/{scenario}/feedback/calibration", "feedback",
              "Computed feedback vs posted",
              "Per computed feedback source (`signal:*`, `judge:*`): its rows, how many answers "
              "were also graded by people, what it mostly says, its precision and recall "
              "against the posted verdicts, and how often its extracted corrections equal "
              "the posted ones.",
              parameters=(SCENARIO,), responses=_ADMIN_READ),
    Operation("get", "/reef/scenarios/{scenario}/jobs", "learning", "A scenario's jobs",
              "Learning jobs, newest first.",
              parameters=(SCENARIO, _query("limit", "Most jobs (default 20).",
                                           {"type": "integer", "minimum": 1,
                                            "maximum": 1000}),
                          _query("state", "Only jobs in this state.",
                                 {"enum": list(JOB_STATES)})),
              responses=_ADMIN_READ),
    Operation("get", "/reef/artifacts/{digest}/harness", "harness", "A harness by digest",
              "The harness a release or candidate names (`{digest, named_by, "
              "harness, files}`); any other digest is a 404, so no other artifact is read.",
              parameters=(_param("path", "digest", "The harness artifact's digest, "
                                 "`sha256:...`.", {"type": "string",
                                                   "pattern": "^sha256:[0-9a-f]{64}$"}),),
              responses=_ADMIN_READ),
    Operation("get", "/ui", "dashboard", "The dashboard",
              "Redirects to `/ui/`. The page's own data calls go to the admin API with the "
              "key the user enters.",
              responses={"308": "Redirect to `/ui/`."}),
    Operation("get", "/ui/{path}", "dashboard", "A dashboard file",
              "A file of the packaged allow-list (`/ui/` is the HTML shell, "
              "`/ui/auth.json` says whether keys are required), under a strict "
              "Content-Security-Policy.",
              parameters=(_path("path", "The file, e.g. `app.js`; empty for the page."),),
              responses={"200": "The file.", "304": "Unchanged (ETag).",
                         "404": "Not a dashboard file."},
              media="text/html"),
    Operation("get", "/healthz", "operations", "Liveness",
              responses={"200": '`{"status": "ok"}`.'}),
    Operation("get", "/readyz", "operations", "Readiness",
              "The store is writable and every upstream lists its models.",
              responses={"200": "Ready.", "503": "Not ready; `checks` names the failing one."}),
    Operation("get", "/metrics", "operations", "Prometheus metrics",
              responses={"200": "Prometheus text format.", **_COMMON_ERRORS},
              media="text/plain"),
    Operation("get", "/openapi.json", "operations", "This document",
              responses={"200": "The OpenAPI 3.1 document."}),
    Operation("get", "/docs", "operations", "This document, rendered",
              responses={"200": "An HTML page (no scripts)."}, media="text/html"),
)
# fmt: on

TAGS = (
    ("inference", "OpenAI- and Anthropic-compatible inference, recorded."),
    ("feedback", "Scores, text and corrections on records."),
    ("records", "Reading recorded experience."),
    ("releases", "The release chain: heads, rollback, promote."),
    ("candidates", "Candidates and the evaluation gate's evidence."),
    ("learning", "Learning jobs."),
    ("harness", "Harness downloads for agents that render their own requests."),
    ("dashboard", "The web dashboard's static files (it reads the admin API)."),
    ("operations", "Health, readiness, metrics, status and this description."),
)

_ACCESS_TEXT: dict[Access, str] = {
    "public": "No key needed.",
    "inference": "Any valid key (inference or admin).",
    "admin-of-scenario": "An admin key.",
    "admin": "An admin key not limited to scenarios (the route spans them all).",
}
_SCENARIO_TEXT: dict[ScenarioFrom, str] = {
    "none": "",
    "path": " A key limited to scenarios (`auth.keys[].scenarios`) may call it only for "
    "those (403 otherwise).",
    "request": " A key limited to scenarios may use only those: the scenario named by "
    "`x-reef-scenario`, the model or the body (403 otherwise).",
    "resource": " A key limited to scenarios sees only what belongs to those; anything "
    "else is a 404, like an unknown id.",
    "listing": " A key limited to scenarios is shown only what belongs to those.",
}


def _schemas() -> dict[str, Any]:
    schemas: dict[str, Any] = {}
    for model in (FeedbackIn, RollbackIn, PromoteIn, AdoptConfigIn, AbandonIn):
        schemas[model.__name__] = _model_schema(model)
    schemas["FeedbackIn"]["anyOf"] = _feedback_targets("record_ids")  # not the model's
    report = copy.deepcopy(schemas["FeedbackIn"])
    report["title"] = "ReportIn"
    report["description"] = "The body of `POST /reef/report`: `references` names the records."
    report["properties"] = {
        ("references" if key == "record_ids" else key): value
        for key, value in report["properties"].items()
    }
    report["anyOf"] = _feedback_targets("references")
    schemas["ReportIn"] = report
    schemas["ChatCompletionRequest"] = chat_completion_request()
    schemas.update(messages_request())
    schemas["ResponsesRequest"] = responses_request()
    schemas["CompletionRequest"] = completion_request()
    schemas["EmbeddingsRequest"] = embeddings_request()
    schemas.update(trajectory_schemas())
    schemas["ImportSummary"] = _import_summary()
    schemas["Error"] = {
        "title": "Error",
        "description": "OpenAI-shaped error (`/v1/messages` answers Anthropic's "
        '`{"type": "error", "error": {"type", "message"}}`).',
        "type": "object",
        "properties": {
            "error": {
                "type": "object",
                "properties": {
                    "message": {"type": "string"},
                    "type": {"type": "string"},
                    "param": {"type": ["string", "null"]},
                    "code": {"type": ["string", "integer", "null"]},
                },
                "required": ["message", "type"],
            }
        },
        "required": ["error"],
    }
    return schemas


def _import_summary() -> dict[str, Any]:
    count = {"type": "integer", "minimum": 0}
    return {
        "title": "ImportSummary",
        "description": "What an upload imported (`POST /reef/scenarios/{scenario}/import`).",
        "type": "object",
        "properties": {
            "scenario": {"type": "string"},
            "format": {"type": ["string", "null"], "description": "The format read."},
            "dry_run": {"type": "boolean"},
            "lines": count,
            "records": count,
            "duplicate_records": count,
            "feedback": count,
            "duplicate_feedback": count,
            "sessions": count,
            "skipped": count,
            "skips": {
                "type": "array",
                "description": "The first 1000 skipped lines.",
                "items": {
                    "type": "object",
                    "properties": {"line": count, "reason": {"type": "string"}},
                    "required": ["line", "reason"],
                },
            },
        },
        "required": ["scenario", "format", "dry_run", "lines", "records", "skipped", "skips"],
    }


def _feedback_targets(ids: str) -> list[dict[str, Any]]:
    """What feedback must be about (``_check_targets`` in ``reef.gateway.feedback``):
    a session, with at most one of its records; or, without one, at least one record."""
    return [
        {
            "required": ["session_id"],
            "properties": {"session_id": {"type": "string"}, ids: {"maxItems": 1}},
        },
        {
            "required": [ids],
            "properties": {ids: {"type": "array", "minItems": 1}, "session_id": {"type": "null"}},
        },
    ]


def _model_schema(model: type[BaseModel]) -> dict[str, Any]:
    schema = model.model_json_schema(ref_template=_REF)
    if "$defs" in schema:  # none of today's bodies nest models; keep the refs resolvable
        raise AssertionError(f"{model.__name__} nests models: hoist its $defs")
    return schema


# The routes that call an upstream: budgets and rate limits apply (``reef.gateway.budgets``).
_SPENDING = frozenset(
    ("/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/messages", "/v1/responses")
)
_SPEND_REFUSALS = {
    "402": "Over a budget (`budgets:`): the message names it, its spend and its reset; "
    "`Retry-After`, `x-reef-budget`, `x-reef-budget-reset`. Not recorded.",
    "429": "Over a rate limit (`rate_limits:`), with `Retry-After` and `x-reef-rate-limit`. "
    "Not recorded.",
}


def _responses(operation: Operation) -> dict[str, Any]:
    out: dict[str, Any] = {}
    documented = dict(operation.responses)
    if operation.method == "post" and operation.path in _SPENDING:
        documented.update(_SPEND_REFUSALS)
    for status, description in sorted(documented.items()):
        response: dict[str, Any] = {"description": description}
        if status.startswith(("4", "5")) and status != "503":
            response["content"] = {_JSON: {"schema": {"$ref": "#/components/schemas/Error"}}}
        elif status in ("200", "201", "202"):
            content: dict[str, Any] = {operation.media: {}}
            if operation.media == _JSON:
                schema = {"$ref": _REF.format(model=operation.schema)} if operation.schema else {}
                content[_JSON] = {"schema": schema or {"type": "object"}}
            if operation.inference and operation.streams:
                content["text/event-stream"] = {}
            if operation.inference:
                response["headers"] = {
                    name: {"description": text, "schema": {"type": "string"}}
                    for name, text in RECEIPT_HEADERS.items()
                }
            response["content"] = content
        out[status] = response
    return out


def _operation_id(operation: Operation) -> str:
    words = operation.path.replace(".", "/").replace("{", "").replace("}", "").split("/")
    return "_".join([operation.method, *(word for word in words if word)])


def _operation(operation: Operation) -> dict[str, Any]:
    parameters = list(operation.parameters)
    if operation.inference:
        parameters += INFERENCE_HEADERS
    description = operation.description
    if operation.inference:
        description += (
            f" Up to {MAX_TAGS} `x-reef-tag-<name>` headers are stored as tags `<name>` "
            f"(names of at most {MAX_TAG_NAME_CHARS} characters, values of at most "
            f"{MAX_TAG_VALUE_CHARS}); more, or longer, is a 400."
        )
    rule = rule_for(operation.method, operation.path)
    access = _ACCESS_TEXT[rule.access] + _SCENARIO_TEXT[rule.scenario]
    out: dict[str, Any] = {
        "operationId": _operation_id(operation),
        "tags": [operation.tag],
        "summary": operation.summary,
        "description": f"{description.strip()} Access: {access}".strip(),
        "x-reef-access": rule.access,
        "x-reef-scenario-from": rule.scenario,
        "responses": _responses(operation),
    }
    if rule.method in ("POST", "DELETE"):
        out["responses"]["415"] = {
            "description": _NOT_JSON_LINES
            if rule.body_media
            else _NOT_JSON
            if rule.takes_body
            else _NO_BODY,
            "content": {_JSON: {"schema": {"$ref": "#/components/schemas/Error"}}},
        }
    if parameters:
        out["parameters"] = parameters
    if operation.body_media:
        out["requestBody"] = {
            "required": True,
            "content": {
                media: {"schema": {"type": "string", "description": _JSON_LINES}}
                for media in operation.body_media
            },
        }
    if operation.body is not None:
        out["requestBody"] = {
            "required": True,
            "content": {_JSON: {"schema": {"$ref": f"#/components/schemas/{operation.body}"}}},
        }
    if rule.access == "public":
        out["security"] = []
    return out


def openapi_document() -> dict[str, Any]:
    """The whole OpenAPI 3.1 document (a fresh copy each call)."""
    return copy.deepcopy(_document())


@functools.cache
def _document() -> dict[str, Any]:
    paths: dict[str, dict[str, Any]] = {}
    for operation in OPERATIONS:
        paths.setdefault(operation.path, {})[operation.method] = _operation(operation)
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "Reef gateway",
            "version": reef.__version__,
            "summary": "OpenAI/Anthropic-compatible gateway that records experience and "
            "serves the releases it learns.",
            "description": "When `auth.keys` is configured, send a key as "
            "`Authorization: Bearer <key>` or `x-api-key: <key>`; without keys the gateway "
            "listens on 127.0.0.1 only. Every request must name the gateway in `Host` "
            "(loopback, `server.host` or `server.allowed_hosts`: else 400), a browser's must "
            "come from its own origin or `server.allowed_origins` (else 403), and a body must "
            "be sent as `application/json` (else 415). Each operation's `x-reef-access` "
            "comes from the gateway's route table, which its guard enforces. Errors use the "
            "caller's dialect.",
            "license": {"name": "Apache-2.0", "identifier": "Apache-2.0"},
        },
        "tags": [{"name": name, "description": text} for name, text in TAGS],
        "paths": paths,
        "components": {
            "schemas": _schemas(),
            "securitySchemes": {
                "bearer": {"type": "http", "scheme": "bearer", "description": "An API key."},
                "apiKey": {
                    "type": "apiKey",
                    "in": "header",
                    "name": "x-api-key",
                    "description": "The same key, Anthropic-style.",
                },
            },
        },
        "security": [{"bearer": []}, {"apiKey": []}],
    }


@functools.cache
def _document_bytes() -> bytes:
    return dumps(_document())


@functools.cache
def _page() -> tuple[bytes, str]:
    return render_page(_document())


class OpenAPIRoutes:
    """``GET /openapi.json`` and ``GET /docs``: no key needed, nothing read from state."""

    async def document(self, request: Request) -> Response:
        """``GET /openapi.json``."""
        return Response(_document_bytes(), media_type=_JSON)

    async def page(self, request: Request) -> Response:
        """``GET /docs``: the document as HTML, under a CSP that allows only its own style."""
        body, style_hash = _page()
        return Response(
            body,
            media_type="text/html; charset=utf-8",
            headers={
                "content-security-policy": f"default-src 'none'; style-src '{style_hash}'; "
                "base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
                "x-content-type-options": "nosniff",
                "referrer-policy": "no-referrer",
            },
        )
