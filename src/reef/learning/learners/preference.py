"""``preference``: a LoRA adapter trained from good/bad feedback, by DPO or KTO.

Reads top to bottom: build DPO pairs (same prompt, different scores; a correction over
the reply it corrected) and KTO examples (unpaired desirable/undesirable replies),
where a tool-using turn's prompt is its whole prefix (earlier tool calls and results,
the tools offered) and its replies may be tool calls, so the turns of failed and
successful branches of agent trajectories pair at the same prefix; pick the
objective, render the candidate's harness into every prompt as the gateway will serve
it (``render_harness``, default: for a ``harness: managed`` scenario), decide the model
and where to start (the head's adapter, or fresh), train in a child process, store the
adapter by digest.
Torch-free: training happens in ``reef.learning.trainers``' child process.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import combinations
from typing import Any, ClassVar, Literal

from pydantic import Field

from reef.harness import Harness
from reef.learning.base import (
    LearnerConfig,
    LearnerContext,
    LearnerOutput,
    TrainingExample,
)
from reef.learning.learners._examples import (
    correction_text,
    served_text,
    text_messages,
    tool_correction_text,
    tool_messages,
    tool_served_text,
    uses_tools,
)
from reef.learning.learners._model import (
    ModelLearner,
    RayTrainerSettings,
    fresh_work_dir,
    head_adapter,
    model_source,
    train_adapter,
    trained_weights,
)
from reef.learning.learners._served import (
    served_harness,
    served_harness_output,
    served_prompt,
)
from reef.learning.trainers.spec import (
    DpoLossType,
    PreferencePair,
    PreferenceSpec,
    UnpairedExample,
)


class PreferenceConfig(RayTrainerSettings):
    """Settings of the ``preference`` learner (a recipe's learner entry minus ``type``).

    ``objective``: ``auto`` is DPO when the batch yields pairs, else KTO. ``beta``: the
    strength of the pull towards the reference model. ``loss_type``: DPO's loss, TRL's
    ``loss_type`` of that name (``sigmoid``, ``hinge`` or ``ipo``). ``desirable_weight``
    and ``undesirable_weight``: KTO's weights of the two classes, as TRL's (raise the
    rarer class's so that weight times count is about even). ``good_score``: replies scoring at
    least this are desirable (KTO); ``bad_score``: at most this, undesirable. Pairs need
    only different scores at the same prompt; for tool-using turns that is the same
    whole prefix (calls, tool results, tools offered), and either side may be tool
    calls (``preference_pairs``). ``max_seq_len``: longer prompts lose whole early
    turns; a pair that still does not fit is skipped, never cut. How long it trains:
    ``epochs`` passes over the pairs (or examples) with the budget settings of
    ``SFTConfig``. Other settings as in ``SFTConfig``.
    """

    objective: Literal["auto", "dpo", "kto"] = "auto"
    beta: float = Field(default=0.1, gt=0.0)
    loss_type: DpoLossType = "sigmoid"
    desirable_weight: float = Field(default=1.0, gt=0.0, le=100.0)
    undesirable_weight: float = Field(default=1.0, gt=0.0, le=100.0)
    epochs: float = Field(default=3.0, gt=0.0, le=1000.0)
    good_score: float = 1.0
    bad_score: float = 0.0


@dataclass(frozen=True)
class PreferenceItem:
    """One item as the preference learner reads it: the prompt as the trainer takes
    it (``messages`` and the ``tools`` offered), the key of that prompt (items with
    equal keys share the prefix), and the served reply and the correction as text (a
    tool-using turn's replies in the engine's format, tool calls as ``<tool_call>``
    blocks); ``tools_used``: whether it is such a turn."""

    item: TrainingExample
    key: str
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]]
    served: str | None
    fixed: str | None
    tools_used: bool = False


def read_item(item: TrainingExample) -> PreferenceItem | None:
    """``item`` as a :class:`PreferenceItem`; None without messages.

    A text-only item's prompt is its messages as text, keyed on that. A tool-using
    item (``uses_tools``) keeps the whole prefix: earlier assistant tool calls, the
    tool results and the tools offered, keyed on all of it, so two turns pair only
    when everything before the reply is the same (call ids aside: an agent's replay of
    a trajectory gets fresh ids, and the engine's format renders none).
    """
    if not item.messages:
        return None
    if not uses_tools(item):
        messages = text_messages(item.messages)
        key = json.dumps(messages, sort_keys=True)
        return PreferenceItem(item, key, messages, [], served_text(item), correction_text(item))
    messages, tools = tool_messages(item.messages), list(item.tools)
    key = json.dumps({"messages": _without_call_ids(messages), "tools": tools}, sort_keys=True)
    served, fixed = tool_served_text(item), tool_correction_text(item)
    return PreferenceItem(item, key, messages, tools, served, fixed, tools_used=True)


def _without_call_ids(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``messages`` with each tool-call id replaced by its order of appearance, in the
    calls and in the results that answer them (which result answers which call stays
    part of the prefix; the id's spelling does not)."""
    order: dict[str, str] = {}

    def number(call_id: Any) -> str:
        return order.setdefault(str(call_id), f"call_{len(order)}")

    out = []
    for message in messages:
        copied = dict(message)
        if copied.get("tool_calls"):
            copied["tool_calls"] = [
                {**call, "id": number(call.get("id"))} for call in copied["tool_calls"]
            ]
        if copied.get("tool_call_id"):
            copied["tool_call_id"] = number(copied["tool_call_id"])
        out.append(copied)
    return out


def preference_pairs(train: list[TrainingExample]) -> tuple[list[PreferencePair], list[str]]:
    """DPO pairs of ``train`` and the record ids they came from (in batch order).

    Items with the same prompt and different scores pair up: the higher-scored served
    reply is chosen, the lower rejected. A corrected item also pairs its correction
    (chosen) with its served reply (rejected). Identical replies never pair; a pair's
    weight is the lower of its items' weights.

    The same prompt is the same canonical ``messages`` as text for text-only items;
    for tool-using turns of agent trajectories, the same whole prefix (``read_item``):
    a failed branch's turn and a successful branch's turn after the same calls and
    results pair (their credited ``score`` decides which is chosen), a correction is
    chosen over every turn at the prefix that scored no better than the one it
    corrected, and turns after different tool results never pair. Either side may be
    tool calls, in the engine's format, trained against the same tools and history.
    """
    groups: dict[str, list[PreferenceItem]] = {}
    for item in train:
        turn = read_item(item)
        if turn is not None:
            groups.setdefault(turn.key, []).append(turn)
    pairs: list[PreferencePair] = []
    seen: set[tuple[str, str, str]] = set()
    used: set[str] = set()

    def add(key: str, chosen: str, rejected: str, *turns: PreferenceItem) -> None:
        if chosen == rejected or (key, chosen, rejected) in seen:
            return
        seen.add((key, chosen, rejected))
        weight = min(t.item.weight for t in turns)
        first = turns[0]
        pairs.append(
            PreferencePair(
                messages=first.messages,
                chosen=chosen,
                rejected=rejected,
                weight=weight,
                tools=first.tools,
            )
        )
        used.update(t.item.record_id for t in turns)

    for key, turns in groups.items():
        for chosen, rejected, sources in _candidates(turns):
            add(key, chosen, rejected, *sources)
    return pairs, [i.record_id for i in train if i.record_id in used]


def _no_better(fixed: PreferenceItem, turns: list[PreferenceItem]) -> list[PreferenceItem]:
    """The other served, scored turns of ``turns`` that scored no better than the
    corrected ``fixed`` (none when ``fixed`` is unscored)."""
    ceiling = fixed.item.score
    if ceiling is None:
        return []
    return [
        t
        for t in turns
        if t is not fixed
        and t.served is not None
        and t.item.score is not None
        and t.item.score <= ceiling
    ]


def _candidates(
    turns: list[PreferenceItem],
) -> Iterator[tuple[str, str, tuple[PreferenceItem, ...]]]:
    """(chosen, rejected, the items behind them) of one prompt's items, in order: each
    correction over its own served reply; for tool-using turns, also each correction
    over the served reply of every other turn at the prefix that scored no better than
    the corrected one (a failed branch, rejected against the corrected turn); then, by
    score, each higher-scored served reply over each lower one."""
    for turn in turns:
        if turn.fixed is not None and turn.served is not None:
            yield turn.fixed, turn.served, (turn,)
    for fixed in turns:
        if fixed.fixed is not None and fixed.tools_used:
            for other in _no_better(fixed, turns):
                yield fixed.fixed, str(other.served), (fixed, other)
    scored = [t for t in turns if t.item.score is not None and t.served is not None]
    for a, b in combinations(scored, 2):
        assert a.item.score is not None and b.item.score is not None
        if a.item.score == b.item.score:
            continue
        high, low = (a, b) if a.item.score > b.item.score else (b, a)
        yield str(high.served), str(low.served), (high, low)


def unpaired_examples(
    train: list[TrainingExample], good_score: float, bad_score: float
) -> tuple[list[UnpairedExample], list[str]]:
    """KTO examples of ``train`` and the record ids they came from.

    A correction is desirable, and the reply it corrected undesirable unless its score
    reaches ``good_score``; so is a reply a conversation signal complained about without
    giving the right value (``complaint_without_value``: it still teaches what not to
    say); otherwise a served reply is desirable at ``score >= good_score``, undesirable
    at ``score <= bad_score``, and unused in between or unscored. Tool-using turns keep
    their whole prefix and tools, and their replies' tool calls (``read_item``).
    """
    examples: list[UnpairedExample] = []
    used: list[str] = []
    for item in train:
        turn = read_item(item)
        if turn is None:
            continue
        fixed, served = turn.fixed, turn.served
        found: list[tuple[str, bool]] = []
        if fixed is not None:
            found.append((fixed, True))
        if served is not None and served != fixed:
            if item.score is not None and item.score >= good_score:
                found.append((served, True))
            elif (
                fixed is not None
                or item.complaint_without_value
                or (item.score is not None and item.score <= bad_score)
            ):
                found.append((served, False))
        for target, desirable in found:
            examples.append(
                UnpairedExample(
                    messages=turn.messages,
                    target=target,
                    desirable=desirable,
                    weight=item.weight,
                    tools=turn.tools,
                )
            )
        if found:
            used.append(item.record_id)
    return examples, used


def as_served(
    harness: Harness | None, pairs: list[PreferencePair], examples: list[UnpairedExample]
) -> tuple[list[PreferencePair], list[UnpairedExample]]:
    """``pairs`` and ``examples`` with ``harness`` rendered into their prompts, as the
    gateway will serve them (``reef.learning.learners._served``); None: unchanged.
    Pairing is decided on the prompts as recorded, before this."""
    if harness is None:
        return pairs, examples

    def served(item: PreferencePair | UnpairedExample) -> dict[str, Any]:
        messages, tools = served_prompt(harness, item.messages, item.tools)
        return {"messages": messages, "tools": tools}

    return (
        [pair.model_copy(update=served(pair)) for pair in pairs],
        [example.model_copy(update=served(example)) for example in examples],
    )


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
        pairs, examples = as_served(served_harness(context, cfg), pairs, examples)
        model = model_source("preference", self.settings.model, context)
        work = fresh_work_dir(context, "preference")
        spec = PreferenceSpec(
            objective=objective,
            model=trained_weights(context, model, work),
            home=context.home,
            pairs=pairs,
            examples=examples,
            output_dir=work / "adapter",
            base_adapter=head_adapter(context, model, work, self.settings.continue_from_head),
            lora=cfg.lora(),
            beta=cfg.beta,
            loss_type=cfg.loss_type,
            desirable_weight=cfg.desirable_weight,
            undesirable_weight=cfg.undesirable_weight,
            **cfg.run_settings(),
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
        extra = (
            "tokens",
            "seconds",
            "tokens_per_second",
            "skipped",
            "bf16",
            "loss_type",
            "kl_curve",
        )
        reported = (*keys, *budget_keys, *extra)
        metrics = {k: result.metrics[k] for k in reported if k in result.metrics}
        metrics.update(
            objective=objective,
            pairs=len(pairs),
            examples=len(examples),
            continued=result.metrics["continued"],
            base=model,
        )
        harness = served_harness_output(context, cfg)
        return LearnerOutput(adapter=digest, harness=harness, consumed=used, metrics=metrics)
