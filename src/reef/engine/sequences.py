"""What the worker tracks per generated sequence: sampling, text, stop strings.

Torch-free apart from the sampling call, so the rules (hold-back for stop strings and
half-decoded characters, finish reasons) read in one place.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from reef.engine.adapters import AdapterLease

FinishReason = Literal["stop", "length"]


@dataclass(frozen=True)
class SamplingParams:
    """How to sample one request's sequences. ``temperature == 0`` is greedy.

    ``logprobs`` of each chosen token are from the model's raw distribution (before
    temperature and top-p), as vLLM reports them by default.
    """

    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    logprobs: bool = False
    top_logprobs: int = 0


@dataclass(frozen=True)
class TokenLogprob:
    """A chosen token's logprob and the ``top`` alternatives as ``(token_id, logprob)``."""

    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


@dataclass(frozen=True)
class ChoiceDelta:
    """New output of one sequence since the last delta; the last one has a reason."""

    index: int
    text: str
    token_ids: tuple[int, ...]
    logprobs: tuple[TokenLogprob, ...]
    finish_reason: FinishReason | None


BASE_KEY = "base"
"""The scheduler's key of the weights the engine started with."""


@dataclass(eq=False)
class GenerationJob:
    """One request as the worker sees it: ``n`` sequences of one prompt on one adapter.

    ``sink`` receives every delta, on the worker thread; it must not block. ``done`` is
    called once, on the worker thread, after the last delta or when the job was
    cancelled or failed (with the exception).
    """

    prompt_ids: tuple[int, ...]
    params: SamplingParams
    n: int
    adapter: AdapterLease | None
    sink: Callable[[ChoiceDelta], None]
    done: Callable[[BaseException | None], None]
    cancelled: threading.Event = field(default_factory=threading.Event)
    remaining: int = 0

    def __post_init__(self) -> None:
        self.remaining = self.n

    @property
    def adapter_key(self) -> str:
        """The internal adapter name rows of this job run under (``__base__`` for none)."""
        if self.adapter is None or self.adapter.version.kind == "checkpoint":
            return "__base__"
        return self.adapter.internal_name

    @property
    def base_key(self) -> str:
        """The base weights rows of this job run on: ``BASE_KEY`` (the model the engine
        started with) or a loaded checkpoint's internal name (the checkpoint itself, or
        the one its adapter is loaded on)."""
        if self.adapter is None:
            return BASE_KEY
        version = self.adapter.version
        if version.kind == "checkpoint":
            return version.internal_name
        if version.base is not None:  # an adapter on a checkpoint
            return version.base.internal_name
        return BASE_KEY


class Sequence:
    """One row of the batch: its tokens so far, text emitted, stop-string watch."""

    def __init__(self, job: GenerationJob, index: int, eos_ids: frozenset[int]) -> None:
        self.job = job
        self.index = index
        self.eos_ids = eos_ids
        self.token_ids: list[int] = []
        self.text_ids: list[int] = []
        self.emitted = 0
        self.finish_reason: FinishReason | None = None
        self.hold = max((len(s) for s in job.params.stop), default=1) - 1

    def push(
        self, token_id: int, logprob: TokenLogprob | None, decode: Callable[[list[int]], str]
    ) -> ChoiceDelta:
        """Take the next sampled token; return the delta to send (maybe empty text).

        ``decode`` turns token ids into text, skipping special tokens.
        """
        self.token_ids.append(token_id)
        params = self.job.params
        if token_id in self.eos_ids:
            self.finish_reason = "stop"
        else:
            self.text_ids.append(token_id)
            if len(self.token_ids) >= params.max_tokens:
                self.finish_reason = "length"
        full = decode(self.text_ids)
        end = len(full)
        stop_at = self._find_stop(full)
        if stop_at is not None:
            end = stop_at
            self.finish_reason = "stop"
        elif self.finish_reason is None:
            end = len(full.rstrip("\ufffd")) - self.hold  # half a character, half a stop
        text = full[self.emitted : max(end, self.emitted)]
        self.emitted = max(end, self.emitted)
        logprobs = (logprob,) if logprob is not None else ()
        return ChoiceDelta(self.index, text, (token_id,), logprobs, self.finish_reason)

    def _find_stop(self, full: str) -> int | None:
        stops = self.job.params.stop
        if not stops:
            return None
        start = max(0, self.emitted - self.hold)
        found = [p for p in (full.find(s, start) for s in stops) if p >= 0]
        return min(found) if found else None
