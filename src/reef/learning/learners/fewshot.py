"""``fewshot``: the harness's few-shot demonstrations, chosen from the best experience.

Candidates are training examples with a correction (the correction becomes the
assistant turn) or a score of at least ``min_score`` (the served reply is the assistant
turn). Relevance is 1.0 for a corrected example, else its score (when scores lie in
[0, 1]; otherwise rescaled into [0.5, 1] over the candidates), times the example's
``weight`` (stale items count less); equal relevance is ranked by content
(``content_hash``), so the same experience gives the same demos whatever order it
arrived in. Maximal
marginal relevance then orders them (``relevance_weight`` trades relevance against
similarity to demos already taken; token Jaccard by default, MiniLM embeddings with
``similarity: embedding``) and takes demos while they fit: at most ``k`` and
``max_tokens`` in all (``len(text) / 4`` per demo unless ``tokenizer`` names a
``tokenizer.json``). Demos whose text trips the injection scan are never used.

Every inference key of the scenario can download the harness, so a demo must not carry
one customer's data to another: with ``scrub_personal_data`` (the default) e-mail
addresses, phone numbers, card numbers, IBANs, IP addresses, US SSNs, street addresses,
secrets and links with credentials in the demo become typed placeholders (``<EMAIL>``,
``<PHONE>``, …; ``reef.experience.personal_data``), counted in ``metrics.scrubbed``.
"""

from __future__ import annotations

import importlib
import math
from collections import Counter
from collections.abc import Callable
from functools import cache
from typing import Any, ClassVar, Literal

from pydantic import Field

from reef.core.jsoncodec import canonical_json
from reef.harness import Example, Harness, scan_for_injection
from reef.learning.base import (
    Learner,
    LearnerConfig,
    LearnerContext,
    LearnerOutput,
    TrainingExample,
)
from reef.learning.learners._errors import NoCandidateError
from reef.learning.learners._examples import scrubbed_example
from reef.learning.learners._harness import head_bundle, replace_fields, store_bundle
from reef.learning.learners._similarity import example_text, mmr_order, similarity_matrix
from reef.upstream.canonical import openai_chat_message


class FewShotConfig(LearnerConfig):
    """Settings of the ``fewshot`` learner (module docstring)."""

    k: int = Field(default=4, ge=1, le=64)
    max_tokens: int = Field(default=1500, ge=1)
    min_score: float = 0.7
    relevance_weight: float = Field(default=0.7, ge=0.0, le=1.0)
    similarity: Literal["lexical", "embedding"] = "lexical"
    tokenizer: str | None = None
    pool_size: int = Field(default=200, ge=1)
    scrub_personal_data: bool = True


class FewShotLearner(Learner):
    """Replaces the head harness's ``examples`` with diverse, high-value demonstrations."""

    type_name: ClassVar[str] = "fewshot"
    kind: ClassVar[Literal["harness", "model"]] = "harness"
    config_model: ClassVar[type[LearnerConfig]] = FewShotConfig

    def learn(self, context: LearnerContext) -> LearnerOutput:
        """Pick demos from ``context.batch.train``; raises ``NoCandidateError`` when no
        example qualifies or none fits the budget."""
        config = self.config
        assert isinstance(config, FewShotConfig)
        scrubbed: Counter[str] = Counter()
        demos, pool = _candidates(context.batch.train, config, scrubbed)
        if not demos:
            raise NoCandidateError("fewshot: no corrected or high-scoring example in the batch")
        count_tokens = _token_counter(config.tokenizer)
        sizes = [count_tokens(_demo_text(demo)) for _, demo in demos]
        relevance = [r for r, _ in pool]
        similarity = similarity_matrix([example_text(e) for _, e in pool], config.similarity)
        budget = {"tokens": 0, "taken": 0}

        def fits(index: int) -> bool:
            if budget["taken"] >= config.k or budget["tokens"] + sizes[index] > config.max_tokens:
                return False
            budget["tokens"] += sizes[index]
            budget["taken"] += 1
            return True

        order = mmr_order(relevance, similarity, config.relevance_weight, fits)
        if not order:
            raise NoCandidateError(f"fewshot: no demonstration fits max_tokens={config.max_tokens}")
        chosen = [demos[i] for i in order]
        bundle = replace_fields(
            head_bundle(context), examples=[d.model_dump(mode="json") for _, d in chosen]
        )
        digest = store_bundle(context, bundle)
        consumed = [rid for e, _ in chosen for rid in (e.source_ids or (e.record_id,))]
        context.metrics.record("fewshot.demos", float(len(chosen)))
        context.metrics.record("fewshot.tokens", float(budget["tokens"]))
        return LearnerOutput(
            harness=digest,
            consumed=list(dict.fromkeys(consumed)),
            metrics={
                "demos": len(chosen),
                "tokens": budget["tokens"],
                "candidates": len(demos),
                "record_ids": [e.record_id for e, _ in chosen],
                "scrubbed": dict(sorted(scrubbed.items())),
            },
        )


