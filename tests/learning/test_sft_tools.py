"""`sft` on tool-using trajectories (issue 13 item 4): a turn is trained as the engine
serves it — the tools offered, earlier calls and results — with a reply that may itself
be tool calls in the engine's format; loss on the reply only; long trajectories lose
whole early turns, never part of one."""

from __future__ import annotations

from typing import Any

import pytest

from reef.core.chat_format import AUTO, parse_tool_calls
from reef.engine.models import LoadedModel, load_model
from reef.engine.runtime import Engine
from reef.learning.base import TrainingExample
from reef.learning.learners.sft import sft_examples
from reef.learning.trainers import SFTExample
from reef.learning.trainers.lora_sft import IGNORE_INDEX, build_features

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}
ASKED = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Weather?"}]
CALL = {"name": "get_weather", "arguments": '{"city":"Rome"}'}  # canonical form


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> LoadedModel:
    return load_model("tiny-random", tmp_path_factory.mktemp("tiny"))


def example(**changes: Any) -> TrainingExample:
    fields: dict[str, Any] = {
        "record_id": "r1", "scenario": "s", "session_id": "s1", "messages": ASKED,
        "response": {"role": "assistant", "content": "sunny"}, "score": 0.0,
        "correction": {"role": "assistant", "tool_calls": [CALL]}, "feedback": [],
        "principals": [None], "release_id": None, "staleness": 0, "content_hash": "h",
        "tools": (WEATHER,),
    }  # fmt: skip
    fields.update(changes)
    return TrainingExample(**fields)


def labelled_text(loaded: LoadedModel, ids: list[int], labels: list[int]) -> str:
    kept = [token for token, label in zip(ids, labels, strict=True) if label != IGNORE_INDEX]
    return str(loaded.tokenizer.decode(kept, skip_special_tokens=True))


def test_a_tool_call_correction_trains_the_call_as_the_engine_parses_it(
    tiny: LoadedModel,
) -> None:
    ((sft,), used) = sft_examples([example()], min_score=1.0)
    assert used == ["r1"] and sft.tools == [WEATHER]
    assert (
        sft.target
        == '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome"}}\n</tool_call>'
    )
    # what the trained model should generate is what the engine turns back into the call
    parsed = parse_tool_calls(sft.target, frozenset({"get_weather"}))
    assert [(c.name, c.arguments) for c in parsed.calls] == [("get_weather", '{"city": "Rome"}')]
    features = build_features(tiny.tokenizer, sft, max_seq_len=1024)
    assert labelled_text(tiny, features.input_ids, features.labels).strip() == sft.target
    # the prompt is the one the engine builds for this request: same tokens
    served, _ = Engine(tiny, threads=1).encode_tool_chat(list(ASKED), [WEATHER], AUTO)
    assert features.input_ids[: len(served)] == served


def test_earlier_calls_and_results_render_as_served(tiny: LoadedModel) -> None:
    history = [
        *ASKED,
        {"role": "assistant", "tool_calls": [CALL]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21 C"},
    ]
    item = example(messages=history, correction="Sunny and 21 C in Rome.", score=0.0)
    ((sft,), _) = sft_examples([item], min_score=1.0)
    assert sft.target == "Sunny and 21 C in Rome."
    assert sft.messages[2]["tool_calls"][0]["function"]["name"] == "get_weather"
    features = build_features(tiny.tokenizer, sft, max_seq_len=1024)
    engine_messages = [dict(m) for m in sft.messages]
    served, _ = Engine(tiny, threads=1).encode_tool_chat(engine_messages, [WEATHER], AUTO)
    assert features.input_ids[: len(served)] == served
    prompt = tiny.tokenizer.decode(served)
    assert "<tool_response>\nsunny, 21 C\n</tool_response>" in prompt
    assert '"name": "get_weather"' in prompt  # the earlier call, as a <tool_call> block


def test_a_served_reply_with_calls_trains_when_its_score_is_good() -> None:
    served = {"role": "assistant", "tool_calls": [CALL]}
    ((sft,), _) = sft_examples([example(correction=None, response=served, score=1.0)], 1.0)
    assert sft.target.startswith("<tool_call>") and "Rome" in sft.target
    assert sft_examples([example(correction=None, response=served, score=0.0)], 1.0) == ([], [])


def test_text_only_examples_are_unchanged(tiny: LoadedModel) -> None:
    plain = example(tools=(), correction="Rome", messages=[{"role": "user", "content": "Capital?"}])
    ((sft,), _) = sft_examples([plain], 1.0)
    assert sft.tools == [] and sft.messages == [{"role": "user", "content": "Capital?"}]
    features = build_features(tiny.tokenizer, sft, max_seq_len=1024)
    assert labelled_text(tiny, features.input_ids, features.labels).strip() == "Rome"


def test_a_long_trajectory_loses_whole_early_turns(tiny: LoadedModel) -> None:
    turns: list[dict[str, Any]] = [{"role": "system", "content": "Be brief."}]
    for n in range(6):
        turns += [
            {"role": "user", "content": f"question number {n} " + "padding " * 20},
            {"role": "assistant", "content": f"answer {n}"},
        ]
    turns.append({"role": "user", "content": "last question"})
    sft = SFTExample(messages=turns, target="final answer")
    whole = build_features(tiny.tokenizer, sft, max_seq_len=4096)
    cut = build_features(tiny.tokenizer, sft, max_seq_len=len(whole.input_ids) - 10)
    text = str(tiny.tokenizer.decode(cut.input_ids))
    assert "Be brief." in text and "last question" in text  # the system and the last turn
    assert "question number 0" not in text  # dropped whole ...
    kept = [n for n in range(6) if f"question number {n}" in text]
    assert kept and all(f"answer {n}" in text for n in kept)  # ... never half a turn
    assert labelled_text(tiny, cut.input_ids, cut.labels).strip() == "final answer"
    assert len(cut.input_ids) <= len(whole.input_ids) - 10
