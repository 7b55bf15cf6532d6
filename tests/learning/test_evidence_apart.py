"""Evidence kept apart from training: a gate suite item that also arrives as traffic with
a correction is left out of training, and the job and the gate's decision report the
overlap. A real gateway in front of the oracle upstream, a worker running the job with
the fewshot learner, and the gate scoring the suite through the gateway."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from reef.experience import FeedbackDraft
from reef.jobs import JobQueue
from reef.learning.holdout import suite_prompts
from reef.learning.overlap import (
    NEAR_DUPLICATE_JACCARD,
    SuiteMatcher,
    SuitePrompt,
    normalised_prompt,
)
from reef.learning.recipes import parse_recipe
from reef.learning.selection import select_experience
from reef.learning.worker import Worker
from tests.evaluation.gate_setup import SCENARIO, QuizWorld, quiz_world, write_suite


def ask(world: QuizWorld, question: str, correction: str) -> str:
    """``question`` served through the gateway, corrected by posted feedback; its record."""
    raw = world.gateway.openai().chat.completions.with_raw_response.create(
        model="gpt-4o",
        messages=[{"role": "user", "content": question}],
        extra_headers={"x-reef-scenario": SCENARIO},
    )
    record_id = raw.headers["x-reef-record-id"]
    world.gateway.store.add_feedback(
        FeedbackDraft(
            scenario=SCENARIO, record_ids=(record_id,), score=0.0, feedback=None,
            correction=correction, metadata={}, principal=None, idempotency_key=None,
        )
    )  # fmt: skip
    return record_id


def test_a_suite_item_sent_as_traffic_is_not_trained_on_and_the_gate_says_so(
    tmp_path: Path,
) -> None:
    suite = write_suite(tmp_path / "quiz.jsonl", range(12))
    recipe: dict[str, Any] = {
        "learners": [{"type": "fewshot"}],
        "selection": {"holdout_fraction": 0, "max_per_principal": None},
        "gate": {"suites": [str(suite)], "min_items": 5, "holdout": False, "max_tokens": 16},
        "publish": "review",
    }
    with quiz_world(tmp_path) as world:
        world.publish_directly([])
        # the suite's item q3, asked again with other spacing and a trailing "?"
        leaked = ask(world, "  q:   Capital 3 ?", "answer-3")
        fresh = [ask(world, f"Q: capital {i}", f"answer-{i}") for i in (40, 41)]
        parsed = parse_recipe(recipe)

        batch = select_experience(
            world.gateway.store,
            world.chain,
            SCENARIO,
            parsed.selection,
            suite_prompts=suite_prompts(parsed),
        )
        assert sorted(e.record_id for e in batch.train) == sorted(fresh), str(batch.stats)
        assert batch.stats["suite_overlap"] == 1
        assert batch.overlap == {leaked: "file:quiz/q3"}

        settings = world.gateway.settings
        evaluation = settings.evaluation.model_copy(update={"gateway_url": world.gateway.url})
        queue = JobQueue(world.gateway.database)
        worker = Worker(
            settings.model_copy(update={"evaluation": evaluation}), world.gateway.store,
            world.chain, world.artifacts, queue=queue, evaluations=world.evaluations,
            recipes={SCENARIO: parsed},
        )  # fmt: skip
        queue.enqueue(SCENARIO, "learn", {"trigger": "manual"})
        [job] = worker.run_once()
        assert job.state == "succeeded", job.as_dict()
        result = job.result or {}
        assert result["selection"]["suite_overlap"] == 1
        said = {"count": 1, "records": [{"record_id": leaked, "item": "file:quiz/q3"}]}
        assert result["suite_overlap"] == said
        # what the learner consumed is the fresh traffic only
        consumed = queue.consumed_ids(SCENARIO)
        assert leaked not in consumed and consumed <= set(fresh)
        # the gate's decision, stored on the candidate, reports the overlap
        candidate = world.chain.get_candidate(result["candidate_id"])
        decision = (candidate.evidence or {})["gate"]["decision"]
        assert decision["evidence"]["suite_overlap"] == said


def test_near_duplicates_match_and_template_siblings_do_not() -> None:
    item = "Where is my order 88412? It never came, and I need it before Friday."
    matcher = SuiteMatcher([SuitePrompt("file:s/a", item)])
    assert normalised_prompt("  Hello,   World!! ") == "hello, world"
    # the same text once normalised: by hash
    again = "  where is my order 88412?  it never came, and i need it before friday"
    assert matcher.match(again) == "file:s/a"
    # near-duplicates: a typo (3-gram Jaccard 0.93), commas dropped (0.92)
    assert matcher.match(item.replace("order", "ordr")) == "file:s/a"
    assert matcher.match(item.replace(",", "")) == "file:s/a"
    # a word added moves it below 0.9; another order number is another question
    assert matcher.match(item[:-1] + " please") is None
    assert matcher.match(item.replace("88412", "55109")) is None
    assert matcher.match("") is None
    assert NEAR_DUPLICATE_JACCARD == 0.9


def test_a_changed_number_is_another_question_however_short() -> None:
    matcher = SuiteMatcher([SuitePrompt("file:quiz/q4", "Q: capital 4")])
    assert matcher.match("Q: capital 40") is None  # 3-gram Jaccard 10/11, other number
    assert matcher.match("q: capital 4!") == "file:quiz/q4"
