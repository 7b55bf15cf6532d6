"""The ``preference`` learner: DPO pairs and KTO examples from a batch (torch-free), the
objective choice, and end to end on tiny-random: training in a child, the adapter
stored by digest, continuing from the head's adapter."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from reef.core.digests import tree_digest
from reef.learning.base import ExperienceBatch, LearnerContext, MetricLog, TrainingExample
from reef.learning.learners.preference import (
    PreferenceConfig,
    PreferenceLearner,
    preference_pairs,
    unpaired_examples,
)
from reef.learning.registry import LearnerRegistry
from reef.releases import (
    ArtifactStore,
    ModelComponent,
    Release,
    ReleaseChain,
    ReleaseManifest,
    open_artifact_store,
)
from tests.fakes.learning import RecordedProgress, ScriptedReflector

TINY = "tiny-random"

# PEFT 0.21 reads a deprecated transformers property while wrapping a model.
pytestmark = pytest.mark.filterwarnings(
    "ignore:.*is_gradient_checkpointing. is deprecated:FutureWarning"
)


def example(
    record_id: str,
    question: str,
    reply: str,
    score: float | None,
    correction: Any = None,
    content_parts: bool = False,
) -> TrainingExample:
    content: Any = [{"type": "text", "text": question}] if content_parts else question
    return TrainingExample(
        record_id=record_id,
        scenario="s",
        session_id=f"sess-{record_id}",
        messages=[
            {"role": "system", "content": "Answer briefly."},
            {"role": "user", "content": content},
        ],
        response={"role": "assistant", "content": reply},
        score=score,
        correction=correction,
        feedback=[],
        principals=[None],
        release_id=None,
        staleness=0,
        content_hash=record_id,
    )


TRAIN = [
    example("a-good", "Sky?", "Blue.", 1.0),
    example("a-bad", "Sky?", "Green.", 0.0, content_parts=True),  # same canonical prompt
    example("a-same", "Sky?", "Blue.", 0.5),  # same reply as a-good: no pair with it
    example("b-fixed", "Fruit?", "Rock.", 0.0, "Apple."),
    example("c-alone", "Hi?", "Hello.", 1.0),  # no partner
    example("d-unscored", "Up?", "Down.", None),
    example("e-mid", "Two?", "Three.", 0.5),
]


def test_pairs_need_the_same_prompt_and_different_scores() -> None:
    pairs, used = preference_pairs(TRAIN)
    # a-same over a-bad repeats (Blue., Green.): deduplicated; a-same vs a-good: same reply.
    assert [(p.chosen, p.rejected) for p in pairs] == [("Blue.", "Green."), ("Apple.", "Rock.")]
    assert used == ["a-good", "a-bad", "b-fixed"]
    sky = next(p for p in pairs if p.chosen == "Blue.")
    assert sky.messages[1] == {"role": "user", "content": "Sky?"}


def test_kto_examples_are_desirable_or_undesirable_by_score() -> None:
    examples, used = unpaired_examples(TRAIN, good_score=1.0, bad_score=0.0)
    assert [(e.target, e.desirable) for e in examples] == [
        ("Blue.", True),
        ("Green.", False),
        ("Apple.", True),
        ("Rock.", False),
        ("Hello.", True),
    ]
    assert used == ["a-good", "a-bad", "b-fixed", "c-alone"]


def test_registered_and_torch_free() -> None:
    assert LearnerRegistry().get("preference") is PreferenceLearner
    code = (
        "import sys, reef.learning.learners.preference; "
        "sys.exit(int(any(m.split('.')[0] in ('torch', 'peft') for m in sys.modules)))"
    )
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0


@pytest.fixture
def chain(tmp_path: Path) -> Any:
    opened = ReleaseChain.from_url(f"sqlite:///{tmp_path / 'reef.db'}")
    yield opened
    opened.close()


def context(
    tmp_path: Path,
    head: Release,
    store: ArtifactStore,
    train: list[TrainingExample],
    seen: list[tuple[float, str]],
) -> LearnerContext:
    return LearnerContext(
        scenario=head.scenario,
        head=head,
        batch=ExperienceBatch(train=train, holdout=[example("held", "X?", "Y.", 1.0, "Z.")]),
        artifacts=store,
        home=tmp_path / "home",
        work_dir=tmp_path / f"work-{head.scenario}",
        reflector=ScriptedReflector(),
        progress=RecordedProgress(seen),
        metrics=MetricLog(),
    )


def create(chain: ReleaseChain, scenario: str, adapter: str | None) -> Release:
    manifest = ReleaseManifest(model=ModelComponent(base=TINY, adapter=adapter))
    return chain.create(scenario, manifest, actor="test", reason="test")


def test_dpo_end_to_end_stores_the_adapter_by_digest(tmp_path: Path, chain: ReleaseChain) -> None:
    store = open_artifact_store(tmp_path / "artifacts")
    learner = PreferenceLearner(
        PreferenceConfig(
            steps=3, batch_size=2, threads=1, lr=1e-2, loss_type="hinge", undesirable_weight=2.0
        )
    )
    seen: list[tuple[float, str]] = []
    output = learner.learn(context(tmp_path, create(chain, "s", None), store, TRAIN, seen))

    assert output.adapter is not None and output.harness is None
    assert output.metrics["objective"] == "dpo" and output.metrics["pairs"] == 2
    assert output.metrics["loss_type"] == "hinge"  # the recipe's loss reached the trainer
    assert output.consumed == ["a-good", "a-bad", "b-fixed"]
    assert len(output.metrics["loss_curve"]) == 3 and output.metrics["tokens"] > 0
    assert "reward_accuracy" in output.metrics and output.metrics["continued"] is False
    assert seen[0][0] == 0.0 and seen[-1][0] == 1.0
    stored = store.materialize(output.adapter)
    assert tree_digest(stored) == output.adapter
    assert store.info(output.adapter).kind == "adapter"

    # KTO (auto: no pairs in this batch), continuing from the head's adapter.
    unpaired = [example("c-alone", "Hi?", "Hello.", 1.0), example("x", "No?", "Yes.", 0.0)]
    again = learner.learn(
        context(tmp_path, create(chain, "t", output.adapter), store, unpaired, [])
    )
    assert again.metrics["objective"] == "kto" and again.metrics["continued"] is True
    assert len(again.metrics["kl_curve"]) == 3
    assert again.consumed == ["c-alone", "x"]
    assert again.adapter is not None and again.adapter != output.adapter
    assert tree_digest(store.materialize(again.adapter)) == again.adapter


def test_nothing_to_train_changes_nothing(tmp_path: Path, chain: ReleaseChain) -> None:
    store = open_artifact_store(tmp_path / "artifacts")
    ctx = context(tmp_path, create(chain, "s", None), store, [TRAIN[-1]], [])
    output = PreferenceLearner(PreferenceConfig(objective="dpo")).learn(ctx)
    assert output.adapter is None and output.consumed == []
    assert store.list() == []
