"""The worker thread: admits jobs, runs decode steps, applies adapter changes.

Everything that touches the model runs here, one thing at a time: prefill of newly
arrived jobs (joined into the running batch), one decode step for every active row,
and the calls queued by :meth:`Scheduler.call` (adapter load and drop, checkpoint
weights added and removed), which run between steps so no forward pass ever sees a
half-changed model.

Several base weights may be resident: the model the engine started with
(``BASE_KEY``) and loaded checkpoints, each with its own runner and decode batch. A job
runs on the weights its lease names (``GenerationJob.base_key``); each round steps every
batch that has rows, so requests on an old checkpoint finish on it while new ones start
on the new one.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator

import torch

from reef.engine.adapters import AdapterModel
from reef.engine.batch import DecodeBatch
from reef.engine.errors import EngineError
from reef.engine.models import LoadedModel
from reef.engine.prefixes import DEFAULT_BUDGET_BYTES, PrefixCache
from reef.engine.sampling import choose_tokens, row_generator
from reef.engine.sequences import BASE_KEY, GenerationJob, Sequence
from reef.engine.worker_loop import WorkerLoop, default_threads

__all__ = ["Scheduler", "default_threads"]

logger = logging.getLogger("reef.engine")


class Scheduler(WorkerLoop):
    """Continuous batching of :class:`GenerationJob` s on one worker thread
    (:class:`reef.engine.worker_loop.WorkerLoop`: the queues, stop and crash).

    ``max_batch`` bounds the rows decoded together; ``prefill_tokens`` bounds the
    prompt tokens prefilled in one forward pass (a long prompt still goes alone).
    ``threads`` sets torch's intra-op threads (default: all cores but one).
    """

    def __init__(
        self,
        loaded: LoadedModel,
        max_batch: int = 16,
        prefill_tokens: int = 4096,
        threads: int | None = None,
        prefix_cache_bytes: int = DEFAULT_BUDGET_BYTES,
    ):
        super().__init__("reef-engine-worker")
        self.loaded = loaded
        self.threads = threads or default_threads()
        self.runner = AdapterModel(loaded.model)
        self.prefix_cache_bytes = prefix_cache_bytes
        self.batch = DecodeBatch(self.runner, loaded.model.config, PrefixCache(prefix_cache_bytes))
        self.batches: dict[str, DecodeBatch] = {BASE_KEY: self.batch}
        self.max_batch = max_batch
        self.prefill_tokens = prefill_tokens
        self._generators: dict[Sequence, torch.Generator | None] = {}
        self.peak_rows = 0

    def stats(self) -> dict[str, int]:
        """Rows decoding now, jobs waiting, the most rows ever decoded together, and how
        many base weights are resident (the model and loaded checkpoints)."""
        return {
            "running": self.rows(),
            "waiting": len(self._pending),
            "peak_batch": self.peak_rows,
            "weights": len(self.batches),
        }

    def rows(self) -> int:
        """Rows decoding now, on every resident weights."""
        return sum(len(batch) for batch in list(self.batches.values()))

    def add_weights(self, key: str, runner: AdapterModel) -> None:
        """Make ``runner`` (a loaded checkpoint) servable as ``key``. Worker thread only
        (through :meth:`call`)."""
        self.batches[key] = DecodeBatch(
            runner, runner.base.config, PrefixCache(self.prefix_cache_bytes)
        )

    def forget_prefixes(self, adapter: str) -> None:
        """Drop the cached prompt prefixes computed under ``adapter`` (unloaded).
        Worker thread only (through :meth:`call`)."""
        for batch in self.batches.values():
            batch.prefixes.forget(adapter)

    def prefix_stats(self) -> dict[str, int]:
        """The prompt-prefix caches of every resident weights, summed
        (``PrefixCache.stats``)."""
        total: dict[str, int] = {}
        for batch in list(self.batches.values()):
            for key, value in batch.prefixes.stats().items():
                total[key] = total.get(key, 0) + value
        return total

    def remove_weights(self, key: str) -> None:
        """Forget the weights ``key`` (no lease holds them, so no row runs on them).
        Worker thread only (through :meth:`call`)."""
        batch = self.batches.pop(key, None)
        if batch is not None and len(batch):  # pragma: no cover - leases prevent it
            self._fail_jobs({row.job for row in batch.rows}, EngineError("weights unloaded"))

    def _decode(self, token_ids: list[int]) -> str:
        return str(self.loaded.tokenizer.decode(token_ids, skip_special_tokens=True))

    @contextlib.contextmanager
    def _around(self) -> Iterator[None]:
        torch.set_num_threads(self.threads)
        with torch.inference_mode():
            yield

    def _has_rows(self) -> bool:
        return self.rows() > 0

    def _step(self) -> None:
        self._drop_cancelled()
        self._admit()
        self.peak_rows = max(self.peak_rows, self.rows())
        for batch in list(self.batches.values()):
            if len(batch):
                self._advance(batch, 0, batch.step())

    def _admit(self) -> None:
        groups: dict[str, list[Sequence]] = {}
        tokens = 0
        running = self.rows()
        with self._wake:
            while self._pending:
                job = self._pending[0]
                if job.cancelled.is_set():
                    self._pending.popleft()
                    job.done(None)
                    continue
                size = len(job.prompt_ids) * job.n
                taken = sum(len(rows) for rows in groups.values())
                room = running + taken + job.n <= max(self.max_batch, job.n)
                if not room or (taken and tokens + size > self.prefill_tokens):
                    break
                self._pending.popleft()
                tokens += size
                rows = groups.setdefault(job.base_key, [])
                for index in range(job.n):
                    row = Sequence(job, index, self.loaded.eos_token_ids)
                    self._generators[row] = row_generator(job.params, index)
                    rows.append(row)
        for key, rows in groups.items():
            self._prefill(key, rows)

    def _prefill(self, key: str, rows: list[Sequence]) -> None:
        batch = self.batches.get(key)
        if batch is None:  # pragma: no cover - a lease keeps its weights resident
            self._fail_jobs({row.job for row in rows}, EngineError(f"weights {key} are gone"))
            return
        start = len(batch)
        try:
            logits = batch.prefill(rows)
        except Exception as exc:
            self._fail_jobs({row.job for row in rows}, exc)
            return
        self._advance(batch, start, logits)

    def _advance(self, batch: DecodeBatch, start: int, logits: torch.Tensor) -> None:
        """Sample for ``batch``'s rows ``start …`` from ``logits``, emit deltas, drop
        finished rows."""
        rows = batch.rows[start : start + len(logits)]
        chosen = choose_tokens(
            logits, [row.job.params for row in rows], [self._generators[row] for row in rows]
        )
        batch.set_next_tokens(start, torch.tensor([token for token, _ in chosen]))
        finished: set[int] = set()
        for offset, (row, (token, logprob)) in enumerate(zip(rows, chosen, strict=True)):
            row.job.sink(row.push(token, logprob, self._decode))
            if row.finish_reason is not None:
                finished.add(start + offset)
                self._row_done(row)
        if finished:
            batch.keep([i for i in range(len(batch)) if i not in finished])

    def _row_done(self, row: Sequence) -> None:
        self._generators.pop(row, None)
        row.job.remaining -= 1
        if row.job.remaining == 0:
            row.job.done(None)

    def _all_rows(self) -> list[Sequence]:
        return [row for batch in self.batches.values() for row in batch.rows]

    def _drop_cancelled(self) -> None:
        dropped: set[GenerationJob] = set()
        for batch in self.batches.values():
            cancelled = {i for i, row in enumerate(batch.rows) if row.job.cancelled.is_set()}
            if cancelled:
                dropped |= {batch.rows[i].job for i in cancelled}
                batch.keep([i for i in range(len(batch)) if i not in cancelled])
        if not dropped:
            return
        for job in dropped:
            job.remaining = 0
            job.done(None)
        self._generators = {row: self._generators[row] for row in self._all_rows()}

    def _fail_jobs(self, jobs: set[GenerationJob], exc: BaseException) -> None:
        logger.error("generation failed: %s", exc)
        for batch in self.batches.values():
            batch.keep([i for i, row in enumerate(batch.rows) if row.job not in jobs])
        self._generators = {
            row: gen for row, gen in self._generators.items() if row.job not in jobs
        }
        for job in jobs:
            job.remaining = 0
            job.done(exc)

    def _release_rows(self) -> set[GenerationJob]:
        return {row.job for row in self._all_rows()}
