"""``trainer: ray``: the same training function as a Ray task on a local loopback
cluster gives the same adapter as the child-process trainer; a failing task raises
``TrainingFailedError``. Skipped without the ``ray`` extra."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from reef.core.digests import tree_digest
from reef.learning.base import ExperienceBatch, LearnerContext, MetricLog
from reef.learning.learners.sft import SFTConfig, SFTLearner
from reef.learning.trainers import Budget, SFTExample, SFTSpec, TrainingFailedError
from reef.learning.trainers.ray_runner import run_in_ray
from reef.releases import ModelComponent, ReleaseChain, ReleaseManifest, open_artifact_store
from tests.fakes.learning import RecordedProgress, ScriptedReflector
from tests.learning.test_sft_learner import TINY, TRAIN

ray = pytest.importorskip("ray")

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


@pytest.fixture(scope="module")
def loopback_ray() -> Any:
    """One local cluster on 127.0.0.1 for the module, shut down after it."""
    ray.init(address=None, include_dashboard=False, _node_ip_address="127.0.0.1", num_cpus=2)
    yield ray
    ray.shutdown()


def test_ray_trainer_matches_local_trainer(tmp_path: Path, loopback_ray: Any) -> None:
    chain = ReleaseChain.from_url(f"sqlite:///{tmp_path / 'reef.db'}")
    try:
        head = chain.create(
            "s", ReleaseManifest(model=ModelComponent(base=TINY)), actor="t", reason="t"
        )
        store = open_artifact_store(tmp_path / "artifacts")
        digests: dict[str, str] = {}
        curves: dict[str, list[float]] = {}
        for trainer in ("local", "ray"):
            progress = RecordedProgress()

            context = LearnerContext(
                scenario="s",
                head=head,
                batch=ExperienceBatch(train=TRAIN, holdout=[]),
                artifacts=store,
                home=tmp_path / "home",
                work_dir=tmp_path / f"work-{trainer}",
                reflector=ScriptedReflector(),
                progress=progress,
                metrics=MetricLog(),
            )
            config = SFTConfig(steps=3, batch_size=2, threads=1, seed=7, trainer=trainer)
            output = SFTLearner(config).learn(context)
            assert output.adapter is not None
            digests[trainer] = output.adapter
            curves[trainer] = output.metrics["loss_curve"]
            assert any("step 3/3" in message for _, message in progress.reports)
        assert curves["ray"] == curves["local"]
        assert tree_digest(store.materialize(digests["ray"])) == digests["ray"]
        # Same function, same seed: the same weights, byte for byte. The digests may
        # still differ: PEFT writes ``target_modules`` from a set, in hash-seed order.
        ray_dir, local_dir = store.materialize(digests["ray"]), store.materialize(digests["local"])
        assert sorted(p.name for p in ray_dir.iterdir()) == sorted(
            p.name for p in local_dir.iterdir()
        )
        weights = "adapter_model.safetensors"
        assert (ray_dir / weights).read_bytes() == (local_dir / weights).read_bytes()
        configs = [
            json.loads((d / "adapter_config.json").read_text()) for d in (ray_dir, local_dir)
        ]
        for config in configs:
            config["target_modules"] = sorted(config["target_modules"])
        assert configs[0] == configs[1]
    finally:
        chain.close()


def test_failing_task_raises_training_failed(tmp_path: Path, loopback_ray: Any) -> None:
    spec = SFTSpec(
        model=str(tmp_path / "no-such-model"),
        home=tmp_path / "home",
        examples=[SFTExample(messages=[{"role": "user", "content": "Hi"}], target="Yo")],
        output_dir=tmp_path / "adapter",
        budget=Budget(steps=1),
        threads=1,
    )
    with pytest.raises(TrainingFailedError, match="ray training task failed"):
        run_in_ray(spec)
    assert not (tmp_path / "adapter").exists()


def test_starts_and_stops_its_own_loopback_cluster(tmp_path: Path) -> None:
    if ray.is_initialized():
        ray.shutdown()
    spec = SFTSpec(
        model=TINY,
        home=tmp_path / "home",
        examples=[SFTExample(messages=[{"role": "user", "content": "Hi"}], target="Yo")],
        output_dir=tmp_path / "adapter",
        budget=Budget(steps=1),
        batch_size=1,
        threads=1,
        device="cpu",
    )
    steps: list[int] = []
    result = run_in_ray(spec, lambda step, _steps, _loss: steps.append(step))
    assert result.adapter_dir == tmp_path / "adapter"
    assert (tmp_path / "adapter" / "adapter_model.safetensors").is_file()
    assert steps == [1]
    assert not ray.is_initialized()


def test_full_checkpoint_on_ray_matches_local_and_continues(
    tmp_path: Path, loopback_ray: Any
) -> None:
    from reef.learning.learners.full import FullConfig, FullLearner

    chain = ReleaseChain.from_url(f"sqlite:///{tmp_path / 'reef.db'}")
    try:
        store = open_artifact_store(tmp_path / "artifacts")
        base = chain.create("s", ReleaseManifest(model=ModelComponent(base=TINY)), "t", "t")

        def learn(head: Any, trainer: str) -> Any:
            context = LearnerContext(
                scenario=head.scenario,
                head=head,
                batch=ExperienceBatch(train=TRAIN, holdout=[]),
                artifacts=store,
                home=tmp_path / "home",
                work_dir=tmp_path / f"work-{trainer}-{head.scenario}",
                reflector=ScriptedReflector(),
                progress=RecordedProgress(),
                metrics=MetricLog(),
            )
            config = FullConfig(steps=2, batch_size=2, threads=1, seed=7, trainer=trainer)
            return FullLearner(config).learn(context)

        local, remote = learn(base, "local"), learn(base, "ray")
        assert remote.metrics["loss_curve"] == local.metrics["loss_curve"]
        weights = "model.safetensors"
        ray_dir, local_dir = (
            store.materialize(remote.checkpoint),
            store.materialize(local.checkpoint),
        )
        assert (ray_dir / weights).read_bytes() == (local_dir / weights).read_bytes()
        head = chain.create(
            "t",
            ReleaseManifest(model=ModelComponent(base=TINY, checkpoint=remote.checkpoint)),
            "t",
            "t",
        )
        again = learn(head, "ray")  # the head's checkpoint travels to the task
        assert again.metrics["continued"] is True and again.checkpoint != remote.checkpoint
    finally:
        chain.close()
