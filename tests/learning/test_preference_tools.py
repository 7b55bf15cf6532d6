"""`preference` on tool-using trajectories (issue 13 item 4): turns of failed and
successful branches pair at the same whole prefix (earlier calls, tool results, tools
offered), a correction made of tool calls is chosen over the served turn, and the
trainer renders both sides as the engine serves them — long prompts lose whole early
turns, never part of one, and no reply is ever truncated."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from peft import PeftModel

from reef.core.chat_format import AUTO, format_tool_call, parse_tool_calls
from reef.engine.models import LoadedModel, load_model
from reef.engine.runtime import Engine
from reef.learning.base import TrainingExample
from reef.learning.learners._examples import tool_messages
from reef.learning.learners.preference import preference_pairs, unpaired_examples
from reef.learning.trainers import Budget
from reef.learning.trainers.lora_sft import IGNORE_INDEX, Features, collate
from reef.learning.trainers.preference import prompt_features, sequence_logps, train_preference
from reef.learning.trainers.spec import LoraSettings, PreferencePair, PreferenceSpec

# PEFT 0.21 reads a deprecated transformers property while wrapping a model.
pytestmark = pytest.mark.filterwarnings(
    "ignore:.*is_gradient_checkpointing. is deprecated:FutureWarning"
)

TINY = "tiny-random"


def tool(name: str, description: str) -> dict[str, Any]:
    parameters = {"type": "object", "properties": {"city": {"type": "string"}}}
    return {
        "type": "function",
        "function": {"name": name, "description": description, "parameters": parameters},
    }


WEATHER, FORECAST = tool("get_weather", "Weather now."), tool("get_forecast", "Tomorrow.")
TOOLS = (WEATHER, FORECAST)
ASKED = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Will it rain in Rome tomorrow?"},
]


def call(name: str, city: str, call_id: str | None = None) -> dict[str, Any]:
    """A canonical tool call (as records hold them)."""
    found = {"name": name, "arguments": f'{{"city":"{city}"}}'}
    return {"id": call_id, **found} if call_id else found


def history(result: str, call_id: str = "call_a") -> list[dict[str, Any]]:
    """The prefix of the trajectory's second turn: the first call and its result."""
    return [
        *ASKED,
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [call("get_weather", "Rome", call_id)],
        },
        {"role": "tool", "tool_call_id": call_id, "content": result},
    ]


def turn(
    record_id: str, messages: list[dict[str, Any]], reply: Any, **changes: Any
) -> TrainingExample:
    response = reply if isinstance(reply, dict) else {"role": "assistant", "content": reply}
    fields: dict[str, Any] = {
        "record_id": record_id, "scenario": "s", "session_id": f"sess-{record_id}",
        "messages": messages, "response": response, "score": None, "correction": None,
        "feedback": [], "principals": [None], "release_id": None, "staleness": 0,
        "content_hash": record_id, "tools": TOOLS,
    }  # fmt: skip
    fields.update(changes)
    return TrainingExample(**fields)


def calls(*found: dict[str, Any]) -> dict[str, Any]:
    return {"role": "assistant", "content": None, "tool_calls": list(found)}


def text_of(name: str, city: str) -> str:
    """A call as the engine's format writes it (what the model should generate)."""
    return format_tool_call(name, {"city": city})


# --- pairing (torch-free) -------------------------------------------------------


def test_failed_and_successful_branches_pair_at_one_prefix() -> None:
    # Two sessions ran the same first call and got the same result (their call ids
    # differ, as fresh engine ids do); one branch then asked the forecast and
    # succeeded, the other asked the weather again and failed.
    good = turn("ok", history("sunny", "call_a"), calls(call("get_forecast", "Rome")), score=1.0)
    bad = turn("fail", history("sunny", "call_z"), calls(call("get_weather", "Rome")), score=0.0)
    pairs, used = preference_pairs([bad, good])
    assert used == ["fail", "ok"]
    (pair,) = pairs
    assert pair.chosen == text_of("get_forecast", "Rome")
    assert pair.rejected == text_of("get_weather", "Rome")
    assert pair.tools == list(TOOLS)
    # the whole prefix travels with the pair: the earlier call and its result
    assert pair.messages[2]["tool_calls"][0]["function"]["name"] == "get_weather"
    assert pair.messages[3] == {"role": "tool", "content": "sunny", "tool_call_id": "call_a"}
    parsed = parse_tool_calls(pair.chosen, frozenset({"get_forecast"}))
    assert [(c.name, c.arguments) for c in parsed.calls] == [("get_forecast", '{"city": "Rome"}')]


