"""The OpenVINO backend: the engine's model served by OpenVINO GenAI's continuous
batching pipeline instead of eager PyTorch (``reef engine serve --backend openvino``).

What it keeps from the eager engine: the HTTP API, the chat template and tool calls
(the engine's tokenizer; the pipeline sees token ids only), stop strings and the
finish reasons (:class:`reef.engine.sequences.Sequence`), streaming, and LoRA adapters
from PEFT safetensors loaded and unloaded at runtime under a name.

What differs, measured on OpenVINO GenAI 2026.4 (``bench/engine_backends.py``):

- an adapter applies to a whole pipeline call, not to one request: requests of
  different adapters cannot share a decode step. The worker batches the rows of one
  adapter at a time: it serves the adapter of the oldest waiting job, admits new jobs
  of that adapter while no job of another waits, and switches once the batch drains
  (a switch applies the adapter with a one-token call, ``switch``);
- the model is converted once, offline, into OpenVINO IR under
  ``<home>/models/openvino/<source digest>-<precision>`` (:func:`converted`), by
  optimum-intel's ``optimum-cli export openvino``. optimum-intel 2.2 needs
  transformers < 5.6, below Reef's own floor, so the converter runs from an environment
  of its own: ``REEF_OPENVINO_CONVERTER`` names its ``optimum-cli`` (default: the one on
  ``PATH``);
- no checkpoints (full weights) and no prefix cache yet; ``top_logprobs`` is refused.

``agreement`` / :func:`check_agreement` compare greedy answers with PEFT's: a backend
whose answers under an adapter disagree is refused (``BackendDisagreesError``).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from reef.engine.errors import (
    AdapterRejectedError,
    BadRequestError,
    CheckpointRejectedError,
    EngineError,
    ModelSourceError,
)
from reef.engine.models import LoadedModel
from reef.engine.sequences import ChoiceDelta, GenerationJob, Sequence
from reef.engine.worker_loop import WorkerLoop, default_threads

logger = logging.getLogger("reef.engine")

PRECISIONS: dict[str, str] = {"float32": "fp32", "float16": "fp16", "int8": "int8", "int4": "int4"}
"""The engine dtypes the backend serves, and optimum-cli's ``--weight-format`` of each."""
CONVERTER_ENV = "REEF_OPENVINO_CONVERTER"
PIPELINE_PROPERTIES: dict[str, str] = {
    # OpenVINO computes in bfloat16 where the CPU has it (AVX-512 BF16, AMX), whatever
    # the weights, and keeps the paged KV cache in u8 (per-token quantized) on x86 CPUs
    # whatever the arithmetic: float32 for both (bench/engine_backends.py, docs/engine.md)
    "INFERENCE_PRECISION_HINT": "f32",
    "KV_CACHE_PRECISION": "f32",
}
"""The pipeline's precision properties, measured to agree with PEFT's greedy answers."""
AGREEING: frozenset[str] = frozenset({"float32", "float16"})
"""The precisions whose agreement with PEFT was measured at 95% or more
(bench/engine_backends.py); the others log that they are experimental."""
AGREEMENT_THRESHOLD = 0.95


class BackendDisagreesError(EngineError):
    """A backend's greedy answers disagree with PEFT's more than allowed."""


def available() -> str | None:
    """None when OpenVINO GenAI imports, else why not (install ``reef-agent[openvino]``)."""
    try:
        import openvino_genai  # noqa: F401
    except ImportError as exc:
        return (
            "the openvino backend needs the openvino extra "
            f"(pip install 'reef-agent[openvino]'): {exc}"
        )
    return None


def source_digest(directory: Path) -> str:
    """sha256 of the model directory's config and weights (16 hex digits): the cache key."""
    digest = hashlib.sha256()
    for path in sorted(directory.iterdir()):
        if path.suffix in (".json", ".safetensors") and path.is_file():
            digest.update(path.name.encode())
            with path.open("rb") as handle:
                for block in iter(lambda: handle.read(1 << 20), b""):
                    digest.update(block)
    return digest.hexdigest()[:16]


def converter() -> str:
    """The ``optimum-cli`` that converts (``REEF_OPENVINO_CONVERTER``, else PATH's)."""
    return os.environ.get(CONVERTER_ENV) or shutil.which("optimum-cli") or "optimum-cli"


