"""The engine as the HTTP layer sees it: model, scheduler, adapters and checkpoints
behind async calls.

A checkpoint (full fine-tuned weights of the base model) is served under a name, as an
adapter is: ``load_checkpoint`` checks it (safetensors only, complete shards, the
digest), refuses it when it would not fit beside what is resident (``memory``), loads it
beside the weights already serving (off the worker thread), and publishes the name.
Requests that name it lease it; ``unload_checkpoint`` (or loading another under the same
name) retires it, and its weights are freed once the last request on it finishes. So a
swap from one set of weights to another is: load the new beside the old, flip the
clients to the new name, unload the old (it drains, then frees); no request fails.

An adapter may be loaded on a checkpoint (``load_adapter(..., base=<checkpoint name>)``):
it then runs on that checkpoint's weights, and holds a lease on them for as long as it
is loaded, so unloading the checkpoint first leaves them resident until the adapter goes.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from jinja2 import TemplateError

from reef.core.chat_format import AUTO, ToolChoice, render_tools, template_takes_tools
from reef.core.checkpoints import CheckpointError, CheckpointInfo, check_checkpoint_directory
from reef.engine.adapters import AdapterLease, AdapterModel, AdapterRegistry, AdapterVersion
from reef.engine.digest import check_adapter_directory
from reef.engine.errors import (
    AdapterConflictError,
    BadRequestError,
    CheckpointRejectedError,
    UnknownModelError,
)
from reef.engine.memory import available_memory_bytes, check_fits, required_bytes
from reef.engine.models import LoadedModel, load_checkpoint_model
from reef.engine.openvino import OpenVINOAdapters, OpenVINOWorker
from reef.engine.precision import apply_precision, load_dtype, precision_of
from reef.engine.prefixes import DEFAULT_BUDGET_BYTES
from reef.engine.scheduler import Scheduler
from reef.engine.sequences import BASE_KEY, ChoiceDelta, GenerationJob, SamplingParams

logger = logging.getLogger("reef.engine")


@dataclass(frozen=True)
class _End:
    error: BaseException | None


class GenerationStream:
    """The deltas of one job, as an async iterator; ``cancel`` stops its generation.

    Iteration ends after the last delta; it raises the job's error if it failed.
    """

    def __init__(self) -> None:
        self._queue: asyncio.Queue[ChoiceDelta | _End] = asyncio.Queue()
        self._loop = asyncio.get_running_loop()
        self.job: GenerationJob | None = None
        self.finished = False

    def _put(self, item: ChoiceDelta | _End) -> None:
        # Runs on the worker thread; the loop may already be gone (client and server
        # shut down while the row was still decoding).
        with contextlib.suppress(RuntimeError):
            self._loop.call_soon_threadsafe(self._queue.put_nowait, item)

    def cancel(self) -> None:
        """Ask the worker to drop this job's rows at its next step (idempotent)."""
        if self.job is not None and not self.finished:
            self.job.cancelled.set()

    def __aiter__(self) -> AsyncIterator[ChoiceDelta]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[ChoiceDelta]:
        while True:
            item = await self._queue.get()
            if isinstance(item, _End):
                self.finished = True
                if item.error is not None:
                    raise item.error
                return
            yield item


# The answer length of a request that sends no max_tokens: short enough that a first
# try without it answers in ~10 s on 2 CPU cores (SmolLM2-135M decodes 13-16 tokens/s;
# 512 took ~40 s), long enough for a chat answer; a client that wants more says so.
DEFAULT_MAX_TOKENS = 128