def _candidates(
    train: list[TrainingExample], config: FewShotConfig, scrubbed: Counter[str]
) -> tuple[list[tuple[TrainingExample, Example]], list[tuple[float, TrainingExample]]]:
    """Qualifying examples as demos, best first, at most ``pool_size``; with relevance.
    ``scrubbed`` counts the personal data taken out of them, by kind."""
    scored = [
        e
        for e in train
        if e.correction is not None or (e.score is not None and e.score >= config.min_score)
    ]
    scores = [e.score for e in scored if e.correction is None and e.score is not None]
    low, high = (min(scores), max(scores)) if scores else (0.0, 0.0)

    def relevance(example: TrainingExample) -> float:
        if example.correction is not None or example.score is None:
            base = 1.0
        elif low >= 0.0 and high <= 1.0:
            base = example.score
        elif high > low:
            # Scores on another scale: every candidate already passed min_score, so
            # rescale into [0.5, 1] rather than ranking the weakest at zero.
            base = 0.5 + 0.5 * (example.score - low) / (high - low)
        else:
            base = 1.0
        return base * example.weight

    # Equal relevance (every correction scores 1.0) goes by content, not by record id:
    # the ids follow arrival, which concurrent traffic changes from run to run, so the
    # same traffic picked other demos on each run (issue 44).
    ranked = sorted(scored, key=lambda e: (-relevance(e), e.content_hash, e.record_id))
    demos: list[tuple[TrainingExample, Example]] = []
    pool: list[tuple[float, TrainingExample]] = []
    for example in ranked:
        demo = demonstration(example, scrubbed if config.scrub_personal_data else None)
        if demo is None:
            continue
        demos.append((example, demo))
        pool.append((relevance(example), example))
        if len(demos) >= config.pool_size:
            break
    return demos, pool


def demonstration(example: TrainingExample, scrubbed: Counter[str] | None = None) -> Example | None:
    """The example as a few-shot demo (system turns left out, the correction as the
    reply when there is one); None when it cannot be one or trips the injection scan.
    With ``scrubbed`` (a counter), personal data becomes typed placeholders first."""
    if scrubbed is not None:
        example = scrubbed_example(example, scrubbed)
    turns = [openai_chat_message(m) for m in example.messages if m.get("role") != "system"]
    reply = _reply(example)
    if reply is None or not turns:
        return None
    try:
        demo = Example(messages=[*turns, reply], tags=[f"record:{example.record_id}"])
    except ValueError:
        return None
    if scan_for_injection(Harness(schema_version=1, examples=[demo])):
        return None
    return demo


def _reply(example: TrainingExample) -> dict[str, Any] | None:
    correction = example.correction
    if isinstance(correction, str):
        return {"role": "assistant", "content": correction}
    if isinstance(correction, dict):
        return openai_chat_message({**correction, "role": "assistant"})
    if correction is not None:
        return None
    return None if example.response is None else openai_chat_message(example.response)


def _demo_text(demo: Example) -> str:
    return canonical_json(demo.messages).decode()


def approximate_tokens(text: str) -> int:
    """About four characters per token: cheap, and close enough for a budget."""
    return math.ceil(len(text) / 4)


def _token_counter(tokenizer: str | None) -> Callable[[str], int]:
    if tokenizer is None:
        return approximate_tokens
    loaded = _load_tokenizer(tokenizer)
    return lambda text: len(loaded.encode(text).ids)


@cache
def _load_tokenizer(path: str) -> Any:
    # Imported here: only needed when a tokenizer is configured.
    tokenizers = importlib.import_module("tokenizers")
    return tokenizers.Tokenizer.from_file(path)
