"""Comparing a server's answers with a fingerprint: token ids, text when there are none,
logprobs within the dtype's tolerance, the end of turn, and near ties; whether a
fingerprint can tell its adapter from the base model; files made before the base fields."""

from __future__ import annotations

import json
from pathlib import Path

from reef.releases import (
    FINGERPRINT_FILE,
    Fingerprint,
    FingerprintProbe,
    ProbeAnswer,
    compare_fingerprint,
    distinguishes_base,
    parse_probe_answer,
    probe_request,
    read_fingerprint,
    serving_tolerance,
)


def _fingerprint(margins: list[float] | None = None, ended: bool = True) -> Fingerprint:
    probe = FingerprintProbe(
        messages=[{"role": "user", "content": "q"}],
        tokens=[5, 6, 7],
        text="abc",
        logprobs=[-0.1, -0.2, -0.3],
        margins=margins or [2.0, 2.0, 2.0],
        ended=ended,
    )
    return Fingerprint(dtype="float32", max_new_tokens=16, probes=[probe])


def _answer(
    tokens: list[int] | None, logprobs: list[float] | None, finish: str = "stop"
) -> ProbeAnswer:
    return ProbeAnswer(tokens=tokens, text="abc", logprobs=logprobs, finish_reason=finish)


def test_the_same_answer_agrees_and_the_request_asks_for_the_end_of_turn() -> None:
    fingerprint = _fingerprint()
    assert probe_request(fingerprint.probes[0], "m")["max_tokens"] == 4
    assert compare_fingerprint(fingerprint, [_answer([5, 6, 7], [-0.1, -0.2, -0.3])]) is None
    assert compare_fingerprint(fingerprint, [_answer([5, 6, 7], [-0.1, -0.205, -0.3])]) is None


def test_a_token_a_logprob_or_a_missing_end_is_a_mismatch() -> None:
    fingerprint = _fingerprint()
    token = compare_fingerprint(fingerprint, [_answer([5, 9, 7], None)])
    assert token is not None and token.describe() == (
        "probe 0 differs at token 1: expected token 6, got token 9"
    )
    logprob = compare_fingerprint(fingerprint, [_answer([5, 6, 7], [-0.1, -0.2, -0.5])])
    assert logprob is not None and logprob.position == 2 and "0.2000 > 0.01" in logprob.got
    longer = compare_fingerprint(fingerprint, [_answer([5, 6, 7, 8], None, "length")])
    assert longer is not None and longer.expected == "the end of turn"
    shorter = compare_fingerprint(fingerprint, [_answer([5, 6], None)])
    assert shorter is not None and "the answer ended" in shorter.got


def test_a_server_in_a_looser_precision_is_held_to_that_precision() -> None:
    # The trainer fingerprints in float32; an engine serving bfloat16 answers the same
    # weights about 0.014 away (the quickstart's tiny model), past float32's 0.01.
    fingerprint = _fingerprint()
    answer = [_answer([5, 6, 7], [-0.1, -0.214, -0.3])]
    assert compare_fingerprint(fingerprint, answer, serving_tolerance(fingerprint, None))
    for served in ("bfloat16", "int8", "auto"):
        tolerance = serving_tolerance(fingerprint, served)
        assert compare_fingerprint(fingerprint, answer, tolerance) is None
    assert serving_tolerance(fingerprint, "float32") == 0.01
    wrong = [_answer([5, 9, 7], [-0.1, -0.2, -0.3])]  # another token is still caught
    assert compare_fingerprint(fingerprint, wrong, serving_tolerance(fingerprint, "bfloat16"))


def test_text_is_compared_when_the_server_returns_no_ids() -> None:
    fingerprint = _fingerprint()
    same = ProbeAnswer(tokens=None, text="abc", logprobs=None, finish_reason="stop")
    other = ProbeAnswer(tokens=None, text="abd", logprobs=None, finish_reason="stop")
    assert compare_fingerprint(fingerprint, [same]) is None
    found = compare_fingerprint(fingerprint, [other])
    assert found is not None and found.position == 2
    assert found.describe() == "probe 0 differs at character 2: expected 'abc', got 'abd'"


def test_a_near_tie_ends_the_comparison_instead_of_failing() -> None:
    fingerprint = _fingerprint(margins=[2.0, 0.001, 2.0])
    assert compare_fingerprint(fingerprint, [_answer([5, 9, 1], None)]) is None
    assert compare_fingerprint(fingerprint, [_answer([4, 6, 7], None)]) is not None


def test_a_chat_completion_body_parses() -> None:
    body = {
        "choices": [
            {
                "message": {"content": "abc"},
                "token_ids": [5, 6, 7],
                "logprobs": {"content": [{"logprob": -0.1}, {"logprob": -0.2}]},
                "finish_reason": "stop",
            }
        ]
    }
    assert parse_probe_answer(body) == ProbeAnswer([5, 6, 7], "abc", [-0.1, -0.2], "stop")


def test_whether_a_fingerprint_tells_the_base_apart_depends_on_the_tolerance() -> None:
    plain = _fingerprint()
    assert distinguishes_base(plain, 1.0) is None  # a checkpoint, or not recorded
    near = plain.model_copy(update={"base_gap": 0.31, "base_differs": False})
    assert distinguishes_base(near, 1.0) is False
    assert distinguishes_base(near, 0.1) is True
    assert distinguishes_base(near.model_copy(update={"base_differs": True}), 1.0) is True


def test_a_fingerprint_written_before_the_base_fields_loads_and_keeps_its_bytes(
    tmp_path: Path,
) -> None:
    old = {
        "schema_version": 1,
        "dtype": "float32",
        "max_new_tokens": 16,
        "probes": [_fingerprint().probes[0].model_dump(mode="json")],
    }
    text = json.dumps(old, sort_keys=True, indent=1) + "\n"
    (tmp_path / FINGERPRINT_FILE).write_text(text)
    loaded = read_fingerprint(tmp_path)
    assert loaded is not None
    assert (loaded.base_gap, loaded.base_differs) == (None, None)
    loaded.write(tmp_path)  # the same bytes, so the same artifact digest
    assert (tmp_path / FINGERPRINT_FILE).read_text() == text

    recorded = loaded.model_copy(update={"base_gap": 0.5, "base_differs": True})
    recorded.write(tmp_path)
    assert read_fingerprint(tmp_path) == recorded