class Engine:
    """A loaded model served with continuous batching and runtime LoRA adapters."""

    def __init__(
        self,
        loaded: LoadedModel,
        max_batch: int = 16,
        default_max_tokens: int = DEFAULT_MAX_TOKENS,
        threads: int | None = None,
        prefix_cache_bytes: int = DEFAULT_BUDGET_BYTES,
        worker: OpenVINOWorker | None = None,
    ) -> None:
        self.loaded = loaded
        self.created = int(time.time())
        self.default_max_tokens = default_max_tokens
        # the eager worker, or another backend's (``worker``: ``reef.engine.openvino``)
        self.scheduler: Scheduler | OpenVINOWorker = worker or Scheduler(
            loaded, max_batch=max_batch, threads=threads, prefix_cache_bytes=prefix_cache_bytes
        )
        self.backend = "eager" if worker is None else "openvino"
        # checkpoints load in the precision the engine serves in (int8: quantized too)
        self.precision = precision_of(loaded.model)
        self.adapters = AdapterRegistry(drop=self._drop_version)
        self.checkpoints = AdapterRegistry(drop=self._drop_weights, what="checkpoint")
        self.available_memory: Callable[[], int | None] = available_memory_bytes
        # where each adapter version lives: its runner and its lease on a checkpoint
        self._placed: dict[str, tuple[AdapterModel | OpenVINOAdapters, AdapterLease | None]] = {}
        self._loading = asyncio.Lock()  # one checkpoint load (and memory check) at a time
        template = loaded.tokenizer.chat_template
        self.template_takes_tools = template_takes_tools(
            template if isinstance(template, str) else None
        )

    @property
    def name(self) -> str:
        """The base model's served name."""
        return self.loaded.name

    def start(self) -> None:
        """Start the worker thread."""
        self.scheduler.start()

    def stop(self) -> None:
        """Stop the worker; unfinished generations end with an error."""
        self.scheduler.stop()

    def lease(self, model: str) -> AdapterLease | None:
        """Resolve a request's ``model``: None for the base model, else a lease on the
        current version of the adapter or checkpoint of that name. Raises
        ``UnknownModelError``."""
        if model == self.name:
            return None
        lease = self.adapters.acquire(model) or self.checkpoints.acquire(model)
        if lease is None:
            raise UnknownModelError(f"The model `{model}` does not exist.")
        return lease

    def release(self, lease: AdapterLease) -> None:
        """Return a lease from :meth:`lease` (idempotent)."""
        registry = self.checkpoints if lease.version.kind == "checkpoint" else self.adapters
        registry.release(lease)

    def encode_chat(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None
    ) -> list[int]:
        """Token ids of ``messages`` through the chat template, ready for the assistant
        (``tools`` offered with ``tool_choice`` ``auto``; see :meth:`encode_tool_chat`)."""
        return self.encode_tool_chat(messages, tools, AUTO)[0]

    def encode_tool_chat(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, choice: ToolChoice
    ) -> tuple[list[int], str]:
        """Token ids of ``messages`` and ``tools`` through the chat template, ready for
        the assistant, and the reply's prefill (already at the end of the ids).

        Tools reach a template that takes them; otherwise :mod:`reef.core.chat_format`
        renders them into the system message. Raises ``BadRequestError`` when the
        template rejects the messages.
        """
        rendered = render_tools(
            messages, tools, choice, template_takes_tools=self.template_takes_tools
        )
        extra: dict[str, Any] = {}
        if rendered.template_tools:
            extra["tools"] = rendered.template_tools
        try:
            ids = self.loaded.tokenizer.apply_chat_template(
                rendered.messages,
                add_generation_prompt=True,
                tokenize=True,
                return_dict=False,
                **extra,
            )
        except TemplateError as exc:
            raise BadRequestError(f"chat template: {exc}") from exc
        if not isinstance(ids, list) or not all(isinstance(i, int) for i in ids):
            raise BadRequestError("chat template produced no token ids")
        prompt = [i for i in ids if isinstance(i, int)]
        if rendered.prefill:
            prompt += self.loaded.tokenizer.encode(rendered.prefill, add_special_tokens=False)
        return prompt, rendered.prefill

    def sampling_params(
        self,
        prompt_length: int,
        max_tokens: int | None,
        **fields: Any,
    ) -> SamplingParams:
        """Sampling parameters with ``max_tokens`` fitted into the context window.

        Raises ``BadRequestError`` when the prompt leaves no room to generate.
        """
        room = self.loaded.max_context - prompt_length
        if room < 1:
            raise BadRequestError(
                f"This model's maximum context length is {self.loaded.max_context} tokens; "
                f"the messages have {prompt_length}."
            )
        limit = min(max_tokens or self.default_max_tokens, room)
        return SamplingParams(max_tokens=limit, **fields)

    def generate(
        self, prompt_ids: list[int], params: SamplingParams, n: int, lease: AdapterLease | None
    ) -> GenerationStream:
        """Start generating ``n`` sequences; the lease is returned when they finish."""
        stream = GenerationStream()

        def done(error: BaseException | None) -> None:
            if lease is not None:
                self.release(lease)
            stream._put(_End(error))

        job = GenerationJob(tuple(prompt_ids), params, n, lease, stream._put, done)
        stream.job = job
        self.scheduler.submit(job)
        return stream

    def token_text(self, token_id: int) -> str:
        """The text of one token as logprobs report it (special tokens included)."""
        return str(self.loaded.tokenizer.decode([token_id]))

    async def load_adapter(
        self,
        name: str,
        path: Path,
        expected_digest: str | None,
        replace: bool,
        base: str | None = None,
    ) -> AdapterVersion:
        """Check, load and publish an adapter, on the base model or (``base``) on the
        loaded checkpoint of that name; nothing changes when any step fails.

        Raises ``AdapterConflictError`` (name taken, ``replace`` false),
        ``AdapterRejectedError`` (pickle, missing files, digest mismatch, bad weights) and
        ``UnknownModelError`` (no checkpoint ``base`` is loaded).
        """
        if name == self.name or self.checkpoints.has(name):
            raise AdapterConflictError(f"{name!r} is the base model's or a checkpoint's name")
        self.adapters.check_free(name, replace)
        on = None
        if base is not None:
            on = self.checkpoints.acquire(base)
            if on is None:
                raise UnknownModelError(
                    f"no checkpoint {base!r} is loaded to load the adapter {name!r} on; "
                    "load it first (POST /v1/load_checkpoint)"
                )
        key = BASE_KEY if on is None else on.internal_name  # the weights it runs on
        runner = self.scheduler.batches[key].runner
        internal = self.adapters.new_internal_name()
        try:
            digest = await asyncio.to_thread(check_adapter_directory, path, expected_digest)
            await asyncio.wrap_future(self.scheduler.call(lambda: runner.load(internal, path)))
        except BaseException:
            if on is not None:
                self.checkpoints.release(on)
            raise
        self._placed[internal] = (runner, on)
        version = AdapterVersion(name, internal, path, digest, base=on)
        try:
            self.adapters.publish(version, replace)
        except AdapterConflictError:
            self._drop_version(internal)
            raise
        where = f" on checkpoint {base}" if base is not None else ""
        logger.info("adapter %s is %s (%s)%s", name, internal, digest, where)
        return version

    def unload_adapter(self, name: str) -> None:
        """Unpublish ``name``; running requests finish on it. Raises ``UnknownModelError``."""
        self.adapters.unpublish(name)
        logger.info("adapter %s unloaded", name)

    def _drop_version(self, internal_name: str) -> None:
        runner, on = self._placed.pop(internal_name, (self.scheduler.runner, None))

        def drop() -> None:
            runner.delete(internal_name)
            self.scheduler.forget_prefixes(internal_name)
            if on is not None:  # the checkpoint it ran on may now be freed
                self.checkpoints.release(on)

        self.scheduler.call(drop)

    async def load_checkpoint(
        self, name: str, path: Path, expected_digest: str | None, replace: bool
    ) -> AdapterVersion:
        """Check, load beside the resident weights and publish a checkpoint as ``name``;
        nothing changes when any step fails (module docstring).

        Raises ``AdapterConflictError`` (name taken, ``replace`` false; or the name of the
        base model or of an adapter), ``CheckpointRejectedError`` (pickle, missing or
        truncated files, digest mismatch, weights that do not fit the tokenizer) and
        ``InsufficientMemoryError`` (it would not fit in the memory available).
        """
        if name == self.name or self.adapters.has(name):
            raise AdapterConflictError(f"{name!r} is the base model's or an adapter's name")
        if self.backend != "eager":
            raise CheckpointRejectedError(f"the {self.backend} backend serves no checkpoints yet")
        self.checkpoints.check_free(name, replace)
        async with self._loading:
            info = await asyncio.to_thread(_checked, path, expected_digest)
            # Weights unloaded just before (nothing leasing them) are freed by a call
            # queued on the worker: let it run, so the memory check sees them gone.
            await asyncio.wrap_future(self.scheduler.call(lambda: None))
            element_bytes = load_dtype(self.precision).itemsize
            required = required_bytes(info.parameters, element_bytes)
            check_fits(name, required, self.available_memory())
            model = await asyncio.to_thread(self._load_weights, path)
            internal = self.checkpoints.new_internal_name()
            runner = AdapterModel(model)
            await asyncio.wrap_future(
                self.scheduler.call(lambda: self.scheduler.add_weights(internal, runner))
            )
        version = AdapterVersion(name, internal, path, info.digest, kind="checkpoint")
        try:
            self.checkpoints.publish(version, replace)
        except AdapterConflictError:
            self._drop_weights(internal)
            raise
        logger.info("checkpoint %s is %s (%s)", name, internal, info.digest)
        return version

    def _load_weights(self, path: Path) -> Any:
        try:
            model = load_checkpoint_model(path, dtype=load_dtype(self.precision))
            apply_precision(model, self.precision)
        except (OSError, ValueError, KeyError, TypeError, RuntimeError) as exc:
            raise CheckpointRejectedError(
                f"checkpoint at {str(path)!r} cannot be loaded: {exc}"
            ) from exc
        ours, theirs = self.loaded.model.config, model.config
        if getattr(theirs, "vocab_size", None) != getattr(ours, "vocab_size", None):
            raise CheckpointRejectedError(
                f"checkpoint at {str(path)!r} has a vocabulary of {theirs.vocab_size} tokens; "
                f"the engine's tokenizer ({self.name}) has {ours.vocab_size}"
            )
        return model

    def unload_checkpoint(self, name: str) -> None:
        """Unpublish the checkpoint ``name``; running requests finish on it, then its
        weights are freed. Raises ``UnknownModelError``."""
        self.checkpoints.unpublish(name)
        logger.info("checkpoint %s unloaded", name)

    def _drop_weights(self, internal_name: str) -> None:
        def drop() -> None:
            self.scheduler.remove_weights(internal_name)
            gc.collect()
            logger.info("freed checkpoint weights %s", internal_name)

        self.scheduler.call(drop)


def _checked(path: Path, expected_digest: str | None) -> CheckpointInfo:
    try:
        return check_checkpoint_directory(path, expected_digest)
    except CheckpointError as exc:
        raise CheckpointRejectedError(exc.message) from exc
