"""Live teacher checks (``reef.learning.live_references``, ``reef.evaluation.teacher_checks``):
a distilled scenario's canary decided with nobody's feedback. A real gateway routes between
a loopback student (answers ``student: <text>``) and a loopback teacher (answers a label);
the worker's writer asks the teacher what the student answered and writes the checks; the
canary monitor decides on them."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from reef.config import ReefSettings
from reef.config.distill import LiveReferencesConfig
from reef.evaluation import CanaryMonitor, GateConfig, GateRule, TeacherChecks
from reef.evaluation.teacher_checks import CHECK_SOURCE, check_of
from reef.experience import RecordView
from reef.learning.live_references import CHECK_TAG, LiveReferenceWriter
from reef.releases import (
    EscalationRules,
    ReleaseChain,
    ReleaseManifest,
    RoutingComponent,
    TeacherEndpoint,
)
from tests.fakes.student import StudentThread
from tests.fakes.teacher import TeacherThread
from tests.gateway.harness import GatewayThread
from tests.polling import eventually

LABELS = {"alpha": "A-1", "beta": "B-2"}
TEACHER = TeacherEndpoint(upstream="teacher", model="teacher-model")
AUTHOR = "teacher:teacher/teacher-model"
GATE = GateConfig(scorer={"type": "contains"})
MARGIN = 0.1


@pytest.fixture
def student() -> Iterator[StudentThread]:
    with StudentThread() as server:
        yield server


@pytest.fixture
def teacher() -> Iterator[TeacherThread]:
    with TeacherThread(LABELS) as server:
        yield server


@pytest.fixture
def gateway(
    tmp_path: Path, student: StudentThread, teacher: TeacherThread
) -> Iterator[GatewayThread]:
    common = {"read_timeout_seconds": 2, "total_timeout_seconds": 5}
    settings = ReefSettings(
        home=tmp_path / "home",
        store={"url": f"sqlite:///{tmp_path / 'reef.db'}"},
        upstreams={
            "student": {"type": "openai", "base_url": student.base_url, "model": "student-model"}
            | common,
            "teacher": {"type": "openai", "base_url": teacher.base_url, "model": "teacher-model"}
            | {"prices": {"teacher-model": {"input_per_mtok": 10e6, "output_per_mtok": 30e6}}}
            | common,
        },
        scenarios={"support": {"upstream": "student", "distill": {"teacher": TEACHER}}},
        activation={"poll_interval_seconds": 0.05},
    )
    with GatewayThread(settings) as gw:
        yield gw


def ask(gateway: GatewayThread, text: str) -> str:
    """One live request (the app's own model name); its record id."""
    raw = gateway.openai(**{"x-reef-scenario": "support"}).chat.completions.with_raw_response
    response = raw.create(model="gpt-4o", messages=[{"role": "user", "content": text}])
    return response.headers["x-reef-record-id"]


def start_canary(gateway: GatewayThread, share: float = 1.0) -> str:
    """A teacher-only head, and a student candidate at ``share`` as a live canary on
    half the traffic (min 4 records an arm); the candidate's id, once the gateway
    serves it."""
    chain = ReleaseChain(gateway.database)
    if chain.head("support") is None:
        ask(gateway, "hello")  # the first request creates the first release
    head = chain.head("support")
    assert head is not None and head.manifest.routing is not None
    assert head.manifest.routing.student_share == 0.0
    routing = RoutingComponent(
        student_share=share, teacher=TEACHER, escalation=EscalationRules(refusal_or_empty=True)
    )
    manifest = ReleaseManifest(model=head.manifest.model, routing=routing)
    candidate = chain.propose("support", manifest, head.id, "test", "student")
    evidence = {"gate": {"baseline_id": head.id}}
    chain.set_candidate_state(candidate.id, "evaluating")
    chain.set_candidate_state(candidate.id, "passed", evidence)
    chain.start_canary(candidate.id, 0.5, "test", "live", {"min_requests": 4})

    def serving() -> bool:
        return any(
            gateway.store.get_record(ask(gateway, "alpha A-1 warm up")).purpose == "canary"
            for _ in range(4)
        )

    eventually(serving, "the gateway to serve the canary", timeout_seconds=10)
    return candidate.id


def records(gateway: GatewayThread, ids: list[str]) -> list[RecordView]:
    return [gateway.store.get_record(record_id) for record_id in ids]


def writer(gateway: GatewayThread) -> LiveReferenceWriter:
    chain = ReleaseChain(gateway.database)
    return LiveReferenceWriter(gateway.settings, gateway.store, chain)


def monitor(gateway: GatewayThread, fraction: float = 1.0) -> CanaryMonitor:
    chain = ReleaseChain(gateway.database)
    return CanaryMonitor(
        chain,
        gateway.store,
        GateRule(non_inferiority_margin=MARGIN),
        rollout_steps={"support": [1.0]},
        teacher_checks={"support": TeacherChecks(fraction, "openai.chat")},
    )


def test_the_teacher_checks_each_student_answer_once(
    gateway: GatewayThread, teacher: TeacherThread
) -> None:
    start_canary(gateway)
    # the student echoes the text: it agrees with the teacher when the text names the label
    agree = [ask(gateway, f"alpha A-1 question {i}") for i in range(6)]
    differ = [ask(gateway, f"beta question {i}") for i in range(6)]
    served = records(gateway, agree + differ)
    assert {r.tags["reef.served_by"] for r in served} == {"student", "teacher"}  # both arms
    # every student answer since the canary started (the warm-up requests' too)
    by_student = [
        r for r in gateway.store.iter_export("support") if r.tags.get("reef.served_by") == "student"
    ]
    before = teacher.calls

    done = writer(gateway).run("support", LiveReferencesConfig(), GATE, None)

    # one teacher call per student answer (every record is checked at fraction 1);
    # the teacher's own answers need none
    assert done.error is None and done.calls == len(by_student) == done.checked
    assert teacher.calls - before == len(by_student)
    for record in records(gateway, [r.id for r in served]):
        check = check_of(record)
        if record.tags["reef.served_by"] == "teacher":
            assert check is None
            continue
        assert check is not None and check.source == CHECK_SOURCE
        assert check.principal == AUTHOR and check.trust == "operator"
        if record.id in agree:
            assert check.score == 1.0 and check.correction is None
        else:  # the teacher's answer differs: it is the correction (on-policy target)
            assert check.score == 0.0 and check.correction == "B-2"
        call = gateway.store.get_record(check.metadata["teacher_record_id"])
        assert call.purpose == "judge" and call.tags[CHECK_TAG] == record.id
        assert call.request["model"] == "teacher-model" and "stream" not in call.request
        assert call.cost is not None and call.cost > 0  # the teacher's price, Reef's spend

    # a second pass asks nothing again
    again = writer(gateway).run("support", LiveReferencesConfig(), GATE, None)
    assert again.calls == 0 and teacher.calls - before == len(by_student)


def test_a_student_that_agrees_with_the_teacher_is_promoted_without_feedback(
    gateway: GatewayThread,
) -> None:
    candidate_id = start_canary(gateway)
    client = gateway.openai(**{"x-reef-scenario": "support"})
    for i in range(16):
        ask(gateway, f"alpha A-1 question {i}")
        if i % 4 == 0:  # the Responses API is routed but never checked: it blocks nothing
            client.responses.create(model="gpt-4o", input=f"beta responses {i}")
    # nothing is decided before the teacher has checked the student's answers
    [waiting] = monitor(gateway).check()
    assert waiting.action == "waiting" and waiting.canary_scores == 0
    writer(gateway).run("support", LiveReferencesConfig(), GATE, None)
    [decided] = monitor(gateway).check()
    assert decided.action == "promoted", decided
    assert decided.canary_scores >= 4 and decided.head_scores >= 4
    head = ReleaseChain(gateway.database).head("support")
    assert head is not None and head.id == decided.release_id
    assert head.candidate_id == candidate_id
    canary = (head.evidence or {})["canary"]
    assert canary["decision"] == "promoted" and AUTHOR in str(canary["evidence"])


def test_a_student_that_differs_is_abandoned_without_feedback(
    gateway: GatewayThread,
) -> None:
    start_canary(gateway)
    teacher_head = ReleaseChain(gateway.database).head("support")
    for i in range(16):
        ask(gateway, f"beta question {i}")
    writer(gateway).run("support", LiveReferencesConfig(), GATE, None)
    [decided] = monitor(gateway).check()
    assert decided.action == "abandoned" and "worse live" in decided.reason, decided
    assert ReleaseChain(gateway.database).canaries() == {}
    # the teacher's release served beside it and still does
    assert ReleaseChain(gateway.database).head("support") == teacher_head


def test_records_after_the_first_unchecked_student_answer_do_not_count(
    gateway: GatewayThread,
) -> None:
    """A slow teacher must not tilt an arm toward the records already decided: with two
    checks written, only the records served before the first unchecked one count."""
    candidate_id = start_canary(gateway)
    for i in range(16):
        ask(gateway, f"alpha A-1 question {i}")
    limited = LiveReferencesConfig(calls_per_pass=2)
    done = writer(gateway).run("support", limited, GATE, None)
    assert done.calls == 2 and done.waiting > 0
    chain = ReleaseChain(gateway.database)
    started = (chain.get_candidate(candidate_id).evidence or {})["canary"]["started_at"]
    served = sorted(
        (
            r
            for r in gateway.store.iter_export("support", since=started)
            if r.purpose in ("canary", "serve")  # not the teacher's calls
        ),
        key=lambda r: (r.created_at, r.id),
    )
    students = [r for r in served if r.tags["reef.served_by"] == "student"]
    third = students[2]  # the first one left unchecked (the oldest are asked first)
    before = [r for r in served if (r.created_at, r.id) < (third.created_at, third.id)]
    [waiting] = monitor(gateway).check()
    assert waiting.canary_scores + waiting.head_scores == len(before)
    assert waiting.canary_scores == sum(r.purpose == "canary" for r in before)


def test_a_fraction_checks_a_stable_sample_and_zero_turns_it_off(
    gateway: GatewayThread, teacher: TeacherThread
) -> None:
    start_canary(gateway)
    for i in range(20):
        ask(gateway, f"beta question {i}")
    before = teacher.calls
    off = writer(gateway).run("support", LiveReferencesConfig(fraction=0.0), GATE, None)
    assert off.calls == 0 and teacher.calls == before
    half = writer(gateway).run("support", LiveReferencesConfig(fraction=0.5), GATE, None)
    full = writer(gateway).run("support", LiveReferencesConfig(fraction=1.0), GATE, None)
    # the half's records are a subset: the full pass asks only the rest
    assert 0 < half.calls < half.calls + full.calls
    assert teacher.calls - before == half.calls + full.calls


def test_no_canary_no_teacher_calls(gateway: GatewayThread, teacher: TeacherThread) -> None:
    for i in range(4):
        ask(gateway, f"beta question {i}")  # a teacher-only head, no canary
    before = teacher.calls
    done = writer(gateway).run("support", LiveReferencesConfig(), GATE, None)
    assert done.calls == 0 and teacher.calls == before


def test_outside_a_canary_the_serving_students_answers_are_checked_when_asked(
    gateway: GatewayThread, teacher: TeacherThread
) -> None:
    """On-policy data: with ``on_policy_fraction``, the teacher corrects the serving
    student's answers between canaries; by default nothing is asked."""
    chain = ReleaseChain(gateway.database)
    ask(gateway, "hello")
    head = chain.head("support")
    assert head is not None
    routing = RoutingComponent(student_share=1.0, teacher=TEACHER)
    manifest = ReleaseManifest(model=head.manifest.model, routing=routing)
    candidate = chain.propose("support", manifest, head.id, "test", "student serves")
    student = chain.publish(candidate.id, head.id, "test", "test", require_passed=False)

    def serving() -> bool:
        return gateway.store.get_record(ask(gateway, "alpha A-1 warm up")).release_id == (
            student.id
        )

    eventually(serving, "the gateway to serve the student release", timeout_seconds=10)
    ids = [ask(gateway, f"beta question {i}") for i in range(6)]
    before = teacher.calls
    assert writer(gateway).run("support", LiveReferencesConfig(), GATE, None).calls == 0
    assert teacher.calls == before
    on_policy = LiveReferencesConfig(on_policy_fraction=1.0)
    done = writer(gateway).run("support", on_policy, GATE, None)
    assert done.error is None and done.calls >= len(ids)
    for record in records(gateway, ids):
        check = check_of(record)
        assert check is not None and check.score == 0.0 and check.correction == "B-2"