def converted(source: Path, home: Path, precision: str) -> Path:
    """The OpenVINO IR of the model directory ``source`` in ``precision`` (an engine
    dtype of :data:`PRECISIONS`), converting it once into the cache under ``home``
    (atomic: a temp dir renamed, under a file lock). Raises ``ModelSourceError`` when the
    precision is not served or the converter fails."""
    from reef.engine.models import file_lock

    if precision not in PRECISIONS:
        raise ModelSourceError(
            f"the openvino backend serves {', '.join(PRECISIONS)}, not {precision!r}"
        )
    cache = home / "models" / "openvino"
    target = cache / f"{source_digest(source)}-{PRECISIONS[precision]}"
    if (target / "openvino_model.xml").is_file():
        return target
    cache.mkdir(parents=True, exist_ok=True)
    with file_lock(cache / f"{target.name}.lock"):
        if (target / "openvino_model.xml").is_file():
            return target
        scratch = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=cache))
        command = [
            converter(), "export", "openvino", "--model", str(source),
            "--task", "text-generation-with-past", "--weight-format", PRECISIONS[precision],
        ]  # fmt: skip
        if precision == "int4":
            command += ["--group-size", "64", "--ratio", "1.0", "--sym"]
        command.append(str(scratch))
        logger.info("converting %s to OpenVINO %s at %s (one time)", source, precision, target)
        started = time.monotonic()
        try:
            done = subprocess.run(  # noqa: S603 - the converter the operator configured
                command,
                capture_output=True,
                text=True,
                check=False,
                env={**os.environ, "HF_HUB_OFFLINE": "1"},
            )
            if done.returncode != 0 or not (scratch / "openvino_model.xml").is_file():
                tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
                raise ModelSourceError(
                    f"OpenVINO conversion failed ({' '.join(command[:3])}, exit "
                    f"{done.returncode}): {' / '.join(tail)}; set {CONVERTER_ENV} to an "
                    "optimum-cli of optimum-intel"
                )
            os.replace(scratch, target)
        except FileNotFoundError as exc:
            raise ModelSourceError(
                f"no OpenVINO converter ({exc.filename}): install optimum-intel in an "
                f"environment of its own and set {CONVERTER_ENV} to its optimum-cli"
            ) from exc
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        logger.info("converted in %.1f s", time.monotonic() - started)
    return target


PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def placeholder_adapter(directory: Path, loaded: LoadedModel) -> Path:
    """A rank-1 LoRA of zeros on every projection of every layer, in PEFT's safetensors
    naming, written once beside the IR in ``directory``."""
    import numpy as np
    from safetensors.numpy import save_file

    path = directory / "reef-placeholder-lora.safetensors"
    if path.is_file():
        return path
    config = loaded.model.config
    hidden = int(config.hidden_size)
    heads = int(config.num_attention_heads)
    head_dim = int(getattr(config, "head_dim", None) or hidden // heads)
    kv = int(getattr(config, "num_key_value_heads", None) or heads) * head_dim
    inner = int(config.intermediate_size)
    shapes = {
        "self_attn.q_proj": (hidden, heads * head_dim),
        "self_attn.k_proj": (hidden, kv),
        "self_attn.v_proj": (hidden, kv),
        "self_attn.o_proj": (heads * head_dim, hidden),
        "mlp.gate_proj": (hidden, inner),
        "mlp.up_proj": (hidden, inner),
        "mlp.down_proj": (inner, hidden),
    }
    tensors = {}
    for layer in range(int(config.num_hidden_layers)):
        for module, (fan_in, fan_out) in shapes.items():
            key = f"base_model.model.model.layers.{layer}.{module}"
            tensors[f"{key}.lora_A.weight"] = np.zeros((1, fan_in), dtype=np.float32)
            tensors[f"{key}.lora_B.weight"] = np.zeros((fan_out, 1), dtype=np.float32)
    scratch = path.with_suffix(".tmp")
    save_file(tensors, str(scratch))
    os.replace(scratch, path)
    return path


def lora_scale(path: Path) -> float:
    """PEFT's scale of the adapter at ``path``: ``lora_alpha / r``."""
    config = json.loads((path / "adapter_config.json").read_text(encoding="utf-8"))
    alpha, rank = float(config["lora_alpha"]), float(config["r"])
    return alpha / rank**0.5 if config.get("use_rslora") else alpha / rank


class OpenVINOAdapters:
    """The adapters loaded into the backend: internal name -> (Adapter, alpha)."""

    def __init__(self) -> None:
        self.loaded: dict[str, tuple[Any, float]] = {}

    def load(self, internal_name: str, path: Path) -> None:
        """Read the PEFT safetensors adapter at ``path``. Raises ``AdapterRejectedError``."""
        import openvino_genai

        try:
            config = json.loads((path / "adapter_config.json").read_text(encoding="utf-8"))
            if config.get("use_dora") or config.get("peft_type", "LORA") != "LORA":
                raise AdapterRejectedError(
                    f"adapter at {str(path)!r} is not plain LoRA: the openvino backend "
                    "serves plain LoRA adapters only"
                )
            adapter = openvino_genai.Adapter(str(path / "adapter_model.safetensors"))
            self.loaded[internal_name] = (adapter, lora_scale(path))
        except AdapterRejectedError:
            raise
        except (OSError, ValueError, KeyError, RuntimeError) as exc:
            raise AdapterRejectedError(f"adapter at {str(path)!r} cannot be loaded: {exc}") from exc

    def delete(self, internal_name: str) -> None:
        """Forget an adapter (no request uses it any more)."""
        self.loaded.pop(internal_name, None)


class _Slot:
    """What the engine reads of a resident set of weights: its adapter runner."""

    def __init__(self, runner: OpenVINOAdapters) -> None:
        self.runner = runner


class _Row:
    """One sequence of a job on the pipeline: its handle and its text state."""

    def __init__(self, sequence: Sequence, handle: Any) -> None:
        self.sequence = sequence
        self.handle = handle


class OpenVINOWorker(WorkerLoop):
    """The engine's worker on OpenVINO GenAI: the interface of
    :class:`reef.engine.scheduler.Scheduler` that :class:`reef.engine.runtime.Engine`
    uses (``submit``, ``call``, ``batches``, ``stats``), over a
    ``ContinuousBatchingPipeline`` stepped on one thread (the loop and its queues:
    :class:`reef.engine.worker_loop.WorkerLoop`)."""

    crash_message = "openvino worker crashed"

    def __init__(
        self,
        directory: Path,
        loaded: LoadedModel,
        max_batch: int = 16,
        threads: int | None = None,
        precision: str = "float32",
    ) -> None:
        import openvino_genai

        super().__init__("reef-engine-openvino")
        self._genai = openvino_genai
        self.loaded = loaded
        self.directory = directory
        self.max_batch = max_batch
        self.threads = threads or default_threads()
        scheduler = openvino_genai.SchedulerConfig()
        scheduler.cache_size = 1  # GB of paged KV cache
        scheduler.max_num_seqs = max_batch
        scheduler.enable_prefix_caching = False  # keys and values differ per adapter
        # OpenVINO GenAI wires LoRA into the model only for adapters known when the
        # pipeline is built; any adapter applies after that. A zero adapter on every
        # projection (never applied) makes the pipeline ready for those loaded later.
        placeholder = openvino_genai.Adapter(str(placeholder_adapter(directory, loaded)))
        properties: dict[str, Any] = {
            "adapters": openvino_genai.AdapterConfig(
                placeholder, 0.0, openvino_genai.AdapterConfig.Mode.MODE_DYNAMIC
            ),
            "INFERENCE_NUM_THREADS": self.threads,
            **PIPELINE_PROPERTIES,
        }
        if precision not in AGREEING:
            logger.warning(
                "the openvino backend in %s is experimental: its greedy answers agreed "
                "with PEFT's on under 95%% of prompts, or were not measured (docs/engine.md)",
                precision,
            )
        self.pipe = openvino_genai.ContinuousBatchingPipeline(
            str(directory),
            openvino_genai.Tokenizer(str(directory)),
            scheduler,
            "CPU",
            **properties,
        )
        self.runner = OpenVINOAdapters()
        self.batches: dict[str, _Slot] = {"base": _Slot(self.runner)}
        self.applied: str | None = None  # the adapter the pipeline's next steps run
        self.switches = 0
        self.peak_rows = 0
        self._rows: list[_Row] = []
        self._next_id = 0

    # --- the scheduler's interface ----------------------------------------------------

    def stats(self) -> dict[str, int]:
        return {
            "running": len(self._rows),
            "waiting": len(self._pending),
            "peak_batch": self.peak_rows,
            "weights": 1,
            "adapter_switches": self.switches,
        }

    def prefix_stats(self) -> dict[str, int]:
        return {}

    def forget_prefixes(self, adapter: str) -> None:
        """No prefix cache here."""

    def add_weights(self, key: str, runner: Any) -> None:
        raise CheckpointRejectedError("the openvino backend serves no checkpoints yet")

    def remove_weights(self, key: str) -> None:
        """No checkpoints here."""

    # --- the worker thread --------------------------------------------------------------

    def _check(self, job: GenerationJob) -> None:
        if job.params.top_logprobs:
            raise BadRequestError("top_logprobs is not served by the openvino backend")

    def _has_rows(self) -> bool:
        return bool(self._rows)

    def _step(self) -> None:
        self._drop_cancelled()
        self._admit()
        if self._rows:
            self.peak_rows = max(self.peak_rows, len(self._rows))
            self.pipe.step()
            self._read()

    def _admit(self) -> None:
        """Start waiting jobs of the adapter being served; once the batch has drained,
        switch to the adapter of the oldest waiting job."""
        wanted, jobs = self._take()
        if not jobs:
            return
        try:
            if wanted != self.applied:
                self._switch(wanted)
        except Exception as exc:
            for job in jobs:
                job.remaining = 0
                job.done(exc)
            return
        for job in jobs:
            if job.cancelled.is_set():
                job.done(None)
            else:
                self._start(job)

    def _take(self) -> tuple[str, list[GenerationJob]]:
        """The adapter to serve next and the waiting jobs to start on it."""
        jobs: list[GenerationJob] = []
        with self._wake:
            if not self._rows:
                while self._pending and self._pending[0].cancelled.is_set():
                    self._pending.popleft().done(None)
                if not self._pending:
                    return "", jobs
                wanted = self._pending[0].adapter_key
            else:
                wanted = self.applied or "__base__"
                if any(job.adapter_key != wanted for job in self._pending):
                    return wanted, jobs  # let the batch drain, then serve the others
            rows = len(self._rows)
            while self._pending and self._pending[0].adapter_key == wanted:
                job = self._pending[0]
                if rows + job.n > max(self.max_batch, job.n):
                    break
                rows += job.n
                jobs.append(self._pending.popleft())
        return wanted, jobs

    def _adapter_config(self, key: str) -> Any:
        if key == "__base__":
            return self._genai.AdapterConfig()
        adapter, alpha = self.runner.loaded[key]
        return self._genai.AdapterConfig(adapter, alpha)

    def _switch(self, key: str) -> None:
        """Apply adapter ``key`` (``__base__``: none) to the pipeline: OpenVINO GenAI sets
        adapters per ``generate`` call, so a one-token call on one token does it."""
        import numpy as np
        import openvino

        started = time.perf_counter()
        config = self._genai.GenerationConfig()
        config.max_new_tokens = 1
        config.do_sample = False
        config.adapters = self._adapter_config(key)
        prompt = openvino.Tensor(np.array([[self._any_token()]], dtype=np.int64))
        self.pipe.generate([prompt], [config])
        self.applied = key
        self.switches += 1
        logger.debug("adapter %s applied in %.1f ms", key, (time.perf_counter() - started) * 1e3)

    def _any_token(self) -> int:
        bos = self.loaded.tokenizer.bos_token_id
        return int(bos) if isinstance(bos, int) else 0

    def _start(self, job: GenerationJob) -> None:
        import numpy as np
        import openvino

        params = job.params
        prompt = openvino.Tensor(np.array([list(job.prompt_ids)], dtype=np.int64))
        for index in range(job.n):
            config = self._genai.GenerationConfig()
            config.max_new_tokens = params.max_tokens
            config.adapters = self._adapter_config(job.adapter_key)
            config.stop_token_ids = set(self.loaded.eos_token_ids)
            if params.temperature == 0:
                config.do_sample = False
            else:
                config.do_sample = True
                config.temperature = params.temperature
                config.top_p = params.top_p
                if params.seed is not None:
                    config.rng_seed = params.seed + index
            if params.logprobs:
                config.logprobs = 1
            handle = self.pipe.add_request(self._next_id, prompt, config)
            self._next_id += 1
            self._rows.append(_Row(Sequence(job, index, self.loaded.eos_token_ids), handle))

    def _read(self) -> None:
        from reef.engine.sequences import TokenLogprob

        finished: list[_Row] = []
        for row in self._rows:
            sequence = row.sequence
            while sequence.finish_reason is None and row.handle.can_read():
                for output in row.handle.read().values():
                    logprobs = list(output.generated_log_probs or [])
                    for offset, token in enumerate(output.generated_ids):
                        logprob = (
                            TokenLogprob(int(token), float(logprobs[offset]))
                            if sequence.job.params.logprobs and offset < len(logprobs)
                            else None
                        )
                        sequence.job.sink(sequence.push(int(token), logprob, self._decode))
                        if sequence.finish_reason is not None:
                            break
            if sequence.finish_reason is None and self._handle_done(row):
                # the pipeline ended the row without our rules ending it (context full)
                sequence.finish_reason = "length"
                rest = self._decode(sequence.text_ids)[sequence.emitted :]
                sequence.job.sink(ChoiceDelta(sequence.index, rest, (), (), "length"))
            if sequence.finish_reason is not None:
                finished.append(row)
        for row in finished:
            self._finish(row)

    def _handle_done(self, row: _Row) -> bool:
        status = row.handle.get_status()
        return bool(status != self._genai.GenerationStatus.RUNNING and not row.handle.can_read())

    def _finish(self, row: _Row) -> None:
        if row.handle.get_status() == self._genai.GenerationStatus.RUNNING:
            row.handle.stop()
        self._rows.remove(row)
        job = row.sequence.job
        job.remaining -= 1
        if job.remaining == 0:
            job.done(None)

    def _decode(self, token_ids: list[int]) -> str:
        return str(self.loaded.tokenizer.decode(token_ids, skip_special_tokens=True))

    def _drop_cancelled(self) -> None:
        dropped = [row for row in self._rows if row.sequence.job.cancelled.is_set()]
        for row in dropped:
            row.handle.stop()
            self._rows.remove(row)
        for job in {row.sequence.job for row in dropped}:
            job.remaining = 0
            job.done(None)

    def _release_rows(self) -> set[GenerationJob]:
        jobs = {row.sequence.job for row in self._rows}
        self._rows.clear()
        return jobs


def meta_loaded(directory: Path, name: str) -> LoadedModel:
    """The tokenizer of the model at ``directory`` with its model on the meta device: what
    the engine reads of a model (config, generation config, chat template) without its
    weights, which the pipeline holds."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    from reef.engine.models import eos_ids
    from reef.engine.tiny import CHAT_TEMPLATE

    config = AutoConfig.from_pretrained(directory, local_files_only=True)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)  # type: ignore[no-untyped-call]
    with contextlib.suppress(OSError):
        model.generation_config = GenerationConfig.from_pretrained(directory, local_files_only=True)
    tokenizer = AutoTokenizer.from_pretrained(directory, local_files_only=True)
    if not tokenizer.chat_template:
        tokenizer.chat_template = CHAT_TEMPLATE
    model.eval()
    return LoadedModel(model, tokenizer, name, eos_ids(model, tokenizer))


def agreement(answers: list[list[int]], reference: list[list[int]]) -> float:
    """The share of ``answers`` equal to ``reference`` token for token."""
    if not reference:
        return 1.0
    return sum(a == r for a, r in zip(answers, reference, strict=True)) / len(reference)


def check_agreement(
    answers: list[list[int]],
    reference: list[list[int]],
    what: str,
    threshold: float = AGREEMENT_THRESHOLD,
) -> float:
    """The agreement of a backend's greedy ``answers`` with PEFT's ``reference``; raises
    ``BackendDisagreesError`` under ``threshold``."""
    share = agreement(answers, reference)
    if share < threshold:
        raise BackendDisagreesError(
            f"{what}: greedy answers agree with PEFT's on {share:.0%} of "
            f"{len(reference)} prompts, under the {threshold:.0%} required"
        )
    return share
