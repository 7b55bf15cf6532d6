"""``capture.redact_patterns`` covers every string the gateway stores: a record's request,
response, error and tag values, the stored Responses-API state, and feedback text,
corrections and metadata. Each is read back through the store, on SQLite and
PostgreSQL."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import openai
import pytest

from reef.experience import REDACTED, ResponseStore
from tests.fakes.upstream import FakeUpstreamThread
from tests.gateway.harness import GatewayThread, make_settings
from tests.gateway.rawhttp import call

EMAIL = r"[\w.+-]+@[\w-]+\.[\w.]+"
SECRET = "ann@example.com"


def _gateway(tmp_path: Path, fake: FakeUpstreamThread, store: dict[str, str]) -> GatewayThread:
    patterns = [EMAIL, r"\(fail-500\)"]
    settings = make_settings(
        tmp_path, fake.base_url, store=store, capture={"redact_patterns": patterns}
    )
    return GatewayThread(settings)


def _nowhere(value: Any) -> None:
    assert SECRET not in repr(value)


def test_the_stored_responses_state_is_redacted(
    tmp_path: Path, fake: FakeUpstreamThread, shared_store: dict[str, str]
) -> None:
    with _gateway(tmp_path, fake, shared_store) as gateway:
        client = gateway.openai()
        first = client.responses.create(model="reef/support", input=f"mail {SECRET} please")
        assert first.output_text == f"echo: mail {SECRET} please"  # the client's own answer
        events = list(
            client.responses.create(
                model="reef/support",
                previous_response_id=first.id,
                input=f"and copy {SECRET}",
                stream=True,
            )
        )
        second = events[-1].response
        store = ResponseStore(gateway.database)
        for response_id in (first.id, second.id):
            kept = store.get(response_id)
            _nowhere(kept.input_items)
            _nowhere(kept.response)
            assert REDACTED in repr(kept.input_items) and REDACTED in repr(kept.response)
            record = gateway.store.get_record(kept.record_id or "")
            _nowhere(record.request)
            _nowhere(record.response)
        assert client.responses.retrieve(first.id).output_text == f"echo: mail {REDACTED} please"
        texts = [item.content[0].text for item in client.responses.input_items.list(second.id)]
        assert texts == [
            f"and copy {REDACTED}",
            f"echo: mail {REDACTED} please",
            f"mail {REDACTED} please",
        ]
        # what a continuation sends upstream is the stored, redacted history
        client.responses.create(model="reef/support", previous_response_id=first.id, input="ok")
        assert fake.last_request_body["messages"][0] == {
            "role": "user",
            "content": f"mail {REDACTED} please",
        }


def test_a_records_error_and_tags_are_redacted(make_gateway: Any) -> None:
    gateway = make_gateway(capture={"redact_patterns": [EMAIL, r"\(fail-500\)"]})
    client = gateway.openai(**{"x-reef-tag-customer": SECRET})
    with pytest.raises(openai.InternalServerError) as info:
        client.chat.completions.create(
            model="reef/support", messages=[{"role": "user", "content": f"fail-500 {SECRET}"}]
        )
    assert "(fail-500)" in str(info.value)  # the caller is told the upstream's words
    (record,) = list(gateway.store.iter_export("support"))
    assert record.status == "error" and record.error is not None
    assert "(fail-500)" not in record.error and REDACTED in record.error
    assert record.tags == {"customer": REDACTED}
    _nowhere(record.request)


def test_feedback_text_correction_and_metadata_are_redacted(
    tmp_path: Path, fake: FakeUpstreamThread, shared_store: dict[str, str]
) -> None:
    with _gateway(tmp_path, fake, shared_store) as gateway:
        raw = gateway.openai().chat.completions.with_raw_response.create(
            model="reef/support", messages=[{"role": "user", "content": "who do I write to?"}]
        )
        record_id = raw.headers["x-reef-record-id"]
        sent = {
            "record_ids": [record_id],
            "score": 0.0,
            "feedback": {"note": f"the user wrote from {SECRET}", "tags": [SECRET]},
            "correction": f"Write to {SECRET} today",
            "metadata": {"reporter": SECRET},
        }
        assert call(gateway.port, "POST", "/reef/feedback", sent).status == 201
        report = {"references": [record_id], "feedback": f"again {SECRET}"}
        assert call(gateway.port, "POST", "/reef/report", report).status == 201
        stored = gateway.store.get_record(record_id).feedback
        assert [f.feedback for f in stored] == [
            {"note": f"the user wrote from {REDACTED}", "tags": [REDACTED]},
            f"again {REDACTED}",
        ]
        assert stored[0].correction == f"Write to {REDACTED} today"
        assert stored[0].metadata == {"reporter": REDACTED}
        listed = call(gateway.port, "GET", "/reef/scenarios/support/feedback").json()
        _nowhere(listed)
