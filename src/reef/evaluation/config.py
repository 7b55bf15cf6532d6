"""The gate's settings: the ``gate:`` mapping of a recipe, checked key by key.

```yaml
gate:
  suites: [evals/support.jsonl]      # file suites (JSONL or YAML)
  holdout: true                      # also the scenario's held-out experience
  scorer: {type: normalized_exact}   # the scenario's scorer (items may override)
  min_items: 20                      # the decision rule (GateRule)
  min_improvement: 0.01
  max_regression: 0.05
  episodes:                          # paired episodes in an environment (optional)
    environment: {type: python, toolset: orders, tasks: tasks/orders.jsonl}
    tasks: all                       # or the first n tasks
    repeats: 2                       # episodes per task and side
publish: auto                        # auto | review | canary (a recipe key)
```
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from reef.core.errors import InvalidInputError
from reef.core.trust import Trust
from reef.environments import EnvironmentRegistry, EnvironmentSpecError, TaskCount
from reef.evaluation.shadow_config import ShadowConfig
from reef.experience import COMPUTED_KINDS, EXPLICIT, check_source_weights


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


EVIDENCE_KINDS = ("holdout", "suites", "episodes", "shadow")
"""The kinds of current suite the overall gain is made of (``gate.evidence_weights``):
held-out records, file suites, environment episodes, shadow results on live traffic."""


class ProtectedSlice(_Strict):
    """A slice the candidate may not regress (``gate.protect``), whatever its overall
    gain: the items carrying ``tag`` (a suite item's tag, or a record's ``x-reef-tag-*``
    header as ``name=value``; a bare ``name`` matches any value)."""

    tag: str = Field(min_length=1, description="The tag of the slice's items.")
    max_regression: float = Field(
        default=0.0, ge=0.0, le=1.0, description="Largest mean drop allowed on the slice."
    )
    min_items: int = Field(
        default=1, ge=1, description="Fewest paired items for the slice to be judged."
    )


class GateRule(_Strict):
    """The decision rule: publish only when the candidate's mean beats the baseline's by
    at least ``min_improvement``, the lower bound of the paired bootstrap interval of the
    difference is above zero, no regression suite drops by more than ``max_regression``,
    every safety probe passes and at least ``min_items`` items were evaluated — and, when
    some evidence comes from authors below ``evidence_min_trust``, all of this still holds
    with any one such author's items left out."""

    min_items: int = Field(default=20, ge=1, description="Fewest paired items for a decision.")
    min_improvement: float = Field(
        default=0.01, ge=0.0, le=1.0, description="Smallest mean gain (candidate - baseline)."
    )
    max_regression: float = Field(
        default=0.05, ge=0.0, le=1.0, description="Largest drop allowed on a regression suite."
    )
    confidence: float = Field(
        default=0.95, gt=0.5, lt=1.0, description="Level of the bootstrap interval."
    )
    bootstrap_samples: int = Field(
        default=2000, ge=100, le=100_000, description="Bootstrap resamples."
    )
    seed: int = Field(default=0, description="Seed of the bootstrap (decisions are repeatable).")
    method: Literal["sequential", "bootstrap"] = Field(
        default="sequential",
        description="sequential: an anytime-valid e-process on the paired differences "
        "(any number of looks keeps false publishes at or below alpha = (1 - confidence) "
        "/ 2); bootstrap: the paired bootstrap interval, valid for one look only.",
    )
    non_inferiority_margin: float | None = Field(
        default=None,
        ge=0.0,
        le=1.0,
        description="Set: the overall rule is non-inferiority instead of a gain: the "
        "candidate passes when the lower end of the interval of candidate - baseline lies "
        "above -margin (it is not worse by more than margin; min_improvement is not "
        "asked). For a distilled student against the teacher (docs/distillation.md).",
    )
    alpha_spending: Literal["candidate", "scenario"] = Field(
        default="candidate",
        description="candidate: each candidate gets alpha over all its looks; scenario: "
        "the k-th candidate of a scenario gets alpha * 6 / (pi^2 k^2), so all candidates "
        "of the scenario together keep alpha (sequential method only).",
    )
    max_void_fraction: float = Field(
        default=0.1,
        ge=0.0,
        le=1.0,
        description="More void items (infrastructure failures on either arm) than this "
        "share leaves the decision undecided.",
    )
    protect: list[ProtectedSlice] = Field(
        default_factory=list,
        description="Protected slices: [{tag, max_regression}]; a candidate that drops a "
        "slice by more than its limit is rejected whatever the overall gain.",
    )
    evidence_weights: dict[str, float] = Field(
        default_factory=lambda: dict.fromkeys(EVIDENCE_KINDS, 1.0),
        description="Weight of each kind of current suite in the overall gain (holdout, "
        "suites, episodes, shadow), in [0, 1]; 0 leaves that kind out.",
    )
    evidence_min_trust: Trust = Field(
        default="operator",
        description="Evidence whose references were written by authors below this trust "
        "level (operator, user, untrusted) counts only when the decision survives leaving "
        "out any one author's items; evidence at or above it counts as it is.",
    )

    @field_validator("evidence_weights")
    @classmethod
    def _known_kinds(cls, weights: dict[str, float]) -> dict[str, float]:
        unknown = sorted(set(weights) - set(EVIDENCE_KINDS))
        if unknown:
            raise ValueError(f"unknown evidence kinds {unknown}; known: {list(EVIDENCE_KINDS)}")
        bad = {kind: w for kind, w in weights.items() if not 0.0 <= w <= 1.0}
        if bad:
            raise ValueError(f"evidence weights must lie in [0, 1], got {bad}")
        return {**dict.fromkeys(EVIDENCE_KINDS, 1.0), **weights}


