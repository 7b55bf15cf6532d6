"""The ``sft`` learner end to end on tiny-random: examples from corrections and good
replies only, training in a child, the adapter stored by digest and loaded by the
engine with that digest; continuing from the head's adapter."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest

from reef.core.digests import tree_digest
from reef.engine.models import load_model
from reef.engine.runtime import Engine
from reef.engine.server import BackgroundServer
from reef.harness import Example, Harness
from reef.learning.base import ExperienceBatch, LearnerContext, MetricLog, TrainingExample
from reef.learning.learners.sft import SFTConfig, SFTLearner, sft_examples, with_harness
from reef.releases import (
    ArtifactStore,
    ModelComponent,
    Release,
    ReleaseChain,
    ReleaseManifest,
    compare_fingerprint,
    open_artifact_store,
    parse_probe_answer,
    probe_request,
    read_fingerprint,
)
from tests.fakes.learning import RecordedProgress, ScriptedReflector

TINY = "tiny-random"

# PEFT 0.21 reads a deprecated transformers property while the engine wraps its model.
pytestmark = pytest.mark.filterwarnings(
    "ignore:.*is_gradient_checkpointing. is deprecated:FutureWarning"
)


def example(record_id: str, score: float | None, correction: Any = None) -> TrainingExample:
    return TrainingExample(
        record_id=record_id,
        scenario="s",
        session_id="sess",
        messages=[
            {"role": "system", "content": "Answer briefly."},
            {"role": "user", "content": [{"type": "text", "text": f"Question {record_id}?"}]},
        ],
        response={"role": "assistant", "content": f"served {record_id}"},
        score=score,
        correction=correction,
        feedback=[],
        principals=[None],
        release_id=None,
        staleness=0,
        content_hash=record_id,
    )


TRAIN = [
    example("good", 1.0),
    example("bad", 0.0),
    example("fixed", 0.0, "Squid-7"),
    example("unscored", None),
]


def test_targets_are_corrections_and_high_score_replies() -> None:
    examples, used = sft_examples(TRAIN, min_score=1.0)
    taught = {record_id: example for record_id, example in zip(used, examples, strict=True)}
    assert {record_id: e.target for record_id, e in taught.items()} == {
        "good": "served good",
        "fixed": "Squid-7",
    }
    assert taught["good"].messages[1] == {"role": "user", "content": "Question good?"}


def test_render_harness_trains_under_the_prompt_the_gateway_will_send() -> None:
    examples, _ = sft_examples([TRAIN[0]], min_score=1.0)
    demo = Example(
        messages=[{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Yo"}]
    )
    harness = Harness(schema_version=1, system_prompt="Be a squid.", examples=[demo])
    [rendered] = with_harness(examples, harness)
    assert rendered.messages == [
        {"role": "system", "content": "Be a squid.\n\nAnswer briefly."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Yo"},
        {"role": "user", "content": "Question good?"},
    ]
    assert rendered.target == "served good"


@pytest.fixture
def chain(tmp_path: Path) -> Any:
    opened = ReleaseChain.from_url(f"sqlite:///{tmp_path / 'reef.db'}")
    yield opened
    opened.close()


def context(
    tmp_path: Path, head: Release, store: ArtifactStore, seen: list[tuple[float, str]]
) -> LearnerContext:
    return LearnerContext(
        scenario=head.scenario,
        head=head,
        batch=ExperienceBatch(train=TRAIN, holdout=[example("held", 1.0, "never")]),
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


async def test_learns_an_adapter_the_engine_loads_by_digest(
    tmp_path: Path, chain: ReleaseChain
) -> None:
    store = open_artifact_store(tmp_path / "artifacts")
    learner = SFTLearner(SFTConfig(steps=4, batch_size=2, threads=1))
    seen: list[tuple[float, str]] = []
    output = learner.learn(context(tmp_path, create(chain, "s", None), store, seen))

    assert output.adapter is not None and output.harness is None
    assert output.consumed == ["good", "fixed"]
    assert len(output.metrics["loss_curve"]) == 4
    assert output.metrics["tokens"] > 0 and output.metrics["continued"] is False
    assert seen[0][0] == 0.0 and seen[-1][0] == 1.0
    assert any("step 4/4" in message for _, message in seen)
    stored = store.materialize(output.adapter)
    assert tree_digest(stored) == output.adapter
    assert store.info(output.adapter).kind == "adapter"
    fingerprint = read_fingerprint(stored)  # in the directory: under the digest
    assert fingerprint is not None and fingerprint.dtype == "float32"
    assert len(fingerprint.probes) == 4
    assert fingerprint.base_gap is not None and fingerprint.base_differs is not None
    assert store.info(output.adapter).meta["fingerprint"] == fingerprint.model_dump(mode="json")

    server = BackgroundServer(Engine(load_model(TINY, tmp_path), threads=1)).start()
    try:
        async with aiohttp.ClientSession() as session:
            body = {"lora_name": "sft", "lora_path": str(stored), "expected_digest": output.adapter}
            async with session.post(server.base_url + "/load_lora_adapter", json=body) as reply:
                assert reply.status == 200, await reply.text()
            answers = []  # the engine serving the adapter answers its trainer's fingerprint
            for probe in fingerprint.probes:
                url = server.base_url + "/chat/completions"
                async with session.post(url, json=probe_request(probe, "sft")) as reply:
                    answers.append(parse_probe_answer(await reply.json()))
            assert compare_fingerprint(fingerprint, answers) is None
        async with openai.AsyncOpenAI(
            base_url=server.base_url, api_key="unused", max_retries=0
        ) as client:
            answer = await client.chat.completions.create(
                model="sft", messages=[{"role": "user", "content": "Hi"}], max_tokens=2
            )
            assert answer.choices[0].message.role == "assistant"
    finally:
        server.stop()

    # A head that serves that adapter: the next run continues from it, and replays a
    # sample of what the head learned (never reported as consumed again).
    assert output.metrics["replayed"] == 0  # a fresh adapter has nothing to keep
    later = context(tmp_path, create(chain, "t", output.adapter), store, [])
    later.batch = ExperienceBatch(
        train=TRAIN, holdout=[], replay=[example("old", 0.0, "Octo-3"), example("plain", 0.0)]
    )
    again = learner.learn(later)
    assert again.metrics["continued"] is True
    assert again.metrics["replayed"] == 1  # "plain" has no target
    assert again.consumed == ["good", "fixed"]
    assert again.adapter is not None and again.adapter != output.adapter
    off = SFTLearner(SFTConfig(steps=4, batch_size=2, threads=1, replay=False)).learn(later)
    assert off.metrics["replayed"] == 0


def test_nothing_to_train_changes_nothing(tmp_path: Path, chain: ReleaseChain) -> None:
    store = open_artifact_store(tmp_path / "artifacts")
    ctx = context(tmp_path, create(chain, "s", None), store, [])
    ctx.batch = ExperienceBatch(train=[example("bad", 0.0)], holdout=[])
    output = SFTLearner(SFTConfig()).learn(ctx)
    assert output.adapter is None and output.consumed == []
    assert store.list() == []


def test_the_fitted_stop_is_off_unless_a_recipe_sets_it() -> None:
    from reef.learning.learners.sft import SFTConfig

    assert SFTConfig().budget().fitted_loss is None
    assert SFTConfig(fitted_loss=0.02).budget().fitted_loss == 0.02
    with pytest.raises(ValueError, match="fitted_loss"):
        SFTConfig(fitted_loss=-0.1)
    assert SFTConfig(known_loss=0.05).budget().known_loss == 0.05
    with pytest.raises(ValueError, match="known_loss"):
        SFTConfig(known_loss=-0.1)
