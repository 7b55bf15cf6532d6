"""The engine's errors: each refines a ``reef.core`` category so callers map them once."""

from __future__ import annotations

from reef.core.errors import ConflictError, InvalidInputError, NotFoundError, ReefError


class EngineError(ReefError):
    """Root of the engine's own failures (a model that cannot load, a dead worker)."""


class ModelSourceError(EngineError):
    """A model source names nothing loadable: unknown name, missing directory or wheel."""


class UnknownModelError(NotFoundError):
    """A request named a model that is neither the base model nor a loaded adapter."""


class AdapterRejectedError(InvalidInputError):
    """An adapter directory was refused: pickle files, no safetensors, wrong digest,
    or weights that do not fit the base model. Nothing was loaded."""


class AdapterConflictError(ConflictError):
    """An adapter of that name is already loaded (pass ``load_inplace`` to replace it).
    Answered 400 as vLLM answers it, with the error code ``ADAPTER_ALREADY_LOADED``."""


ADAPTER_ALREADY_LOADED = "adapter_already_loaded"
"""The ``error.code`` of ``AdapterConflictError`` on the wire (``reef.upstream`` reads it)."""


class BadRequestError(InvalidInputError):
    """A generation request that cannot be served as asked (prompt too long, bad body)."""


class CheckpointRejectedError(InvalidInputError):
    """A checkpoint directory was refused: pickle files, no config or safetensors, a
    truncated shard, a wrong digest, or weights the engine's tokenizer does not fit.
    Nothing was loaded."""


class InsufficientMemoryError(ReefError):
    """Loading a checkpoint beside the weights already resident would not fit in the
    memory available; nothing was loaded. Answered 507 (Insufficient Storage) with the
    error code ``INSUFFICIENT_MEMORY``: unload something, or give the engine more memory."""


INSUFFICIENT_MEMORY = "insufficient_memory"