def test_a_mid_score_branch_sits_between_and_equal_scores_do_not_pair() -> None:
    prefix = history("sunny")
    good = turn("ok", prefix, calls(call("get_forecast", "Rome")), score=1.0)
    half = turn("half", prefix, "Probably not.", score=0.5)
    also = turn("also", prefix, calls(call("get_weather", "Milan")), score=0.5)
    pairs, _ = preference_pairs([good, half, also])
    assert [(p.chosen, p.rejected) for p in pairs] == [
        (text_of("get_forecast", "Rome"), "Probably not."),
        (text_of("get_forecast", "Rome"), text_of("get_weather", "Milan")),
    ]


def test_a_tool_call_correction_is_chosen_over_the_served_turn() -> None:
    fixed = calls(call("get_forecast", "Rome"))
    served_text = turn("t", ASKED, "It will not rain.", score=0.0, correction=fixed)
    served_call = turn(
        "c", history("sunny"), calls(call("get_weather", "Rome")), correction="No rain."
    )
    pairs, used = preference_pairs([served_text, served_call])
    assert used == ["t", "c"]
    assert [(p.chosen, p.rejected) for p in pairs] == [
        (text_of("get_forecast", "Rome"), "It will not rain."),
        ("No rain.", text_of("get_weather", "Rome")),
    ]
    assert all(p.tools == list(TOOLS) for p in pairs)


def test_a_failed_branch_is_rejected_against_a_corrected_turn_at_its_prefix() -> None:
    prefix, fix = history("sunny"), calls(call("get_forecast", "Rome"))
    corrected = turn("a", prefix, calls(call("get_weather", "Rome")), score=0.0, correction=fix)
    failed = turn("b", prefix, "No idea.", score=0.0)
    fine = turn("c", prefix, "Rain is unlikely.", score=1.0)  # better: not rejected vs fix
    pairs, used = preference_pairs([corrected, failed, fine])
    forecast, weather = text_of("get_forecast", "Rome"), text_of("get_weather", "Rome")
    assert [(p.chosen, p.rejected) for p in pairs] == [
        (forecast, weather),
        (forecast, "No idea."),  # the failed branch against the correction
        ("Rain is unlikely.", weather),
        ("Rain is unlikely.", "No idea."),
    ]
    assert used == ["a", "b", "c"]
    # text-only items pair as they always did: a correction only over its own reply
    plain = [{"role": "user", "content": "Rain?"}]
    texts = [
        turn("a", plain, "Yes.", score=0.0, correction="No.", tools=()),
        turn("b", plain, "Maybe.", score=0.0, tools=()),
        turn("c", plain, "Unlikely.", score=1.0, tools=()),
    ]
    assert [(p.chosen, p.rejected) for p in preference_pairs(texts)[0]] == [
        ("No.", "Yes."),
        ("Unlikely.", "Yes."),
        ("Unlikely.", "Maybe."),
    ]


def test_no_pair_across_different_prefixes() -> None:
    sunny = turn("a", history("sunny"), calls(call("get_forecast", "Rome")), score=1.0)
    rainy = turn("b", history("rainy"), "Take an umbrella.", score=0.0)  # another result
    other_tools = turn("c", history("sunny"), "No idea.", score=0.0, tools=(WEATHER,))
    rerouted = history("sunny")
    rerouted[2] = calls(call("get_weather", "Milan", "call_a"))  # another earlier call
    moved = turn("d", rerouted, "Dry.", score=0.0)
    assert preference_pairs([sunny, rainy, other_tools, moved]) == ([], [])


def test_text_only_pairs_carry_no_tools() -> None:
    plain = [{"role": "user", "content": "Sky?"}]
    pairs, _ = preference_pairs(
        [
            turn("g", plain, "Blue.", score=1.0, tools=()),
            turn("b", plain, "Green.", score=0.0, tools=()),
        ]
    )
    assert [(p.chosen, p.rejected, p.tools, p.messages) for p in pairs] == [
        ("Blue.", "Green.", [], plain)
    ]


def test_kto_examples_keep_the_calls_and_the_tools() -> None:
    good = turn("ok", history("sunny"), calls(call("get_forecast", "Rome")), score=1.0)
    bad = turn("no", history("sunny"), calls(call("get_weather", "Rome")), score=0.0)
    examples, used = unpaired_examples([good, bad], good_score=1.0, bad_score=0.0)
    assert used == ["ok", "no"]
    assert [(e.target, e.desirable) for e in examples] == [
        (text_of("get_forecast", "Rome"), True),
        (text_of("get_weather", "Rome"), False),
    ]
    assert all(e.tools == list(TOOLS) and e.messages[3]["role"] == "tool" for e in examples)


