"""Redaction of captured values."""

from __future__ import annotations

import dataclasses

import pytest

from reef.core.errors import InvalidInputError
from reef.experience import REDACTED, FeedbackDraft, Redactor, StoredResponse
from tests.experience.conftest import DraftFactory

EMAIL = r"[\w.+-]+@[\w-]+\.[\w.]+"
CARD = r"\b\d{4}(?:[ -]?\d{4}){3}\b"


def test_every_string_is_scrubbed_and_keys_are_kept() -> None:
    redactor = Redactor([EMAIL, CARD])
    value = {
        "messages": [
            {"role": "user", "content": "mail me at ann@example.com, card 4111 1111 1111 1111"},
            {"role": "assistant", "content": ["nested bob@example.org", 3, None, True]},
        ],
        "carol@example.net": "the key is not content",
        "temperature": 0.5,
    }
    out = redactor.redact(value)
    assert out == {
        "messages": [
            {"role": "user", "content": f"mail me at {REDACTED}, card {REDACTED}"},
            {"role": "assistant", "content": [f"nested {REDACTED}", 3, None, True]},
        ],
        "carol@example.net": "the key is not content",
        "temperature": 0.5,
    }
    # A copy: the input is untouched.
    assert value["messages"][0]["content"].startswith("mail me at ann@")  # type: ignore[index]


def test_no_patterns_returns_the_value_itself() -> None:
    value = {"a": ["secret"]}
    redactor = Redactor([])
    assert not redactor.active
    assert redactor.redact(value) is value


def test_replacement_is_not_matched_again_by_a_later_pattern() -> None:
    redactor = Redactor(["secret", "RED"])
    assert redactor.redact("a secret RED") == f"a {REDACTED} {REDACTED}"


def test_patterns_with_groups_and_global_flags_still_work() -> None:
    redactor = Redactor([r"(\w)\1{2}", "(?i)token"])
    assert redactor.redact_text("aaa TOKEN b") == f"{REDACTED} {REDACTED} b"


def test_invalid_pattern_is_invalid_input() -> None:
    with pytest.raises(InvalidInputError, match="pattern"):
        Redactor(["(unclosed"])


def test_redact_draft_scrubs_request_response_and_error(make_draft: DraftFactory) -> None:
    draft = make_draft(
        request={"messages": [{"role": "user", "content": "I am ann@example.com"}]},
        response={"text": "hello ann@example.com"},
        error="failed for ann@example.com",
    )
    kept = StoredResponse(
        id="resp_1",
        scenario="support",
        session_id="s",
        record_id=draft.id,
        previous_response_id=None,
        principal="app",
        input_items=[{"type": "message", "content": "from ann@example.com"}],
        response={"output": [{"content": [{"text": "hi ann@example.com"}]}]},
    )
    draft = dataclasses.replace(
        draft,
        rendered_request={"messages": [{"role": "user", "content": "ann@example.com"}]},
        tags={"customer": "ann@example.com"},
        kept_response=kept,
    )
    out = Redactor([EMAIL]).redact_draft(draft)
    assert out.request == {"messages": [{"role": "user", "content": f"I am {REDACTED}"}]}
    assert out.response == {"text": f"hello {REDACTED}"}
    assert out.error == f"failed for {REDACTED}"
    assert out.rendered_request == {"messages": [{"role": "user", "content": REDACTED}]}
    assert out.tags == {"customer": REDACTED}
    assert out.kept_response is not None
    assert out.kept_response.input_items == [{"type": "message", "content": f"from {REDACTED}"}]
    assert out.kept_response.response == {"output": [{"content": [{"text": f"hi {REDACTED}"}]}]}
    assert (out.id, out.prompt_hash) == (draft.id, draft.prompt_hash)


def test_redact_feedback_scrubs_text_correction_and_metadata() -> None:
    draft = FeedbackDraft(
        scenario="support",
        record_ids=("r",),
        score=1.0,
        feedback={"note": "ann@example.com"},
        correction={"content": "write ann@example.com", "tool_calls": []},
        metadata={"by": "ann@example.com"},
        principal="ann@example.com",  # a key id: an identifier, left alone
        idempotency_key="k",
    )
    out = Redactor([EMAIL]).redact_feedback(draft)
    assert out.feedback == {"note": REDACTED}
    assert out.correction == {"content": f"write {REDACTED}", "tool_calls": []}
    assert out.metadata == {"by": REDACTED}
    assert out.principal == "ann@example.com"
