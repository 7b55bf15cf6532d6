"""SmolLM2-135M: ``sft`` on corrections for a small labelled task (is the word an
animal or a fruit, answered in one upper-case word) lifts held-out accuracy well above
the base model's. Slow: a couple of minutes on 2 cores."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from peft import PeftModel

from reef.core import SilentProgress
from reef.engine.models import DEFAULT_MODEL, LoadedModel, load_model, smollm2_cache
from reef.learning.base import ExperienceBatch, LearnerContext, MetricLog, TrainingExample
from reef.learning.learners.sft import SFTConfig, SFTLearner
from reef.releases import ModelComponent, ReleaseChain, ReleaseManifest, open_artifact_store
from tests.fakes.learning import ScriptedReflector

pytestmark = [
    pytest.mark.slow,
    # PEFT 0.21 reads a deprecated transformers property while wrapping a model.
    pytest.mark.filterwarnings("ignore:.*is_gradient_checkpointing. is deprecated:FutureWarning"),
]

TRAIN = {
    "apple": "FRUIT", "cat": "ANIMAL", "banana": "FRUIT", "horse": "ANIMAL",
    "cherry": "FRUIT", "rabbit": "ANIMAL", "grape": "FRUIT", "tiger": "ANIMAL",
    "lemon": "FRUIT", "sheep": "ANIMAL", "peach": "FRUIT", "wolf": "ANIMAL",
}  # fmt: skip
HELD_OUT = {
    "mango": "FRUIT", "lion": "ANIMAL", "pear": "FRUIT", "zebra": "ANIMAL",
    "plum": "FRUIT", "camel": "ANIMAL", "orange": "FRUIT", "mouse": "ANIMAL",
}  # fmt: skip


def ask(word: str) -> list[dict[str, Any]]:
    return [{"role": "user", "content": f"Is '{word}' an animal or a fruit? One word."}]


def item(word: str, label: str) -> TrainingExample:
    return TrainingExample(
        record_id=word, scenario="words", session_id=word, messages=ask(word),
        response={"role": "assistant", "content": f"'{word}' is a kind of thing."},
        score=0.0, correction=label, feedback=[], principals=[None], release_id=None,
        staleness=0, content_hash=word,
    )  # fmt: skip


def accuracy(loaded: LoadedModel, model: Any) -> float:
    right = 0
    for word, label in HELD_OUT.items():
        ids: torch.Tensor = loaded.tokenizer.apply_chat_template(  # type: ignore[assignment]
            ask(word), add_generation_prompt=True, return_tensors="pt", return_dict=False
        )
        out = model.generate(ids, max_new_tokens=4, do_sample=False)
        text = str(loaded.tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True))
        right += text.strip() == label
    return right / len(HELD_OUT)


def test_sft_on_corrections_lifts_held_out_accuracy(tmp_path: Path) -> None:
    home = tmp_path / "home"
    smollm2_cache(home)
    chain = ReleaseChain.from_url(f"sqlite:///{tmp_path / 'reef.db'}")
    try:
        head = chain.create(
            "words", ReleaseManifest(model=ModelComponent(base=DEFAULT_MODEL)), "test", "test"
        )
    finally:
        chain.close()
    store = open_artifact_store(tmp_path / "artifacts")
    context = LearnerContext(
        scenario="words", head=head,
        batch=ExperienceBatch(train=[item(w, lab) for w, lab in TRAIN.items()], holdout=[]),
        artifacts=store, home=home, work_dir=tmp_path / "work",
        reflector=ScriptedReflector(), progress=SilentProgress(), metrics=MetricLog(),
    )  # fmt: skip
    output = SFTLearner(SFTConfig(steps=24, lr=2e-3, batch_size=4)).learn(context)
    assert output.adapter is not None

    base = load_model(DEFAULT_MODEL, home)
    before = accuracy(base, base.model)
    tuned = load_model(DEFAULT_MODEL, home)
    adapter = PeftModel.from_pretrained(tuned.model, str(store.materialize(output.adapter)))
    after = accuracy(tuned, adapter)
    assert after >= 0.75 and after >= before + 0.5, (before, after)