# --- tokenisation on tiny-random ----------------------------------------------


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> LoadedModel:
    return load_model(TINY, tmp_path_factory.mktemp("tiny"))


def reply_ids(features: Features) -> list[int]:
    return [
        t
        for t, label in zip(features.input_ids, features.labels, strict=True)
        if label != IGNORE_INDEX
    ]


def test_the_chosen_call_is_tokenised_as_the_engine_serves_and_parses_it(
    tiny: LoadedModel,
) -> None:
    good = turn("ok", history("sunny"), calls(call("get_forecast", "Rome")), score=1.0)
    bad = turn("no", history("sunny"), calls(call("get_weather", "Rome")), score=0.0)
    ((pair,), _) = preference_pairs([good, bad])
    found = prompt_features(
        tiny.tokenizer, pair.messages, pair.tools, [pair.chosen, pair.rejected], 1024
    )
    assert not isinstance(found, str)
    chosen, rejected = found
    # the prompt: the very tokens the engine builds for this request (tools, the
    # earlier call and its result), the same for both sides
    served, _ = Engine(tiny, threads=1).encode_tool_chat(
        [dict(m) for m in pair.messages], list(TOOLS), AUTO
    )
    assert chosen.input_ids[: len(served)] == served == rejected.input_ids[: len(served)]
    assert chosen.labels[: len(served)] == [IGNORE_INDEX] * len(served)
    # the completion: the tokens of the call in the engine's format, then the end of
    # the turn; decoded, the engine's parser reads the call back
    call_ids = tiny.tokenizer.encode(text_of("get_forecast", "Rome"), add_special_tokens=False)
    labelled = reply_ids(chosen)
    assert labelled[: len(call_ids)] == call_ids
    assert tiny.tokenizer.decode(labelled[len(call_ids) :]).strip() == "<|im_end|>"
    generated = str(tiny.tokenizer.decode(labelled, skip_special_tokens=True))
    parsed = parse_tool_calls(generated, frozenset({"get_weather", "get_forecast"}))
    assert [(c.name, c.arguments) for c in parsed.calls] == [("get_forecast", '{"city": "Rome"}')]
    assert parsed.content == ""