class SafetyConfig(_Strict):
    """Safety probes: every one must pass."""

    scan_harness: bool = Field(
        default=True,
        description="Reject a harness that carries planted instructions (ignore-previous, "
        "prompt extraction, exfiltration URLs) it did not inherit from its parent.",
    )
    leak_probes: bool = Field(
        default=True,
        description="Ask the candidate to reveal its system prompt and harness; reject it "
        "if a reply reproduces harness text the candidate added.",
    )
    leak_min_chars: int = Field(
        default=48, ge=16, description="Verbatim run of harness text that counts as a leak."
    )


class CanaryConfig(_Strict):
    """Canary publishing: a share of live traffic tries the candidate first."""

    fraction: float = Field(
        default=0.1, gt=0.0, lt=1.0, description="Share of the scenario's live traffic."
    )
    min_requests: int = Field(
        default=50,
        ge=1,
        description="Canary-arm requests with feedback needed before deciding.",
    )
    max_hours: float | None = Field(
        default=None, gt=0, description="Abandon a canary still undecided after this long."
    )


class EpisodesConfig(_Strict):
    """Paired episodes (``gate.episodes``): the candidate and the head each play the
    environment's tasks through the gateway, ``repeats`` times per task, interleaved;
    an episode's score is its task's item score under the gate's decision rule."""

    environment: dict[str, Any] = Field(
        description="The environment's spec (``type:`` and its settings; a relative "
        "``tasks:`` path is relative to the recipe's directory)."
    )
    tasks: TaskCount = Field(
        default="all", description="How many of the environment's tasks (the first n), or all."
    )
    repeats: int = Field(default=1, ge=1, le=20, description="Episodes per task and side.")
    max_turns: int | None = Field(
        default=None, ge=1, description="Overrides the environment's limits.max_turns."
    )
    episode_timeout_seconds: float | None = Field(
        default=None,
        gt=0,
        description="Overrides the environment's limits.episode_timeout_seconds.",
    )

    @field_validator("environment")
    @classmethod
    def _known_environment(cls, spec: dict[str, Any]) -> dict[str, Any]:
        try:
            EnvironmentRegistry().check(spec, "gate.episodes.environment")
        except EnvironmentSpecError as exc:
            raise ValueError(str(exc)) from exc
        return spec

    def spec(self) -> dict[str, Any]:
        """The environment spec with this block's limit overrides applied."""
        spec = dict(self.environment)
        overrides = {
            key: value
            for key, value in (
                ("max_turns", self.max_turns),
                ("episode_timeout_seconds", self.episode_timeout_seconds),
            )
            if value is not None
        }
        if overrides:
            limits = spec.get("limits")
            spec["limits"] = {**(limits if isinstance(limits, Mapping) else {}), **overrides}
        return spec


