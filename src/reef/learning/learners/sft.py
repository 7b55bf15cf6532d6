"""``sft``: a LoRA adapter trained on corrections and high-scoring replies.

Reads top to bottom: pick the examples (a correction is the target; otherwise a reply
whose score reaches ``min_score``), decide the model and where to start (the head's
adapter, or fresh), train in a child process, store the adapter by digest.
Torch-free: training happens in ``reef.learning.trainers``' child process.

Each example is trained as the candidate will serve it: for a ``harness: managed``
scenario (``render_harness``, default: on for those), the candidate's harness (the
head's, with earlier learners' components) rendered into its messages, as the gateway
renders the scenario's requests (``reef.learning.learners._served``). The trainer also
measures, on a fixed sample of its training prompts, whether its greedy answer is the
target after training (``probe``); the worker asks the candidate the same prompts
through the gateway and fails the job when the two disagree (``reef.learning.skew``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from pydantic import Field

from reef.core.jsoncodec import canonical_json, sha256_hex
from reef.harness import Harness
from reef.learning.base import (
    LearnerConfig,
    LearnerContext,
    LearnerOutput,
    ProbedPrompt,
    TrainingExample,
)
from reef.learning.learners._examples import (
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
from reef.learning.skew import SKEW_SAMPLE
from reef.learning.trainers import (
    Budget,
    SFTExample,
    SFTSpec,
    TrainResult,
)


class SFTConfig(RayTrainerSettings):
    """Settings of the ``sft`` learner (a recipe's learner entry minus ``type``).

    ``model``: the engine model source to train; by default the head's base model when
    the engine can load it (``smollm2-135m``, ``tiny-random`` or a local model
    directory), else required. ``min_score``: replies scoring at least this are
    targets (corrections always are). How long it trains is in terms of the data:
    ``epochs`` passes over the examples, a ``validation_fraction`` of them held out
    inside the trainer for early stopping (``patience`` evaluations without a gain), and
    ``max_steps`` / ``max_minutes`` as caps; ``steps`` trains exactly that many steps
    instead (no validation), for reproductions and tests
    (``reef.learning.trainers.budget``). ``continue_from_head``: start from the head's
    adapter when it has one on the same base. ``trainer``: ``local`` trains in a child
    process, ``ray`` as a Ray task on the cluster at ``ray_address`` (None: a local
    cluster on loopback). ``render_harness``: train on each example with the candidate's
    harness rendered into it (default: for ``harness: managed`` scenarios; module
    docstring). ``replay``: when training continues from the head's adapter, also train on
    ``batch.replay`` (a bounded sample of what earlier releases learned from), so the new
    adapter does not forget it.
    """

    # Calibrated with bench/learning.py (docs/learning.md#how-long-the-model-learners-train):
    # on the 16-item label map from 300 corrections, 5e-4 reached 67% held-out with the
    # validation loss still falling; 1e-3 and 2e-3 both reached 100% in the same 170 steps.
    lr: float = Field(default=1e-3, gt=0.0)
    min_score: float = 1.0
    replay: bool = True
    # Stop once every example was seen and the mean training loss of the last 8 steps
    # is at or below this (nats per target token; None, the default: train the whole
    # budget), the examples learned (``reef.learning.trainers.budget.fitted``). Off by
    # default, measured: at 0.01 the agent quickstart's first round stopped at step 44
    # of 60 (loss 1.00 -> 0.002) and reached 67% held-out episode success against 80%
    # with all 60 steps: the steps after the training loss is ~0 still generalise
    # (docs/training.md).
    fitted_loss: float | None = Field(default=None, ge=0.0, allow_inf_nan=False)
    # Stop after the first pass when its mean training loss is at or below this: the run
    # started out knowing its examples (``reef.learning.trainers.budget.known``).
    known_loss: float | None = Field(default=None, ge=0.0, allow_inf_nan=False)

    def budget(self) -> Budget:
        """The trainer's budget, with the ``fitted_loss`` and ``known_loss`` stops."""
        return (
            super()
            .budget()
            .model_copy(update={"fitted_loss": self.fitted_loss, "known_loss": self.known_loss})
        )


def sft_examples(
    train: list[TrainingExample], min_score: float
) -> tuple[list[SFTExample], list[str]]:
    """The supervised examples of ``train`` and the record ids they came from, in
    ``training_order``.

    A correction is the target whatever the score; a served reply is one when its
    score is at least ``min_score``. Items without a usable target are skipped.
    """
    found: list[tuple[SFTExample, str]] = []
    for item in train:
        good_reply = item.score is not None and item.score >= min_score
        example = supervised_example(item, reply_is_target=good_reply)
        if example is not None:
            found.append((example, item.record_id))
    return training_order(found)


def training_order(found: list[tuple[SFTExample, str]]) -> tuple[list[SFTExample], list[str]]:
    """The examples of ``found`` (each with the record id it came from) ordered by
    ``training_key``, and their record ids in the same order."""
    ordered = sorted(found, key=lambda pair: (training_key(pair[0]), pair[1]))
    return [example for example, _ in ordered], [record_id for _, record_id in ordered]


def training_key(example: SFTExample) -> str:
    """Where ``example`` stands in the training order: a hash of what it teaches (the
    conversation, tools, target and weight; tool-call ids left out, as the engine draws
    them at random and the chat template does not render them).

    The trainer shuffles its examples with its seed, but a shuffle only reproduces the
    order it started from. The batch arrives in record-id order, which is arrival
    order, and concurrent traffic arrives in a different order on every run: the same
    seed then trained on the same examples in a different order (the quickstart's round
    1 started at loss 2.41 on one run and 3.33 on the next). Ordered by content, equal
    data gives equal training; the record id breaks the tie of two equal examples. The
    teacher's token logprobs (logit distillation) are left out: they do not change
    what an example teaches, so a run with them trains in the order of one without."""
    taught = _without_call_ids(example.model_dump(mode="json", exclude={"teacher_tokens"}))
    return sha256_hex(canonical_json(taught))


def _without_call_ids(value: Any) -> Any:
    if isinstance(value, dict):
        return {
            key: _without_call_ids(item)
            for key, item in value.items()
            if key != "tool_call_id" and not (key == "id" and "function" in value)
        }
    if isinstance(value, list):
        return [_without_call_ids(item) for item in value]
    return value


def supervised_example(item: TrainingExample, reply_is_target: bool) -> SFTExample | None:
    """``item`` as a supervised example: its correction as the target, else its served
    reply when ``reply_is_target``; None without a usable target. A turn with tools
    trains with them (the tools offered, earlier calls and results, a target that may
    itself be tool calls); any other as text."""
    if item.correction is None and not reply_is_target:
        return None
    tools: list[dict[str, Any]] = []
    if uses_tools(item):
        # The whole turn as the engine serves it: the tools offered, earlier calls
        # and results, and a reply that may itself be tool calls.
        served = item.correction is None
        target = tool_served_text(item) if served else tool_correction_text(item)
        messages, tools = tool_messages(item.messages), list(item.tools)
    else:
        target, messages = item.target_text(), text_messages(item.messages)
    if not target or not messages:
        return None
    return SFTExample(messages=messages, target=target, weight=item.weight, tools=tools)


def with_harness(examples: list[SFTExample], harness: Harness | None) -> list[SFTExample]:
    """``examples`` with ``harness`` rendered into their messages (system text, rules,
    skills, memory and demos, as the gateway renders a managed scenario's requests);
    ``harness`` None: unchanged."""
    if harness is None:
        return examples
    rendered = []
    for example in examples:
        messages, tools = served_prompt(harness, example.messages, example.tools)
        rendered.append(example.model_copy(update={"messages": messages, "tools": tools}))
    return rendered


@dataclass(frozen=True)
class TrainingSet:
    """What ``sft`` and ``full`` train on: the ``examples`` as the candidate will serve
    them (harness rendered in, when it is), the same ``prompts`` as the client sent them
    (what the skew check asks through the gateway), and the record ids ``used``."""

    examples: list[SFTExample]
    prompts: list[SFTExample]
    used: list[str]


def examples_for(
    context: LearnerContext, cfg: SFTConfig, items: list[TrainingExample]
) -> TrainingSet:
    """``sft_examples`` of ``items`` at ``cfg.min_score``, as the candidate will serve
    them: with its harness rendered in when ``cfg.render_harness`` says so (by default,
    for a ``harness: managed`` scenario; shared by ``sft`` and ``full``)."""
    prompts, used = sft_examples(items, cfg.min_score)
    examples = with_harness(prompts, served_harness(context, cfg))
    return TrainingSet(examples, prompts, used)


def probed_prompts(prompts: list[SFTExample], result: TrainResult) -> tuple[ProbedPrompt, ...]:
    """The trainer's probe (``metrics["probe"]``: ``[index, matched, target tokens]`` of
    ``prompts``, the examples it trained on as the client sent them) as the skew check
    takes it."""
    return tuple(
        ProbedPrompt(
            messages=prompts[index].messages,
            target=prompts[index].target,
            trained=bool(matched),
            target_tokens=int(length),
        )
        for index, matched, length in result.metrics.get("probe", [])
    )


class SFTLearner(ModelLearner[SFTConfig]):
    """Supervised fine-tuning of a LoRA adapter (see the module docstring)."""

    type_name: ClassVar[str] = "sft"
    config_model: ClassVar[type[LearnerConfig]] = SFTConfig

    # What the progress says when the batch gives nothing to train on.
    nothing_to_train: ClassVar[str] = "no corrections or high-score replies"

    def training_set(self, context: LearnerContext, items: list[TrainingExample]) -> TrainingSet:
        """What ``learn`` trains on of ``items`` (the batch, then its replay): here the
        corrections and high-score replies (``examples_for``)."""
        return examples_for(context, self.settings, items)

    def learn(self, context: LearnerContext) -> LearnerOutput:
        """SFT on the batch's corrections and high-score replies (contract: ``ModelLearner``)."""
        cfg, name = self.settings, self.type_name
        found = self.training_set(context, context.batch.train)
        examples, used = found.examples, found.used
        if not examples:
            context.progress.report(1.0, f"{name}: {self.nothing_to_train}; nothing to train")
            return LearnerOutput(metrics={"examples": 0})
        model = model_source(name, self.settings.model, context)
        work = fresh_work_dir(context, name)
        base_adapter = head_adapter(context, model, work, self.settings.continue_from_head)
        replay = TrainingSet([], [], [])
        if cfg.replay and base_adapter is not None:
            replay = self.training_set(context, context.batch.replay)
        replayed = replay.examples
        spec = SFTSpec(
            model=trained_weights(context, model, work),
            home=context.home,
            examples=examples + replayed,
            probe_size=SKEW_SAMPLE,
            output_dir=work / "adapter",
            base_adapter=base_adapter,
            lora=cfg.lora(),
            **cfg.run_settings(),
        )
        context.progress.report(
            0.0, f"{name}: training {model} on {len(examples)} examples + {len(replayed)} replayed"
        )
        digest, result = train_adapter(context, name, spec, cfg, work, {"examples": len(examples)})
        steps = result.metrics["steps"]
        context.progress.report(
            1.0, f"{name}: adapter {digest} ({steps} steps, {result.metrics['stop_reason']})"
        )
        metrics = {k: result.metrics[k] for k in REPORTED if k in result.metrics}
        metrics.update(examples=len(examples), replayed=len(replayed), base=model)
        probe = probed_prompts(found.prompts + replay.prompts, result)
        return LearnerOutput(
            adapter=digest,
            harness=served_harness_output(context, cfg),
            consumed=used,
            metrics=metrics,
            probe=probe,
        )


# What a job reports of a training run: its loss curves and how it stopped.
REPORTED = (
    "loss_curve",
    "val_curve",
    "tokens",
    "seconds",
    "cpu_seconds",
    "tokens_per_second",
    "continued",
    "steps",
    "steps_planned",
    "train_examples",
    "val_examples",
    "epochs_run",
    "stop_reason",
    "best_step",
    "best_val_loss",
    "undertrained",
    "bf16",
    "peak_memory_bytes",  # on CUDA only
    # with logit distillation only (``distill``'s ``logit_weight``)
    "teacher_positions_aligned",
    "teacher_positions_skipped",
    "logit_kl_curve",
)
