"""Teacher/student routing of a distilled scenario (``reef.gateway.distill``): a real
gateway on loopback, the official SDKs as clients, a fake student that answers
``student: ...`` (or what a rule catches) and the fake upstream as the teacher
(``echo: ...``), so each test can tell who answered."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import orjson
import pytest

from reef.config import ReefSettings
from reef.gateway.distill import choose_arm, student_draw
from reef.gateway.serving.drift import adopted_manifest
from reef.releases import (
    EscalationRules,
    ModelComponent,
    ReleaseChain,
    ReleaseManifest,
    RoutingComponent,
    TeacherEndpoint,
)
from tests.fakes.student import StudentThread
from tests.fakes.upstream import FakeUpstreamThread
from tests.gateway.harness import GatewayThread
from tests.polling import eventually

STUDENT_PRICES = {"student-model": {"input_per_mtok": 1e6, "output_per_mtok": 2e6}}
TEACHER_PRICES = {"teacher-model": {"input_per_mtok": 10e6, "output_per_mtok": 30e6}}
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    }
]


def settings(
    tmp_path: Path,
    student_url: str,
    teacher_url: str,
    student: dict[str, Any] | None = None,
    teacher: dict[str, Any] | None = None,
    distill: dict[str, Any] | None = None,
    **extra: Any,
) -> ReefSettings:
    """Settings of the ``support`` scenario distilled from ``teacher`` into ``student``
    (each upstream's settings updated by the dict given, e.g. ``responses: native``;
    ``distill`` adds to the scenario's distill section)."""
    common = {"read_timeout_seconds": 2, "total_timeout_seconds": 5}
    return ReefSettings(
        home=tmp_path / "home",
        store={"url": f"sqlite:///{tmp_path / 'reef.db'}"},
        upstreams={
            "student": {"type": "openai", "base_url": student_url, "model": "student-model"}
            | {"prices": STUDENT_PRICES}
            | common
            | (student or {}),
            "teacher": {"type": "openai", "base_url": teacher_url, "model": "teacher-model"}
            | {"prices": TEACHER_PRICES}
            | common
            | (teacher or {}),
        },
        scenarios={
            "support": {
                "upstream": "student",
                "distill": {"teacher": {"upstream": "teacher", "model": "teacher-model"}}
                | (distill or {}),
            }
        },
        **extra,
    )


@pytest.fixture(scope="module")
def gateway(
    tmp_path_factory: pytest.TempPathFactory, student: StudentThread, teacher: FakeUpstreamThread
) -> Iterator[GatewayThread]:
    tmp = tmp_path_factory.mktemp("distill")
    with GatewayThread(settings(tmp, student.base_url, teacher.base_url)) as gw:
        yield gw


def release(gateway: GatewayThread, share: float, **rules: Any) -> str:
    """A release of ``support`` routing ``share`` to the student with ``rules``; its id
    (requests pin it with ``x-reef-release``, as the gate's arms do)."""
    chain = ReleaseChain(gateway.database)
    head = chain.head("support")
    if head is None:  # the first request creates the first release
        gateway.openai().chat.completions.create(
            model="reef/support", messages=[{"role": "user", "content": "hello"}]
        )
        head = chain.head("support")
    assert head is not None
    routing = RoutingComponent(
        student_share=share,
        teacher=TeacherEndpoint(upstream="teacher", model="teacher-model"),
        escalation=EscalationRules(**rules),
    )
    manifest = ReleaseManifest(model=head.manifest.model, routing=routing)
    candidate = chain.propose("support", manifest, head.id, "test", f"share {share}")
    published = chain.publish(candidate.id, head.id, "test", "test", require_passed=False)
    wait_serving(gateway, published.id)
    return published.id


def wait_serving(gateway: GatewayThread, release_id: str) -> None:
    """Until the gateway serves ``release_id`` for unpinned traffic (it polls the heads)."""

    def serving() -> bool:
        status = httpx.get(f"{gateway.url}/reef/status").json()["scenarios"].get("support")
        return bool(status and status.get("serving_release_id") == release_id)

    eventually(serving, f"the gateway to serve {release_id}", timeout_seconds=10)


def ask(gateway: GatewayThread, pin: str | None, text: str, **extra: Any) -> tuple[Any, Any]:
    """One chat request (pinned to ``pin``); the SDK's answer and its record."""
    headers = {"x-reef-scenario": "support"}  # the app keeps its own model name
    if pin:
        headers["x-reef-release"] = pin
    headers.update(extra.pop("headers", {}))
    raw = gateway.openai(**headers).chat.completions.with_raw_response.create(
        model="gpt-4o", messages=[{"role": "user", "content": text}], **extra
    )
    answer = raw.parse()
    record = gateway.store.get_record(raw.headers["x-reef-record-id"])
    assert raw.headers["x-reef-served-by"] == record.tags["reef.served_by"]
    return answer, record


def test_the_first_release_routes_everything_to_the_teacher(
    gateway: GatewayThread, teacher: FakeUpstreamThread
) -> None:
    answer, record = ask(gateway, None, "what is two plus two")
    assert answer.choices[0].message.content == "echo: what is two plus two"
    assert record.tags["reef.served_by"] == "teacher"
    assert "reef.escalation" not in record.tags
    # the app's model name is replaced by the teacher's, on the teacher's upstream
    assert teacher.last_request_body["model"] == "teacher-model"
    head = ReleaseChain(gateway.database).head("support")
    assert head is not None and head.manifest.routing is not None
    assert head.manifest.routing.student_share == 0.0
    assert head.manifest.routing.teacher.upstream == "teacher"


def test_share_one_with_no_rule_firing_is_all_student(gateway: GatewayThread) -> None:
    pin = release(gateway, 1.0)
    for n in range(4):
        answer, record = ask(gateway, pin, f"question {n}")
        assert answer.choices[0].message.content == f"student: question {n}"
        assert record.tags["reef.served_by"] == "student"
        assert "reef.student_attempt" not in record.tags
    answer, record = ask(gateway, pin, "good-tool please", tools=TOOLS)
    assert answer.choices[0].message.tool_calls[0].function.name == "get_weather"
    assert record.tags["reef.served_by"] == "student"
    fmt = {"type": "json_object"}
    answer, record = ask(gateway, pin, "good-json please", response_format=fmt)
    assert orjson.loads(answer.choices[0].message.content) == {"answer": 42}


SCHEMA_FORMAT = {
    "type": "json_schema",
    "json_schema": {
        "name": "answer",
        "schema": {
            "type": "object",
            "properties": {"answer": {"type": "string"}},
            "required": ["answer"],
        },
    },
}


@pytest.mark.parametrize(
    ("text", "extra", "rule"),
    [
        ("refuse this", {}, "refusal_or_empty"),
        ("refusal-field this", {}, "refusal_or_empty"),
        ("empty this", {}, "refusal_or_empty"),
        ("unknown-tool call", {"tools": TOOLS}, "invalid_tool_calls"),
        ("bad-args call", {"tools": TOOLS}, "invalid_tool_calls"),
        ("broken-args call", {"tools": TOOLS}, "invalid_tool_calls"),
        ("bad-json answer", {"response_format": {"type": "json_object"}}, "invalid_json"),
        # valid JSON, but its answer is a number where the schema wants a string
        ("good-json answer", {"response_format": SCHEMA_FORMAT}, "invalid_json"),
    ],
)
def test_each_rule_escalates_to_the_teacher_before_any_byte(
    gateway: GatewayThread, text: str, extra: dict[str, Any], rule: str
) -> None:
    pin = release(gateway, 1.0)
    answer, record = ask(gateway, pin, text, **extra)
    assert answer.choices[0].message.content == f"echo: {text}"
    assert record.tags["reef.served_by"] == "teacher"
    assert record.tags["reef.escalation"] == rule
    attempt = orjson.loads(record.tags["reef.student_attempt"])
    assert attempt["response"]["model"] == "student-model"  # the student's own answer
    assert record.response["model"] == "teacher-model"  # the one returned


def test_a_rule_turned_off_lets_the_student_answer(gateway: GatewayThread) -> None:
    pin = release(gateway, 1.0, refusal_or_empty=False)
    answer, record = ask(gateway, pin, "refuse this")
    assert answer.choices[0].message.content == "I'm sorry, but I can't help with that."
    assert record.tags["reef.served_by"] == "student"


def test_low_mean_logprob_escalates_and_logprobs_are_asked_only_for_the_rule(
    gateway: GatewayThread, student: StudentThread
) -> None:
    pin = release(gateway, 1.0, min_mean_logprob=-1.0)
    answer, record = ask(gateway, pin, "sure of this")
    assert student.requests[-1]["logprobs"] is True
    assert record.tags["reef.served_by"] == "student"
    assert answer.choices[0].logprobs is None  # asked by Reef, not by the client
    assert float(record.tags["reef.student_mean_logprob"]) == pytest.approx(-0.1)
    answer, record = ask(gateway, pin, "unsure of this")
    assert record.tags["reef.escalation"] == "logprob"
    assert float(record.tags["reef.student_mean_logprob"]) == pytest.approx(-5.0)
    assert answer.choices[0].message.content == "echo: unsure of this"
    off = release(gateway, 1.0)
    ask(gateway, off, "no logprobs asked")
    assert "logprobs" not in student.requests[-1]


def test_the_header_asks_the_teacher(gateway: GatewayThread) -> None:
    pin = release(gateway, 1.0)
    headers = {"x-reef-escalate": "teacher"}
    answer, record = ask(gateway, pin, "from the teacher", headers=headers)
    assert answer.choices[0].message.content == "echo: from the teacher"
    assert record.tags["reef.escalation"] == "header"
    assert "reef.student_attempt" not in record.tags  # the student was never asked
    off = release(gateway, 1.0, header=False)
    _, record = ask(gateway, off, "header ignored", headers=headers)
    assert record.tags["reef.served_by"] == "student"


def test_anthropic_messages_route_and_escalate_too(gateway: GatewayThread) -> None:
    pin = release(gateway, 1.0)
    client = gateway.anthropic(**{"x-reef-release": pin, "x-reef-scenario": "support"})
    raw = client.messages.with_raw_response.create(
        model="claude-x", max_tokens=50, messages=[{"role": "user", "content": "hi there"}]
    )
    assert raw.headers["x-reef-served-by"] == "student"
    assert _text(raw.parse()) == "student: hi there"
    raw = client.messages.with_raw_response.create(
        model="claude-x", max_tokens=50, messages=[{"role": "user", "content": "refuse it"}]
    )
    assert raw.headers["x-reef-served-by"] == "teacher"
    assert _text(raw.parse()) == "echo: refuse it"
    record = gateway.store.get_record(raw.headers["x-reef-record-id"])
    assert record.tags["reef.escalation"] == "refusal_or_empty"


def _text(message: Any) -> str:
    return "".join(block.text for block in message.content if block.type == "text")


def _streamed(gateway: GatewayThread, pin: str, text: str) -> tuple[str, Any]:
    client = gateway.openai(**{"x-reef-release": pin, "x-reef-scenario": "support"})
    with client.chat.completions.with_streaming_response.create(
        model="gpt-4o", messages=[{"role": "user", "content": text}], stream=True
    ) as response:
        served_by = response.headers["x-reef-served-by"]
        record_id = response.headers["x-reef-record-id"]
        pieces = [
            chunk.choices[0].delta.content or "" for chunk in response.parse() if chunk.choices
        ]
    record = gateway.store.get_record(record_id)
    assert record.tags["reef.served_by"] == served_by
    return "".join(pieces), record


def test_streams_route_by_share(gateway: GatewayThread) -> None:
    text, record = _streamed(gateway, release(gateway, 1.0), "stream me please")
    assert text == "student: stream me please"
    assert record.status == "ok" and record.tags["reef.served_by"] == "student"
    # without a buffer a stream is committed at once: a refusal is not caught
    text, record = _streamed(gateway, release(gateway, 1.0), "refuse to stream")
    assert text.startswith("I'm sorry")
    text, record = _streamed(gateway, release(gateway, 0.0), "stream me please")
    assert text == "echo: stream me please"
    assert record.tags["reef.served_by"] == "teacher"


def test_a_buffered_stream_escalates_or_commits(gateway: GatewayThread) -> None:
    pin = release(gateway, 1.0, stream_buffer_tokens=8)
    text, record = _streamed(gateway, pin, "refuse to stream")
    assert text == "echo: refuse to stream"
    assert record.tags["reef.escalation"] == "refusal_or_empty"
    attempt = orjson.loads(record.tags["reef.student_attempt"])
    assert attempt["text"].startswith("I'm sorry, but I can't help")
    # a good answer longer than the buffer: the buffered tokens, then the rest
    long = "a long answer with many more words than the buffer holds at all"
    text, record = _streamed(gateway, pin, long)
    assert text == f"student: {long}"
    assert record.status == "ok" and record.tags["reef.served_by"] == "student"


def test_costs_of_both_attempts_each_at_its_own_price(gateway: GatewayThread) -> None:
    pin = release(gateway, 1.0)
    _, served = ask(gateway, pin, "a priced question")
    usage = served.usage
    assert served.cost == pytest.approx(
        usage["prompt_tokens"] * 1.0 + usage["completion_tokens"] * 2.0
    )
    _, escalated = ask(gateway, pin, "refuse a priced question")
    attempt = orjson.loads(escalated.tags["reef.student_attempt"])
    student_usage = attempt["response"]["usage"]
    student_cost = student_usage["prompt_tokens"] * 1.0 + student_usage["completion_tokens"] * 2.0
    assert attempt["cost"] == pytest.approx(student_cost)
    assert attempt["price"]["model"] == "student-model"
    teacher_usage = escalated.usage
    teacher_cost = teacher_usage["prompt_tokens"] * 10.0 + teacher_usage["completion_tokens"] * 30.0
    assert escalated.cost == pytest.approx(student_cost + teacher_cost)
    assert escalated.price["model"] == "teacher-model"


def test_a_budget_settles_both_attempts_each_at_its_price(
    tmp_path: Path, student: StudentThread, teacher: FakeUpstreamThread
) -> None:
    budgets = {"scenarios": {"support": [{"window": "month", "money": 1e9}]}}
    configured = settings(tmp_path, student.base_url, teacher.base_url, budgets=budgets)
    with GatewayThread(configured) as gw:
        pin = release(gw, 1.0)
        _, escalated = ask(gw, pin, "refuse a budgeted question")
        with httpx.Client(base_url=gw.url) as http:
            [line] = http.get("/reef/status").json()["spend"]["budgets"]
        records = list(gw.store.iter_export("support"))
    assert [r.id for r in records] == [escalated.id]  # the one request: two attempts
    student_cost = orjson.loads(escalated.tags["reef.student_attempt"])["cost"]
    assert escalated.cost is not None and 0 < student_cost < escalated.cost
    assert line["money"] == pytest.approx(escalated.cost)  # both settled, nothing reserved


def test_metrics_and_status_count_arms_rules_and_teacher_calls(gateway: GatewayThread) -> None:
    pin = release(gateway, 1.0)
    ask(gateway, pin, "counted student")
    ask(gateway, pin, "refuse counted")
    with httpx.Client(base_url=gateway.url) as http:
        metrics = http.get("/metrics").text
        status = http.get("/reef/status").json()
    assert 'reef_distill_requests_total{arm="student",scenario="support"}' in metrics
    assert 'reef_distill_escalations_total{rule="refusal_or_empty",scenario="support"}' in metrics
    assert 'reef_distill_teacher_calls_total{scenario="support"}' in metrics
    distill = status["distill"]["support"]
    assert distill["student_share"] == 1.0
    assert distill["requests"]["student"] >= 1 and distill["teacher_calls_total"] >= 1
    assert 0.0 < distill["escalation_rate"] < 1.0
    assert distill["teacher_calls_last_hour"] == distill["teacher_calls_total"]


def test_reef_status_prints_the_distill_line(gateway: GatewayThread) -> None:
    pin = release(gateway, 1.0)
    ask(gateway, pin, "refuse for status")
    result = subprocess.run(
        [sys.executable, "-m", "reef", "status", "--url", gateway.url],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=gateway.settings.home.parent,
    )
    assert result.returncode == 0, result.stderr
    line = next(x for x in result.stdout.splitlines() if x.startswith("distill support:"))
    assert "student share 1" in line and "escalation rate" in line
    assert "teacher calls" in line and "in the last hour" in line


def test_the_draw_is_reproducible_per_request_id_and_follows_the_share() -> None:
    routing = RoutingComponent(student_share=0.3, teacher=TeacherEndpoint(upstream="t", model="m"))
    ids = [f"record-{n}" for n in range(2000)]
    arms = [choose_arm(routing, i, None)[0] for i in ids]
    assert arms == [choose_arm(routing, i, None)[0] for i in ids]
    share = arms.count("student") / len(ids)
    assert 0.25 < share < 0.35
    assert all(0.0 <= student_draw(i) < 1.0 for i in ids)
    assert choose_arm(routing, "x", " Teacher ") == ("teacher", "header")


def test_manifest_round_trip_with_and_without_routing() -> None:
    bare = ReleaseManifest(model=ModelComponent(base="m"))
    assert "routing" not in bare.to_json()
    assert ReleaseManifest.from_json(bare.to_json()) == bare
    routed = ReleaseManifest(
        model=ModelComponent(base="m"),
        routing=RoutingComponent(
            student_share=0.5,
            teacher=TeacherEndpoint(upstream="t", model="big"),
            escalation=EscalationRules(min_mean_logprob=-1.5, stream_buffer_tokens=4),
        ),
    )
    data = routed.to_json()
    assert data["routing"]["student_share"] == 0.5
    assert ReleaseManifest.from_json(orjson.loads(orjson.dumps(data))) == routed


def test_distill_config_errors_name_the_field(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"scenarios\.support\.distill\.teacher\.upstream"):
        ReefSettings(
            upstreams={"a": {"type": "openai", "base_url": "http://127.0.0.1:9", "model": "m"}},
            scenarios={"support": {"distill": {"teacher": {"upstream": "nope", "model": "t"}}}},
        )
    with pytest.raises(ValueError, match="rollout_steps must increase"):
        ReefSettings(
            upstreams={"a": {"type": "openai", "base_url": "http://127.0.0.1:9", "model": "m"}},
            scenarios={
                "support": {
                    "distill": {
                        "teacher": {"upstream": "a", "model": "t"},
                        "rollout_steps": [0.5, 0.5],
                    }
                }
            },
        )


def test_an_unrouted_release_is_unchanged(gateway: GatewayThread) -> None:
    # a release without routing serves its model for everything, with no routing tags
    chain = ReleaseChain(gateway.database)
    head = chain.head("support")
    assert head is not None
    candidate = chain.propose(
        "support", ReleaseManifest(model=head.manifest.model), head.id, "test", "no routing"
    )
    plain = chain.publish(candidate.id, head.id, "test", "test", require_passed=False)
    pinned = {"x-reef-release": plain.id, "x-reef-scenario": "support"}
    raw = gateway.openai(**pinned).chat.completions.with_raw_response
    response = raw.create(model="gpt-4o", messages=[{"role": "user", "content": "plain"}])
    assert "x-reef-served-by" not in response.headers
    assert response.parse().choices[0].message.content == "student: plain"
    with pytest.raises(openai.NotFoundError):
        gateway.openai(**{**pinned, "x-reef-release": "no-such"}).chat.completions.create(
            model="gpt-4o", messages=[{"role": "user", "content": "x"}]
        )


def test_an_adopted_base_model_starts_the_student_over_at_share_zero() -> None:
    routing = RoutingComponent(
        student_share=0.7, teacher=TeacherEndpoint(upstream="t", model="big")
    )
    head = ReleaseManifest(model=ModelComponent(base="old", adapter="sha256:" + "a" * 64))
    head = head.model_copy(update={"routing": routing})
    adopted = adopted_manifest(head, "new")
    assert adopted.model == ModelComponent(base="new")
    assert adopted.routing is not None and adopted.routing.student_share == 0.0
    assert adopted.routing.teacher == routing.teacher
    # a head without routing takes the configured one; none configured: none
    configured = routing.model_copy(update={"student_share": 0.0})
    plain = ReleaseManifest(model=ModelComponent(base="old"))
    assert adopted_manifest(plain, "new", configured).routing == configured
    assert adopted_manifest(plain, "new").routing is None


def test_a_pinned_candidate_is_the_students_first_as_at_full_share(
    gateway: GatewayThread,
) -> None:
    """The gate's arm of a distilled candidate measures the student it would serve: a
    candidate at share 0.1 answers every pinned request with the student first (rules
    still on), while the head's own share decides unpinned traffic."""
    head_id = release(gateway, 0.0)
    chain = ReleaseChain(gateway.database)
    head = chain.head("support")
    assert head is not None and head.id == head_id
    routing = RoutingComponent(
        student_share=0.1, teacher=TeacherEndpoint(upstream="teacher", model="teacher-model")
    )
    manifest = ReleaseManifest(model=head.manifest.model, routing=routing)
    candidate = chain.propose("support", manifest, head.id, "test", "share 0.1")
    candidate = chain.set_candidate_state(candidate.id, "evaluating")
    served = [ask(gateway, candidate.id, f"question {i}")[1] for i in range(12)]
    assert {record.tags["reef.served_by"] for record in served} == {"student"}
    assert {record.release_id for record in served} == {candidate.id}
    # a rule still escalates the candidate's requests
    _, refused = ask(gateway, candidate.id, "please refuse this")
    assert refused.tags["reef.served_by"] == "teacher"
    assert refused.tags["reef.escalation"] == "refusal_or_empty"
    # unpinned traffic follows the head's share (0): the teacher
    _, live = ask(gateway, None, "a live question")
    assert live.tags["reef.served_by"] == "teacher"
