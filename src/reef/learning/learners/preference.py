"""``preference``: a LoRA adapter trained from good/bad feedback, by DPO or KTO.

Reads top to bottom: build DPO pairs (same prompt, different scores; a correction over
the reply it corrected) and KTO examples (unpaired desirable/undesirable replies),
pick the objective, decide the model and where to start (the head's adapter, or
fresh), train in a child process, store the adapter by digest.
Torch-free: training happens in ``reef.learning.trainers``' child process.
"""

from __future__ import annotations

import json
from itertools import combinations
from typing import ClassVar, Literal

from pydantic import Field

from reef.learning.base import (
    LearnerConfig,
    LearnerContext,
    LearnerOutput,
    TrainingExample,
)
from reef.learning.learners._examples import correction_text, served_text, text_messages
from reef.learning.learners._model import (
    ModelLearner,
    RayTrainerSettings,
    fresh_work_dir,
    head_adapter,
    model_source,
    train_adapter,
)
from reef.learning.trainers.spec import (
    PreferencePair,
    PreferenceSpec,
    UnpairedExample,
)


class PreferenceConfig(RayTrainerSettings):
    """Settings of the ``preference`` learner (a recipe's learner entry minus ``type``).

    ``objective``: ``auto`` is DPO when the batch yields pairs, else KTO. ``beta``: the
    strength of the pull towards the reference model. ``good_score``: replies scoring at
    least this are desirable (KTO); ``bad_score``: at most this, undesirable. Pairs need
    only different scores. How long it trains: ``epochs`` passes over the pairs (or
    examples) with the budget settings of ``SFTConfig``. Other settings as in
    ``SFTConfig``.
    """

    objective: Literal["auto", "dpo", "kto"] = "auto"
    beta: float = Field(default=0.1, gt=0.0)
    epochs: float = Field(default=3.0, gt=0.0, le=1000.0)
    good_score: float = 1.0
    bad_score: float = 0.0


def preference_pairs(train: list[TrainingExample]) -> tuple[list[PreferencePair], list[str]]:
    """DPO pairs of ``train`` and the record ids they came from (in batch order).

    Items with the same prompt (the same canonical ``messages``) and different scores
    pair up: the higher-scored served reply is chosen, the lower rejected. A corrected
    item also pairs its correction (chosen) with its served reply (rejected). Identical
    replies never pair; a pair's weight is the lower of its items' weights.
    """
    groups: dict[str, list[TrainingExample]] = {}
    for item in train:
        if item.messages:
            key = json.dumps(text_messages(item.messages), sort_keys=True)
            groups.setdefault(key, []).append(item)
    pairs: list[PreferencePair] = []
    seen: set[tuple[str, str, str]] = set()
    used: set[str] = set()

    def add(key: str, chosen: str, rejected: str, *items: TrainingExample) -> None:
        if chosen == rejected or (key, chosen, rejected) in seen:
            return
        seen.add((key, chosen, rejected))
        weight = min(i.weight for i in items)
        messages = text_messages(items[0].messages)
        pairs.append(
            PreferencePair(messages=messages, chosen=chosen, rejected=rejected, weight=weight)
        )
        used.update(i.record_id for i in items)

    for key, items in groups.items():
        for item in items:
            fixed, served = correction_text(item), served_text(item)
            if fixed is not None and served is not None:
                add(key, fixed, served, item)
        scored = [i for i in items if i.score is not None and served_text(i) is not None]
        for a, b in combinations(scored, 2):
            assert a.score is not None and b.score is not None
            if a.score == b.score:
                continue
            high, low = (a, b) if a.score > b.score else (b, a)
            add(key, str(served_text(high)), str(served_text(low)), high, low)
    return pairs, [i.record_id for i in train if i.record_id in used]


def unpaired_examples(
    train: list[TrainingExample], good_score: float, bad_score: float
) -> tuple[list[UnpairedExample], list[str]]:
    """KTO examples of ``train`` and the record ids they came from.

    A correction is desirable, and the reply it corrected undesirable unless its score
    reaches ``good_score``; otherwise a served reply is desirable at ``score >=
    good_score``, undesirable at ``score <= bad_score``, and unused in between or
    unscored.
    """
    examples: list[UnpairedExample] = []
    used: list[str] = []
    for item in train:
        messages, fixed, served = (
            text_messages(item.messages),
            correction_text(item),
            served_text(item),
        )
        if not messages:
            continue
        found: list[tuple[str, bool]] = []
        if fixed is not None:
            found.append((fixed, True))
        if served is not None and served != fixed:
            if item.score is not None and item.score >= good_score:
                found.append((served, True))
            elif fixed is not None or (item.score is not None and item.score <= bad_score):
                found.append((served, False))
        for target, desirable in found:
            examples.append(
                UnpairedExample(
                    messages=messages, target=target, desirable=desirable, weight=item.weight
                )
            )
        if found:
            used.append(item.record_id)
    return examples, used


class PreferenceLearner(ModelLearner[PreferenceConfig]):
    """DPO or KTO training of a LoRA adapter (see the module docstring)."""

    type_name: ClassVar[str] = "preference"
    config_model: ClassVar[type[LearnerConfig]] = PreferenceConfig

    def learn(self, context: LearnerContext) -> LearnerOutput:
        """DPO on the batch's pairs, or KTO on its scored replies (contract: ``ModelLearner``)."""
        cfg = self.settings
        train = context.batch.train
        pairs, pair_ids = preference_pairs(train)
        objective = cfg.objective
        if objective == "auto":
            objective = "dpo" if pairs else "kto"
        if objective == "dpo":
            examples: list[UnpairedExample] = []
            used, count = pair_ids, len(pairs)
        else:
            pairs = []
            examples, used = unpaired_examples(train, cfg.good_score, cfg.bad_score)
            count = len(examples)
        if not count:
            context.progress.report(1.0, f"preference: nothing to train by {objective}")
            return LearnerOutput(metrics={"objective": objective, "examples": 0})
        model = model_source("preference", self.settings.model, context)
        work = fresh_work_dir(context, "preference")
        spec = PreferenceSpec(
            objective=objective,
            model=model,
            home=context.home,
            pairs=pairs,
            examples=examples,
            output_dir=work / "adapter",
            base_adapter=head_adapter(context, model, work, self.settings.continue_from_head),
            lora=cfg.lora(),
            beta=cfg.beta,
            lr=cfg.lr,
            budget=cfg.budget(),
            batch_size=cfg.batch_size,
            max_seq_len=cfg.max_seq_len,
            seed=cfg.seed,
            device=cfg.device,
            threads=cfg.threads,
        )
        what = "pairs" if objective == "dpo" else "examples"
        context.progress.report(0.0, f"preference: {objective} on {model} with {count} {what}")
        meta = {"objective": objective}
        digest, result = train_adapter(context, "preference", spec, cfg, work, meta)
        context.progress.report(
            1.0, f"preference: adapter {digest} ({result.metrics['stop_reason']})"
        )
        keys = ("loss_curve", "margin_curve", "accuracy_curve", "reward_margin", "reward_accuracy")
        budget_keys = (
            "val_curve", "steps", "steps_planned", "stop_reason", "best_step", "undertrained"
        )  # fmt: skip
        reported = (*keys, *budget_keys, "tokens", "seconds", "tokens_per_second")
        metrics = {k: result.metrics[k] for k in reported if k in result.metrics}
        metrics.update(
            objective=objective,
            pairs=len(pairs),
            examples=len(examples),
            continued=result.metrics["continued"],
            base=model,
        )
        return LearnerOutput(adapter=digest, consumed=used, metrics=metrics)
