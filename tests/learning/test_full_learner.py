"""The ``full`` learner on tiny-random: every weight trained in a child, a checkpoint
(safetensors + config, no adapter) stored by digest with its metrics; a head serving a
checkpoint is continued from, with replay; the worker's candidate names the checkpoint."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors import safe_open

from reef.core.checkpoints import check_checkpoint_directory
from reef.core.digests import tree_digest
from reef.learning.base import ExperienceBatch, LearnerOutput
from reef.learning.learners.full import FullConfig, FullLearner
from reef.learning.trainers.precision import use_bf16
from reef.learning.worker import _with_output
from reef.releases import ModelComponent, ReleaseChain, ReleaseManifest, open_artifact_store
from tests.learning.test_sft_learner import TINY, TRAIN, context, example

DIGEST = "sha256:" + "1" * 64


@pytest.fixture
def chain(tmp_path: Path) -> Any:
    opened = ReleaseChain.from_url(f"sqlite:///{tmp_path / 'reef.db'}")
    yield opened
    opened.close()


def test_trains_every_weight_into_a_checkpoint_and_continues_from_the_head(
    tmp_path: Path, chain: ReleaseChain
) -> None:
    store = open_artifact_store(tmp_path / "artifacts")
    learner = FullLearner(FullConfig(steps=3, batch_size=2, threads=1, lr=1e-3))
    head = chain.create("s", ReleaseManifest(model=ModelComponent(base=TINY)), "test", "test")
    seen: list[tuple[float, str]] = []
    output = learner.learn(context(tmp_path, head, store, seen))

    assert output.checkpoint is not None and output.adapter is None
    assert output.consumed == ["good", "fixed"]
    assert len(output.metrics["loss_curve"]) == 3 and output.metrics["continued"] is False
    assert output.metrics["parameters"] > 100_000  # all of tiny-random, not a LoRA's few
    # auto: float32 on every CPU
    assert output.metrics["bf16"] is use_bf16("auto", torch.device("cpu"))
    info = store.info(output.checkpoint)
    assert info.kind == "checkpoint" and info.meta["learner"] == "full"
    assert info.meta["base"] == TINY
    copy = store.materialize(output.checkpoint)
    assert tree_digest(copy) == output.checkpoint
    checked = check_checkpoint_directory(copy, output.checkpoint)
    assert checked.shards == ("model.safetensors",)
    assert not [p for p in copy.iterdir() if p.suffix in {".bin", ".pt", ".pth", ".pkl"}]
    with safe_open(str(copy / "model.safetensors"), "pt") as weights:  # type: ignore[no-untyped-call]
        names = list(weights.keys())
    assert "model.layers.0.self_attn.q_proj.weight" in names
    assert not any("lora" in name for name in names)

    # a head that serves the checkpoint: the next run starts from its weights, and replays
    later = chain.create(
        "t",
        ReleaseManifest(model=ModelComponent(base=TINY, checkpoint=output.checkpoint)),
        "test",
        "test",
    )
    ctx = context(tmp_path, later, store, [])
    ctx.batch = ExperienceBatch(train=TRAIN, holdout=[], replay=[example("old", 0.0, "Octo-3")])
    again = learner.learn(ctx)
    assert again.metrics["continued"] is True and again.metrics["replayed"] == 1
    assert again.metrics["base"] == TINY
    assert again.checkpoint is not None and again.checkpoint != output.checkpoint
    assert store.info(again.checkpoint).meta["continued_from"] == output.checkpoint


def test_the_candidate_names_the_checkpoint_and_drops_the_heads_adapter() -> None:
    head = ReleaseManifest(model=ModelComponent(base=TINY, adapter="sha256:" + "2" * 64))
    manifest = _with_output(head, LearnerOutput(checkpoint=DIGEST), "r")
    assert manifest.model == ModelComponent(base=TINY, checkpoint=DIGEST)
    assert manifest.digests() == {DIGEST}
    assert manifest.to_json()["model"] == {"base": TINY, "checkpoint": DIGEST, "adapter": None}
    assert "checkpoint" not in head.to_json()["model"]  # absent: serialized as before


def test_gradient_checkpointing_and_bf16_paths_train_on_the_cpu(tmp_path: Path) -> None:
    """What ``auto`` turns on for CUDA, forced on the CPU: the same loop, a checkpoint
    the engine's loader reads, saved in float32 with ``use_cache`` back on."""
    from reef.engine.models import load_model
    from reef.learning.trainers import Budget, SFTExample, SFTSpec
    from reef.learning.trainers.lora_sft import train_lora_sft

    examples = [
        SFTExample(messages=[{"role": "user", "content": f"q{i}"}], target="Squid-7")
        for i in range(4)
    ]
    spec = SFTSpec(
        model=TINY,
        home=tmp_path,
        examples=examples,
        output_dir=tmp_path / "ck",
        mode="full",
        gradient_checkpointing=True,
        bf16=True,
        lr=1e-3,
        budget=Budget(steps=2),
        batch_size=2,
        threads=1,
        device="cpu",
    )
    result = train_lora_sft(spec)
    assert result.metrics["bf16"] is True and len(result.metrics["loss_curve"]) == 2
    info = check_checkpoint_directory(tmp_path / "ck")
    assert info.weight_bytes == info.parameters * 4  # float32 on disk
    loaded = load_model(str(tmp_path / "ck"), tmp_path)
    assert loaded.model.config.use_cache is True
    # the eager attention bf16 trains with on a CPU is not what the checkpoint serves with
    assert loaded.model.config._attn_implementation != "eager"


def test_a_lora_learner_on_a_checkpoint_head_trains_on_the_checkpoint(
    tmp_path: Path, chain: ReleaseChain
) -> None:
    """The head serves a checkpoint: ``sft``'s adapter is trained on its weights (the
    ones it will run on, under the candidate's kept checkpoint), not the base's."""
    from reef.learning.learners.sft import SFTConfig, SFTLearner
    from tests.engine.checkpoint_factory import make_noisy_checkpoint

    store = open_artifact_store(tmp_path / "artifacts")
    checkpoint = store.put_dir(make_noisy_checkpoint(tmp_path / "noisy", seed=3), "checkpoint")
    learner = SFTLearner(SFTConfig(steps=2, batch_size=2, threads=1, bf16=False))
    on_base = chain.create("b", ReleaseManifest(model=ModelComponent(base=TINY)), "t", "t")
    on_ck = chain.create(
        "c", ReleaseManifest(model=ModelComponent(base=TINY, checkpoint=checkpoint)), "t", "t"
    )
    base_run = learner.learn(context(tmp_path, on_base, store, []))
    ck_run = learner.learn(context(tmp_path, on_ck, store, []))
    # the same examples and seed: only the weights trained on differ
    assert ck_run.metrics["loss_curve"][0] != base_run.metrics["loss_curve"][0]
    assert ck_run.metrics["base"] == TINY and ck_run.adapter is not None
    manifest = _with_output(on_ck.manifest, ck_run, "r")
    kept = ModelComponent(base=TINY, checkpoint=checkpoint, adapter=ck_run.adapter)
    assert manifest.model == kept
