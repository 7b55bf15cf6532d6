"""Logit distillation at the gateway (``scenarios.<s>.distill.teacher_logprobs``): the
teacher is asked for top logprobs, the record keeps them, and the client gets the bytes
it would have got without the feature. Real gateways on loopback, the official openai
SDK, the fake student and the fake upstream as the teacher (``echo: ...``)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from reef.config import ReefSettings
from tests.fakes.student import StudentThread
from tests.fakes.upstream import FakeUpstreamThread
from tests.gateway.harness import GatewayThread
from tests.gateway.test_distill_routing import release
from tests.gateway.test_distill_routing import settings as distilled

TOP = 3


def settings(
    home: Path, student_url: str, teacher_url: str, top: int, **extra: Any
) -> ReefSettings:
    return distilled(home, student_url, teacher_url, distill={"teacher_logprobs": top}, **extra)


@pytest.fixture(scope="module")
def gateways(
    tmp_path_factory: pytest.TempPathFactory, student: StudentThread, teacher: FakeUpstreamThread
) -> Iterator[tuple[GatewayThread, GatewayThread]]:
    """A gateway with the feature on (``TOP``) and one with it off, same upstreams."""
    on_dir, off_dir = tmp_path_factory.mktemp("on"), tmp_path_factory.mktemp("off")
    with (
        GatewayThread(settings(on_dir, student.base_url, teacher.base_url, TOP)) as on,
        GatewayThread(settings(off_dir, student.base_url, teacher.base_url, 0)) as off,
    ):
        yield on, off


def raw_ask(gateway: GatewayThread, text: str, **extra: Any) -> tuple[bytes, Any, Any]:
    """One chat request: the bytes the client got, the SDK's answer, the record."""
    headers = {"x-reef-scenario": "support", **extra.pop("headers", {})}
    raw = gateway.openai(**headers).chat.completions.with_raw_response.create(
        model="gpt-4o", messages=[{"role": "user", "content": text}], **extra
    )
    record = gateway.store.get_record(raw.headers["x-reef-record-id"])
    return raw.content, raw.parse(), record


def without_id(body: bytes) -> dict[str, Any]:
    data = orjson.loads(body)
    assert isinstance(data, dict)
    return {k: v for k, v in data.items() if k != "id"}


def test_the_teacher_is_asked_the_record_keeps_them_the_client_does_not_see_them(
    gateways: tuple[GatewayThread, GatewayThread], teacher: FakeUpstreamThread
) -> None:
    on, off = gateways
    body, answer, record = raw_ask(on, "what is two plus two")
    sent = teacher.last_request_body
    assert sent["logprobs"] is True and sent["top_logprobs"] == TOP
    assert record.tags["reef.served_by"] == "teacher"
    kept = record.response["choices"][0]["logprobs"]["content"]
    assert [t["token"] for t in kept] == ["echo:", " what", " is", " two", " plus", " two"]
    assert [a["token"] for a in kept[1]["top_logprobs"]] == [" what", " what1", " what2"]
    assert answer.choices[0].logprobs is None
    assert answer.choices[0].message.content == "echo: what is two plus two"
    off_body, _, off_record = raw_ask(off, "what is two plus two")
    assert "logprobs" not in teacher.last_request_body  # off: nothing asked
    assert off_record.response["choices"][0]["logprobs"] is None
    # The client's bytes are those it gets without the feature (the fake's ids count up).
    own_id, off_id = orjson.loads(body)["id"], orjson.loads(off_body)["id"]
    assert body.replace(own_id.encode(), off_id.encode()) == off_body


def test_an_escalated_answer_keeps_them_and_a_replay_does_not_show_them(
    gateways: tuple[GatewayThread, GatewayThread], teacher: FakeUpstreamThread
) -> None:
    on, _ = gateways
    pin = release(on, 1.0)
    key = {"x-reef-release": pin, "x-reef-idempotency-key": "refuse-1"}
    body, answer, record = raw_ask(on, "refuse this", headers=key)
    assert record.tags["reef.escalation"] == "refusal_or_empty"
    assert teacher.last_request_body["top_logprobs"] == TOP
    assert record.response["choices"][0]["logprobs"]["content"]
    assert answer.choices[0].logprobs is None
    again, _, _ = raw_ask(on, "refuse this", headers=key)
    assert again == body  # the stored answer, as the client first got it
    _, answer, record = raw_ask(on, "hello student", headers={"x-reef-release": pin})
    assert record.tags["reef.served_by"] == "student"  # the student is never asked
    assert answer.choices[0].logprobs is None


def test_a_client_that_asks_gets_what_it_asked_and_a_stream_is_not_asked(
    gateways: tuple[GatewayThread, GatewayThread], teacher: FakeUpstreamThread
) -> None:
    on, _ = gateways
    ask_teacher = {"x-reef-escalate": "teacher"}  # whatever share the head gives the student
    _, answer, record = raw_ask(
        on, "count to three", logprobs=True, top_logprobs=1, headers=ask_teacher
    )
    assert teacher.last_request_body["top_logprobs"] == 1  # the client's request as sent
    assert len(answer.choices[0].logprobs.content[0].top_logprobs) == 1
    assert record.response["choices"][0]["logprobs"]["content"]
    client = on.openai(**{"x-reef-scenario": "support", **ask_teacher})
    stream = client.chat.completions.create(
        model="gpt-4o", messages=[{"role": "user", "content": "stream it"}], stream=True
    )
    text = "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)
    assert text == "echo: stream it"
    assert "logprobs" not in teacher.last_request_body


def test_more_than_twenty_is_refused_naming_the_field(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"distill\.teacher_logprobs"):
        settings(tmp_path, "http://127.0.0.1:1", "http://127.0.0.1:2", 21)


def test_an_answer_with_something_redacted_is_recorded_without_them(
    tmp_path: Path, student: StudentThread, teacher: FakeUpstreamThread
) -> None:
    # Redaction replaces matches in whole strings: one split over tokens would escape it.
    capture = {"redact_patterns": [r"sk-[a-z0-9]+"]}
    config = settings(tmp_path, student.base_url, teacher.base_url, TOP, capture=capture)
    with GatewayThread(config) as gateway:
        _, answer, record = raw_ask(gateway, "my key is sk-abc123")
        assert teacher.last_request_body["top_logprobs"] == TOP
        assert answer.choices[0].message.content == "echo: my key is sk-abc123"
        assert record.response["choices"][0]["message"]["content"] == "echo: my key is [REDACTED]"
        assert record.response["choices"][0]["logprobs"] is None
        _, _, record = raw_ask(gateway, "nothing secret here")
        assert record.response["choices"][0]["logprobs"]["content"]
