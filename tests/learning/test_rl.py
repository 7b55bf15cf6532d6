"""The ``rl`` learner and its GRPO trainer on tiny-random: the scorer and advantages,
prompts from a batch (torch-free), a few steps raising the reward of a contains-scorer,
and end to end in the training child with the adapter stored by digest, then continued
from the head's adapter."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from reef.core import SilentProgress
from reef.core.digests import tree_digest
from reef.evaluation.scorers import build_scorer
from reef.learning.base import ExperienceBatch, LearnerContext, MetricLog, TrainingExample
from reef.learning.learners.rl import RLConfig, RLLearner, rl_prompts
from reef.learning.registry import LearnerRegistry
from reef.learning.trainers import Budget
from reef.releases import (
    ModelComponent,
    Release,
    ReleaseChain,
    ReleaseManifest,
    open_artifact_store,
    read_fingerprint,
)
from tests.fakes.learning import ScriptedReflector

# PEFT 0.21 reads a deprecated transformers property while wrapping a model.
pytestmark = pytest.mark.filterwarnings(
    "ignore:.*is_gradient_checkpointing. is deprecated:FutureWarning"
)

TINY = "tiny-random"
QUESTIONS = ["Hi?", "Sky?", "Fruit?", "Count."]
# Reward completions containing the letter "a": rare (~12% of 32 random bytes) at first.
# The shape the rl scorer had before it used the evaluation scorers: still read.
CONTAINS_A = {"type": "contains", "pattern": "a"}
FAST: dict[str, Any] = {
    "target_modules": ["q_proj", "v_proj", "lm_head"],
    "group_size": 8,
    "max_new_tokens": 32,
    "lr": 2e-2,
    "beta_kl": 0.01,
    "loss_type": "grpo",
    "batch_size": 4,
    "threads": 1,
}


def example(record_id: str, question: str, correction: Any = "a") -> TrainingExample:
    return TrainingExample(
        record_id=record_id,
        scenario="s",
        session_id=f"sess-{record_id}",
        messages=[{"role": "user", "content": question}],
        response={"role": "assistant", "content": "x"},
        score=0.0,
        correction=correction,
        feedback=[],
        principals=[None],
        release_id=None,
        staleness=0,
        content_hash=record_id,
    )


TRAIN = [example(f"q{i}", q) for i, q in enumerate(QUESTIONS)]


def test_rewards_come_from_the_evaluation_scorers_and_old_specs_still_read() -> None:
    from reef.learning.trainers.grpo import reward
    from reef.learning.trainers.rl_loss import group_advantages
    from reef.learning.trainers.spec import RLPrompt

    def scored(scorer: Any, completion: str, reference: str) -> float:
        spec = RLConfig(scorer=scorer).scorer
        prompt = RLPrompt(messages=[{"role": "user", "content": "q"}], reference=reference)
        return reward(build_scorer(spec), completion, prompt)

    assert scored("exact", " Paris ", "Paris") == 1.0
    assert scored({"type": "exact"}, "Paris!", "Paris") == 0.0
    assert scored("normalized_exact", "Paris!", "paris") == 1.0
    assert scored({"type": "contains"}, "It is PARIS.", "Paris") == 1.0
    assert scored({"type": "regex", "pattern": r"\d+"}, "n=42", "x") == 1.0
    # {type: contains, pattern: P} was a case-sensitive substring: read as that regex.
    assert RLConfig(scorer={"type": "contains", "pattern": "a.b"}).scorer == {
        "type": "regex",
        "pattern": r"a\.b",
    }
    assert scored({"type": "contains", "pattern": "a.b"}, "xa.by", "ignored") == 1.0
    assert scored({"type": "contains", "pattern": "a.b"}, "axb", "ignored") == 0.0
    assert scored(CONTAINS_A, "cat", "ignored") == 1.0
    assert scored(CONTAINS_A, "CAT", "ignored") == 0.0
    with pytest.raises(ValidationError, match="no_such_scorer"):
        RLConfig(scorer={"type": "no_such_scorer"})
    with pytest.raises(ValidationError, match="case_sensitive"):
        RLConfig(scorer={"type": "contains", "case_sensitive": "maybe"})
    adv = group_advantages([1.0, 0.0, 0.0, 0.0])
    assert adv[0] > 0 > adv[1] and abs(sum(adv)) < 1e-9
    assert group_advantages([1.0, 1.0]) == [0.0, 0.0]


def test_prompts_need_a_reference_and_learner_is_torch_free() -> None:
    prompts, used = rl_prompts([*TRAIN[:2], example("none", "Up?", None)])
    assert used == ["q0", "q1"] and [p.reference for p in prompts] == ["a", "a"]
    assert LearnerRegistry().get("rl") is RLLearner
    code = (
        "import sys, reef.learning.learners.rl; "
        "sys.exit(int(any(m.split('.')[0] in ('torch', 'peft') for m in sys.modules)))"
    )
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0


def test_grpo_raises_the_reward(tmp_path: Path) -> None:
    from reef.learning.trainers.grpo import train_grpo
    from reef.learning.trainers.spec import LoraSettings, RLSpec

    prompts, _ = rl_prompts(TRAIN)
    spec = RLSpec(
        model=TINY,
        home=tmp_path / "home",
        prompts=prompts,
        output_dir=tmp_path / "adapter",
        scorer=CONTAINS_A,
        lora=LoraSettings(target_modules=FAST["target_modules"]),
        group_size=8,
        max_new_tokens=32,
        lr=2e-2,
        beta_kl=0.01,
        budget=Budget(steps=12),
        threads=1,
    )
    result = train_grpo(spec)
    curve = result.metrics["reward_curve"]
    assert len(curve) == 12 and len(result.metrics["kl_curve"]) == 12
    assert curve[0] < 0.25
    assert sum(curve[-3:]) / 3 > curve[0] + 0.3, curve
    assert result.metrics["sampler"] == "local" and result.metrics["samples"] == 12 * 32
    assert (tmp_path / "adapter" / "adapter_model.safetensors").is_file()
    fingerprint = read_fingerprint(tmp_path / "adapter")  # probes from its prompts
    assert fingerprint is not None and fingerprint.probes[0].messages == prompts[0].messages
    # Deterministic for a given spec (the fingerprint too: it is under the digest).
    again = train_grpo(spec.model_copy(update={"output_dir": tmp_path / "again"}))
    assert again.metrics["reward_curve"] == curve
    assert tree_digest(tmp_path / "again") == tree_digest(tmp_path / "adapter")


@pytest.fixture
def chain(tmp_path: Path) -> Any:
    opened = ReleaseChain.from_url(f"sqlite:///{tmp_path / 'reef.db'}")
    yield opened
    opened.close()


def create(chain: ReleaseChain, scenario: str, adapter: str | None) -> Release:
    manifest = ReleaseManifest(model=ModelComponent(base=TINY, adapter=adapter))
    return chain.create(scenario, manifest, actor="test", reason="test")


def test_end_to_end_in_the_child(tmp_path: Path, chain: ReleaseChain) -> None:
    store = open_artifact_store(tmp_path / "artifacts")
    learner = RLLearner(RLConfig(scorer=CONTAINS_A, steps=3, **FAST))

    def context(head: Release, train: list[TrainingExample]) -> LearnerContext:
        return LearnerContext(
            scenario=head.scenario,
            head=head,
            batch=ExperienceBatch(train=train, holdout=[]),
            artifacts=store,
            home=tmp_path / "home",
            work_dir=tmp_path / f"work-{head.scenario}",
            reflector=ScriptedReflector(),
            progress=SilentProgress(),
            metrics=MetricLog(),
        )

    output = learner.learn(context(create(chain, "s", None), TRAIN))
    assert output.adapter is not None and output.consumed == ["q0", "q1", "q2", "q3"]
    assert len(output.metrics["reward_curve"]) == 3 and output.metrics["continued"] is False
    assert output.metrics["loss_type"] == "grpo" and len(output.metrics["ratio_curve"]) == 3
    assert tree_digest(store.materialize(output.adapter)) == output.adapter
    assert store.info(output.adapter).kind == "adapter"

    again = learner.learn(context(create(chain, "t", output.adapter), TRAIN[:2]))
    assert again.metrics["continued"] is True and again.consumed == ["q0", "q1"]
    kl = again.metrics["kl_curve"]  # the reference is the head's adapter: 0 before step 1
    assert kl[0] == pytest.approx(0.0, abs=1e-6) and kl[-1] > 0.0
    assert again.adapter is not None and again.adapter != output.adapter
    assert tree_digest(store.materialize(again.adapter)) == again.adapter

    nothing = learner.learn(context(create(chain, "u", None), [example("n", "Up?", None)]))
    assert nothing.adapter is None and nothing.consumed == []


def test_sampling_through_the_engine(tmp_path: Path) -> None:
    """With ``engine_url`` the completions come from a real tiny-random engine: its token
    ids are trained on as they are, and its logprobs agree with the trainer's (the same
    weights; the gap is measured at the first step, before any update). The engine keeps
    serving the starting weights, so from the second step the samples are off-policy:
    the importance ratios against the engine's log-probs move away from 1."""
    from reef.engine.models import load_model
    from reef.engine.runtime import Engine
    from reef.engine.server import BackgroundServer
    from reef.learning.trainers.grpo import train_grpo
    from reef.learning.trainers.spec import LoraSettings, RLSpec

    engine = Engine(load_model(TINY, tmp_path / "home"), max_batch=8, threads=1)
    server = BackgroundServer(engine).start()
    try:
        prompts, _ = rl_prompts(TRAIN[:2])
        spec = RLSpec(
            model=TINY,
            home=tmp_path / "home",
            prompts=prompts,
            output_dir=tmp_path / "adapter",
            scorer=CONTAINS_A,
            lora=LoraSettings(target_modules=FAST["target_modules"]),
            group_size=4,
            max_new_tokens=8,
            lr=2e-2,
            budget=Budget(steps=3),
            engine_url=server.base_url.removesuffix("/v1"),
            threads=1,
        )
        result = train_grpo(spec)
    finally:
        server.stop()
    metrics = result.metrics
    assert metrics["sampler"] == "engine" and metrics["samples"] == 3 * 2 * 4
    gap = metrics["engine_logprob_gap"]
    assert gap is not None and gap < 1e-3
    first, *later = metrics["ratio_curve"]  # [min, mean, max] per step
    assert max(abs(r - 1.0) for r in first) < 1e-2
    assert max(abs(r - 1.0) for step in later for r in step) > 0.05, later
    assert metrics["kl_curve"] == [] and metrics["loss_type"] == "dapo"