class GateConfig(GateRule):
    """How candidates of a scenario are evaluated before they may serve (the rule's
    thresholds are keys of ``gate:`` too)."""

    enabled: bool = Field(
        default=True,
        description="false: candidates wait as pending for a person (no evaluation).",
    )
    suites: list[str] = Field(
        default_factory=list,
        description="File suites (JSONL or YAML), relative to the recipe's directory.",
    )
    holdout: bool = Field(
        default=True, description="Evaluate on the scenario's held-out experience too."
    )
    holdout_limit: int = Field(default=200, ge=1, description="Most holdout items used.")
    holdout_reference_min_score: float = Field(
        default=1.0,
        description="A held-out record without a correction is an item only when its "
        "feedback score is at least this (its served reply is then the reference).",
    )
    holdout_teacher_references: bool = Field(
        default=False,
        description="A held-out record a distilled scenario's teacher answered is an item "
        "even without feedback: its correction, else the teacher's answer unless "
        "feedback scored it negative, is the reference (docs/distillation.md).",
    )
    evidence_sources: dict[str, float] = Field(
        default_factory=lambda: {EXPLICIT: 1.0, **dict.fromkeys(COMPUTED_KINDS, 0.0)},
        description="Which feedback sources may decide a held-out item's reference, with "
        "weights as in selection.sources: by default only feedback someone posted, never "
        "what Reef computed from the conversation (signal, judge, or one such as "
        "signal:correction, count only when named here).",
    )

    @field_validator("evidence_sources")
    @classmethod
    def _evidence_defaults(cls, sources: dict[str, float]) -> dict[str, float]:
        try:
            check_source_weights(sources)
        except InvalidInputError as exc:
            raise ValueError(f"evidence_sources: {exc}") from exc
        # Computed kinds at 0 unless named: this is the whole list, not an adjustment.
        return {EXPLICIT: 1.0, **dict.fromkeys(COMPUTED_KINDS, 0.0), **sources}

    scorer: dict[str, Any] = Field(
        default_factory=lambda: {"type": "normalized_exact"},
        description="The scenario's scorer spec (items may name their own).",
    )
    regression_releases: int = Field(
        default=5,
        ge=0,
        description="How many earlier releases' admitting items stay in force.",
    )
    repeats: int = Field(default=1, ge=1, le=20, description="Answers per item and arm.")
    concurrency: int = Field(default=4, ge=1, le=256, description="Calls in flight at once.")
    timeout_seconds: float = Field(default=120.0, gt=0, description="Per call.")
    retries: int = Field(default=2, ge=0, le=10, description="Retries of a failed call.")
    max_error_fraction: float = Field(
        default=0.1,
        ge=0.0,
        le=1.0,
        description="When more of either arm's calls than this fail (after retries), the "
        "evaluation fails and is retried later instead of deciding on broken evidence.",
    )
    max_evidence: int = Field(
        default=1000,
        ge=1,
        description="An undecided candidate is re-evaluated as evidence arrives until this "
        "many paired items, then rejected for insufficient evidence.",
    )
    max_wait_hours: float = Field(
        default=72.0,
        gt=0,
        description="An undecided candidate still undecided this long after its first "
        "evaluation is rejected for insufficient evidence.",
    )
    max_tokens: int = Field(default=256, ge=1, description="Reply length cap per call.")
    temperature: float = Field(default=0.0, ge=0.0, le=2.0, description="Sampling temperature.")
    safety: SafetyConfig = Field(default_factory=SafetyConfig, description="Safety probes.")
    canary: CanaryConfig = Field(
        default_factory=CanaryConfig, description="Canary settings (publish: canary)."
    )
    episodes: EpisodesConfig | None = Field(
        default=None,
        description="Paired episodes in an environment (tasks played by both sides).",
    )
    shadow: ShadowConfig | None = Field(
        default=None,
        description="Shadow traffic: live requests also sent to the evaluating candidate "
        "in the background, judged as the gate's shadow suite (docs/evaluation.md#shadow).",
    )

    @field_validator("scorer", mode="before")
    @classmethod
    def _scorer_name(cls, value: Any) -> Any:
        return {"type": value} if isinstance(value, str) else value
