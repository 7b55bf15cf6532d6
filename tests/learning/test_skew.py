"""Train as served: which model learners render the candidate's harness by default, the
trainer's probe (its teacher-forced measure says what greedy decoding says), and the
skew report's threshold and message. The check through a gateway:
tests/e2e/test_train_serve_skew.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from peft import PeftModel

from reef.engine.models import load_model
from reef.harness import Example, Harness
from reef.learning.base import ExperienceBatch, LearnerContext, MetricLog, ProbedPrompt
from reef.learning.learners._served import renders_harness, served_prompt
from reef.learning.learners.preference import as_served
from reef.learning.learners.rl import served_prompts
from reef.learning.skew import MAX_GAP, SkewReport, probe_items
from reef.learning.trainers import Budget, LoraSettings, SFTExample, SFTSpec
from reef.learning.trainers.lora_sft import build_features, train_lora_sft
from reef.learning.trainers.probe import greedy_matches
from reef.learning.trainers.spec import PreferencePair, RLPrompt, UnpairedExample
from tests.fakes.learning import RecordedProgress, ScriptedReflector

pytestmark = pytest.mark.filterwarnings(
    "ignore:.*is_gradient_checkpointing. is deprecated:FutureWarning"
)

TINY = "tiny-random"
TARGET = "Squid-7"
PROMPTS = ["Say hi.", "Name a fruit.", "Best pet?", "A number?", "Up or down?", "Why?"]
DEMO = Example(messages=[{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Yo"}])
HARNESS = Harness(schema_version=1, system_prompt="Route orders.", examples=[DEMO])
SERVED = [
    {"role": "system", "content": "Route orders."},
    {"role": "user", "content": "Hi"},
    {"role": "assistant", "content": "Yo"},
    {"role": "user", "content": "route kiwi"},
]


def _context(mode: Any) -> LearnerContext:
    return LearnerContext(
        scenario="s",
        head=None,  # type: ignore[arg-type]  # renders_harness reads the mode only
        batch=ExperienceBatch(train=[], holdout=[]),
        artifacts=None,  # type: ignore[arg-type]
        home=Path("."),
        work_dir=Path("."),
        reflector=ScriptedReflector(),
        progress=RecordedProgress([]),
        metrics=MetricLog(),
        harness_mode=mode,
    )


@pytest.mark.parametrize(
    ("mode", "setting", "renders"),
    [
        ("managed", None, True),  # the default for a managed scenario: train as served
        ("client", None, False),  # clients send the harness: the records hold it already
        ("managed", False, False),  # explicitly off
        ("client", True, True),
    ],
)
def test_render_harness_defaults_to_the_scenarios_harness_mode(
    mode: str, setting: bool | None, renders: bool
) -> None:
    assert renders_harness(_context(mode), setting) is renders


def test_every_prompt_learner_renders_the_same_served_prompt() -> None:
    asked = [{"role": "user", "content": "route kiwi"}]
    assert served_prompt(HARNESS, asked, []) == (SERVED, [])
    assert served_prompt(None, asked, []) == (asked, [])
    pair = PreferencePair(messages=asked, chosen="ORION", rejected="CEDAR")
    kto = UnpairedExample(messages=asked, target="ORION", desirable=True)
    [served_pair], [served_kto] = as_served(HARNESS, [pair], [kto])
    assert served_pair.messages == SERVED and served_pair.chosen == "ORION"
    assert served_kto.messages == SERVED and served_kto.desirable
    [prompt] = served_prompts(HARNESS, [RLPrompt(messages=asked, reference="ORION")])
    assert prompt.messages == SERVED and prompt.reference == "ORION"


def _spec(tmp_path: Path, steps: int) -> SFTSpec:
    return SFTSpec(
        model=TINY,
        home=tmp_path / "home",
        examples=[
            SFTExample(messages=[{"role": "user", "content": p}], target=TARGET) for p in PROMPTS
        ],
        output_dir=tmp_path / f"adapter-{steps}",
        lora=LoraSettings(target_modules=["q_proj", "v_proj", "lm_head"]),
        lr=1e-2,
        budget=Budget(steps=steps),
        batch_size=8,
        threads=1,
        bf16=False,
        probe_size=4,
    )


def _greedy(model: torch.nn.Module, tokenizer: Any, prompt: str) -> str:
    ids: torch.Tensor = tokenizer.apply_chat_template(
        [{"role": "user", "content": prompt}],
        add_generation_prompt=True,
        return_tensors="pt",
        return_dict=False,
    )
    out = model.generate(  # type: ignore[operator]
        ids, max_new_tokens=len(TARGET) + 4, do_sample=False, pad_token_id=0
    )
    return str(tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True))


@pytest.mark.parametrize("steps", [3, 60])
def test_the_trainers_probe_says_what_greedy_decoding_says(tmp_path: Path, steps: int) -> None:
    result = train_lora_sft(_spec(tmp_path, steps))
    probe = result.metrics["probe"]
    assert len(probe) == 4 and len({index for index, _, _ in probe}) == 4
    loaded = load_model(TINY, tmp_path)
    model = PeftModel.from_pretrained(loaded.model, str(result.adapter_dir)).eval()
    for index, matched, length in probe:
        assert (_greedy(model, loaded.tokenizer, PROMPTS[index]) == TARGET) is matched
        assert length == len(TARGET) + 1  # a byte a token, then the end of turn
    if steps == 60:  # fitted: every probed prompt says the target
        assert all(matched for _, matched, _ in probe), probe


def test_an_untrained_model_matches_no_target(tmp_path: Path) -> None:
    loaded = load_model(TINY, tmp_path)
    example = SFTExample(messages=[{"role": "user", "content": "Say hi."}], target=TARGET)
    features = build_features(loaded.tokenizer, example, 512)
    rows = [(features.input_ids, features.labels)]
    [(matched, length)] = greedy_matches(
        loaded.model, rows, loaded.eos_token_ids, torch.device("cpu")
    )
    assert not matched and length == len(TARGET) + 1


@pytest.mark.parametrize(
    ("trained", "served", "skewed"),
    [
        (1.0, 0.25, True),
        (0.875, 0.25, True),
        (1.0, 0.5, False),  # within MAX_GAP
        (0.5, 0.0, False),  # the trainer did not fit: the gate judges it
        (1.0, None, False),  # no answer came back: nothing to compare
    ],
)
def test_skew_needs_a_fitted_trainer_and_a_wide_gap(
    trained: float, served: float | None, skewed: bool
) -> None:
    assert SkewReport(trained, served, 8, 0).skewed is skewed


def test_the_skew_message_gives_both_figures_and_the_setting() -> None:
    report = SkewReport(1.0, 0.125, 8, 0)
    assert report.skewed and MAX_GAP == 0.5
    message = report.message()
    assert message.startswith("train/serve skew:")
    assert "100%" in message and "12%" in message and "render_harness" in message
    assert report.as_dict() == {
        "trained_accuracy": 1.0,
        "served_accuracy": 0.125,
        "prompts": 8,
        "errors": 0,
        "skewed": True,
    }


def test_probe_items_are_greedy_with_room_for_the_target() -> None:
    asked = [{"role": "user", "content": "route kiwi"}]
    [item] = probe_items([ProbedPrompt(asked, "ORION", True, 6)])
    assert item.messages == asked and item.reference == "ORION"
    assert item.params["temperature"] == 0.0 and item.params["max_tokens"] > 6
