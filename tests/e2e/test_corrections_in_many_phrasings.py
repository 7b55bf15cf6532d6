"""Corrections read the way people write them, on the tiny engine: 200 conversations
with the default recipe (``fewshot`` k=2 then ``sft``) plus ``signals: {}``; every
answer is wrong and the user's next message gives the right code in one of ten
phrasings (several not in tests/data/signals/corpus.txt). Nobody posts feedback. At
least 90% of the answers become examples carrying the right code; the gate scores at
least 20 held-out items whose references came from those corrections; the candidate
is published."""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from reef.config import EvaluationConfig
from reef.evaluation import EvaluationStore
from reef.jobs import JobQueue
from reef.learning import load_recipe
from reef.learning.selection import select_experience
from reef.learning.worker import Worker
from reef.releases import ReleaseChain, open_artifact_store
from tests.e2e.tiny import tiny_gateway
from tests.engine.lora_factory import PEFT_WRAP_WARNING

pytestmark = pytest.mark.filterwarnings(PEFT_WRAP_WARNING)

TARGET = "KX-4821"
CONVERSATIONS = 200
# Ten ways to say "wrong, it's X"; the first two and the last are in the corpus, the
# others are not.
PHRASINGS = (
    "No, it's {v}, not that.",
    "Hmm, I think it's actually {v}.",
    "That's not right, the code should be {v}.",
    "Wrong one. The correct code is {v}.",
    "You mixed it up: it's {v}.",
    "Not quite, I need `{v}`.",
    'Close, but the answer is "{v}".',
    "Are you sure? My code is {v}.",
    "Please recheck, it must be {v}.",
    "Nope, {v}, not what you said.",
)
# The default recipe (bench/learning.py's): fewshot k=2, then sft, held-out gate; the
# sft budget is the tiny random model's (it learns nothing in the defaults' few steps).
RECIPE = """\
schema_version: 1
trigger: {type: min_new_feedback, count: 20}
signals: {}
selection: {holdout_fraction: 0.2}
learners:
  - {type: fewshot, k: 2}
  - type: sft
    model: tiny-random
    target_modules: [q_proj, v_proj, lm_head]
    lr: 0.01
    steps: 120
    threads: 1
    batch_size: 8
gate:
  holdout: true
  evidence_sources: {signal: 1}
  scorer: {type: contains}
  min_items: 20
  max_tokens: 8
  concurrency: 4
publish: auto
"""


def test_corrections_in_ten_phrasings_train_a_published_candidate(tmp_path: Path) -> None:
    (tmp_path / "recipe.yaml").write_text(RECIPE)
    recipe = load_recipe(tmp_path / "recipe.yaml")
    with tiny_gateway(
        tmp_path, scenarios={"codes": {"upstream": "engine", "recipe": tmp_path / "recipe.yaml"}}
    ) as gateway:
        client = gateway.openai(**{"x-reef-scenario": "codes"})

        def converse(i: int) -> None:
            asked = [{"role": "user", "content": f"which code for case {i}?"}]
            first = client.chat.completions.create(
                model="reef/codes", messages=asked, max_tokens=4
            )  # the tiny model's answer is never the code
            reply = first.choices[0].message.content or ""
            follow_up = PHRASINGS[i % len(PHRASINGS)].format(v=TARGET)
            corrected = [
                *asked,
                {"role": "assistant", "content": reply},
                {"role": "user", "content": follow_up},
            ]
            client.chat.completions.create(model="reef/codes", messages=corrected, max_tokens=2)

        with ThreadPoolExecutor(8) as pool:
            list(pool.map(converse, range(CONVERSATIONS)))
        assert gateway.store.list_feedback("codes", None, None, 10) == []  # nobody graded

        settings = gateway.settings.model_copy(
            update={"evaluation": EvaluationConfig(gateway_url=gateway.url)}
        )
        chain = ReleaseChain(gateway.database)
        base = chain.head("codes")
        worker = Worker(
            settings,
            gateway.store,
            chain,
            open_artifact_store(settings.artifacts_url()),
            queue=JobQueue(gateway.database),
            evaluations=EvaluationStore(gateway.database),
        )
        worker.compute_feedback()
        # what selection makes of the corrections, before the job consumes them
        batch = select_experience(gateway.store, chain, "codes", recipe.selection)
        examples = [*batch.train, *batch.holdout]
        right = [e for e in examples if e.correction == TARGET]
        assert len(right) >= 0.9 * CONVERSATIONS, (len(right), batch.stats)
        assert len(batch.holdout) >= 20

        [job] = worker.run_once()
        assert job.state == "succeeded", job.as_dict()
        assert job.result is not None
        gate = job.result["gate"]
        assert gate["action"] == "published", gate
        # the gate scored the held-out corrections: their values are its references
        assert gate["cost"]["items"] >= 20 and job.result["selection"]["holdout"] >= 20, gate
        head = chain.head("codes")
        assert head is not None and base is not None and head.parent_id == base.id
        assert head.manifest.model.adapter is not None