def long_trajectory() -> list[dict[str, Any]]:
    """Five whole turns (question, call, result, answer) and a last question, in the
    trainer's form (as the learner hands it over)."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": "Be brief."}]
    for n in range(5):
        call_id = f"call_{n}"
        messages += [
            {"role": "user", "content": f"question number {n} " + "padding " * 20},
            calls(call("get_weather", f"City{n}", call_id)),
            {"role": "tool", "tool_call_id": call_id, "content": f"result {n}"},
            {"role": "assistant", "content": f"answer {n}"},
        ]
    messages.append({"role": "user", "content": "last question"})
    return tool_messages(messages)


def test_a_long_prompt_loses_whole_early_turns_and_both_sides_keep_one_prompt(
    tiny: LoadedModel,
) -> None:
    chosen, rejected = text_of("get_forecast", "Rome"), "I cannot tell, sorry, " * 3
    messages = long_trajectory()
    whole = prompt_features(tiny.tokenizer, messages, list(TOOLS), [chosen, rejected], 4096)
    assert not isinstance(whole, str)
    limit = max(len(f.input_ids) for f in whole) - 10
    cut = prompt_features(tiny.tokenizer, messages, list(TOOLS), [chosen, rejected], limit)
    assert not isinstance(cut, str)
    assert all(len(f.input_ids) <= limit for f in cut)
    texts = [str(tiny.tokenizer.decode(f.input_ids)) for f in cut]
    for text in texts:
        assert "Be brief." in text and "get_forecast" in text  # system and tool prompt stay
        assert "last question" in text and "question number 0" not in text
        kept = [n for n in range(5) if f"question number {n}" in text]
        assert kept  # only the first turn went; every kept turn is whole
        assert all(
            f"City{n}" in text and f"result {n}" in text and f"answer {n}" in text for n in kept
        )
        assert "City0" not in text and "result 0" not in text and "answer 0" not in text
    # one prompt for both sides; each completion whole
    prompt_of = [
        f.input_ids[: f.labels.index(next(x for x in f.labels if x != IGNORE_INDEX))] for f in cut
    ]
    assert prompt_of[0] == prompt_of[1]
    decoded = [
        str(tiny.tokenizer.decode(reply_ids(f), skip_special_tokens=True)).strip() for f in cut
    ]
    assert decoded == [chosen, rejected.strip()]


def test_a_reply_too_long_is_skipped_with_a_reason_never_cut(tiny: LoadedModel) -> None:
    huge = "word " * 400
    found = prompt_features(tiny.tokenizer, long_trajectory(), list(TOOLS), ["ok", huge], 256)
    assert isinstance(found, str) and "a reply alone is" in found and "256" in found
    # the last turn alone (its tool prompt, question and reply) does not fit either
    only = [{"role": "user", "content": "padding " * 300}]
    found = prompt_features(tiny.tokenizer, only, [], ["ok", "no"], 64)
    assert isinstance(found, str) and "no earlier turn is left" in found


def pairs_spec(tmp_path: Path, pairs: list[PreferencePair], **changes: Any) -> PreferenceSpec:
    base = PreferenceSpec(
        objective="dpo",
        model=TINY,
        home=tmp_path / "home",
        pairs=pairs,
        output_dir=tmp_path / "adapter",
        lora=LoraSettings(target_modules=["q_proj", "v_proj", "lm_head"]),
        lr=1e-2,
        budget=Budget(steps=12),
        batch_size=4,
        max_seq_len=1024,
        seed=0,
        threads=1,
    )
    return base.model_copy(update=changes)


CITIES = ["Rome", "Oslo", "Lima", "Kyiv"]


def city_pairs() -> list[PreferencePair]:
    """Per city: after the weather call and its result, the forecast call (the
    successful branch) over the weather call again (the failed one)."""
    pairs = []
    for city in CITIES:
        messages = tool_messages(
            [
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": f"Will it rain in {city} tomorrow?"},
                calls(call("get_weather", city, "c1")),
                {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
            ]
        )
        pairs.append(
            PreferencePair(
                messages=messages,
                chosen=text_of("get_forecast", city),
                rejected=text_of("get_weather", city),
                tools=list(TOOLS),
            )
        )
    return pairs


def margins(
    tmp_path: Path, adapter: Path, pairs: list[PreferencePair]
) -> tuple[torch.Tensor, torch.Tensor]:
    """(before, after): per pair, log p(chosen) - log p(rejected) under the base model
    and under the trained adapter, measured with PEFT directly."""
    loaded = load_model(TINY, tmp_path / "home")
    model = PeftModel.from_pretrained(loaded.model, str(adapter)).eval()
    features: list[Features] = []
    for pair in pairs:
        found = prompt_features(
            loaded.tokenizer, pair.messages, pair.tools, [pair.chosen, pair.rejected], 1024
        )
        assert not isinstance(found, str)
        features.extend(found)
    batch = collate(features, 0, torch.device("cpu"))
    with torch.no_grad():
        after = sequence_logps(model, batch)
        with model.disable_adapter():
            before = sequence_logps(model, batch)
    return before[0::2] - before[1::2], after[0::2] - after[1::2]


def test_dpo_on_tool_call_pairs_raises_the_chosen_calls_margin(tmp_path: Path) -> None:
    pairs = city_pairs()
    result = train_preference(pairs_spec(tmp_path, pairs))
    metrics = result.metrics
    assert metrics["skipped"] == [] and len(metrics["loss_curve"]) == 12
    assert metrics["loss_curve"][-1] < metrics["loss_curve"][0]
    before, after = margins(tmp_path, result.adapter_dir, pairs)
    # the base model barely tells the calls apart; trained, every pair's margin grows
    assert float(after.mean()) > float(before.mean()) + 10.0
    assert bool(((after - before) > 0).all())


def test_the_trainer_skips_a_pair_that_cannot_fit_and_fails_when_none_can(
    tmp_path: Path,
) -> None:
    pairs = city_pairs()
    too_long = pairs[0].model_copy(update={"rejected": "word " * 1200})
    result = train_preference(
        pairs_spec(tmp_path, [*pairs[1:], too_long], max_seq_len=1024, budget=Budget(steps=1))
    )
    (skipped,) = result.metrics["skipped"]
    assert skipped["index"] == 3 and "a reply alone is" in skipped["reason"]
    assert result.metrics["pairs"] == 4 and result.metrics["train_items"] == 3
    with pytest.raises(ValueError, match="no pair fits max_seq_len 1024"):
        train_preference(
            pairs_spec(tmp_path, [too_long], max_seq_len=1024, output_dir=tmp_path / "b")
        )
