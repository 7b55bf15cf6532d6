"""Runtime LoRA adapters: names, versions, leases, and the PEFT model that holds them.

A *name* (``lora_name``) points at one *version* (an internal PEFT adapter name such
as ``reef-3``). A request takes a *lease* on the version its name points at when it
is accepted and returns it when it finishes; unloading or replacing a name only
retires the old version, which PEFT drops once its last lease is returned. So every
request finishes on the weights it started with, whatever happens to the name.

:class:`AdapterRegistry` is thread-safe. :class:`AdapterModel` mutates the model and
must only be used on the scheduler's worker thread (between decode steps).
"""

from __future__ import annotations

import itertools
import logging
import re
import threading
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, cast

import torch
from peft import LoraConfig, PeftModel
from peft.tuners.lora import LoraLayer
from transformers import DynamicCache, PreTrainedModel

from reef.engine.decoder import LeanDecoder, SliceLinear, adapter_groups, supports
from reef.engine.errors import AdapterConflictError, AdapterRejectedError, UnknownModelError

logger = logging.getLogger("reef.engine")

BASE_ADAPTER = "__base__"
"""PEFT's name for "no adapter" in a mixed-adapter batch."""


@dataclass(eq=False)
class AdapterVersion:
    """One loaded copy of an adapter's weights."""

    name: str
    internal_name: str
    path: Path
    digest: str
    created: int = field(default_factory=lambda: int(time.time()))
    leases: int = 0
    retired: bool = False
    kind: Literal["adapter", "checkpoint"] = "adapter"
    """A checkpoint's ``internal_name`` is the key of its base weights in the scheduler."""
    base: AdapterLease | None = None
    """An adapter loaded on a checkpoint: its lease on that checkpoint, held while this
    version lives (the checkpoint's weights stay resident until the adapter is gone)."""


@dataclass(eq=False)
class AdapterLease:
    """A request's hold on one adapter version; return it with ``AdapterRegistry.release``."""

    version: AdapterVersion
    released: bool = False

    @property
    def internal_name(self) -> str:
        """The PEFT adapter name the request's rows run under."""
        return self.version.internal_name


class AdapterRegistry:
    """Maps ``lora_name`` to the current version; counts leases; retires old versions.

    ``drop`` is called (from any thread) with the internal name of a retired version
    once no lease holds it; the engine uses it to schedule the PEFT deletion.
    """

    def __init__(self, drop: Callable[[str], None], what: str = "lora adapter") -> None:
        self._lock = threading.Lock()
        self._current: dict[str, AdapterVersion] = {}
        self._counter = itertools.count(1)
        self._drop = drop
        self.what = what  # how errors name what it holds ("lora adapter", "checkpoint")

    def new_internal_name(self) -> str:
        """A fresh internal name, never reused in this process."""
        prefix = "reef" if self.what == "lora adapter" else "ckpt"
        return f"{prefix}-{next(self._counter)}"

    def listed(self) -> list[AdapterVersion]:
        """The current version of every loaded name, in load order."""
        with self._lock:
            return list(self._current.values())

    def has(self, name: str) -> bool:
        """Whether ``name`` is published here (no lease taken)."""
        with self._lock:
            return name in self._current

    def check_free(self, name: str, replace: bool) -> None:
        """Raise ``AdapterConflictError`` when ``name`` is taken and not to be replaced."""
        with self._lock:
            if name in self._current and not replace:
                raise AdapterConflictError(f"the {self.what} {name!r} has already been loaded")

    def publish(self, version: AdapterVersion, replace: bool) -> None:
        """Point ``version.name`` at ``version``, retiring the version it replaces.

        Raises ``AdapterConflictError`` when the name was taken meanwhile and
        ``replace`` is false (the caller then drops ``version``).
        """
        with self._lock:
            old = self._current.get(version.name)
            if old is not None and not replace:
                raise AdapterConflictError(
                    f"the {self.what} {version.name!r} has already been loaded"
                )
            self._current[version.name] = version
        if old is not None:
            self._retire(old)

    def unpublish(self, name: str) -> None:
        """Remove ``name``; its version is dropped when its last lease returns.

        Raises ``UnknownModelError`` when no adapter has that name.
        """
        with self._lock:
            old = self._current.pop(name, None)
        if old is None:
            raise UnknownModelError(f"the {self.what} {name!r} cannot be found")
        self._retire(old)

    def acquire(self, name: str) -> AdapterLease | None:
        """A lease on the current version of ``name``, or None when no such adapter."""
        with self._lock:
            version = self._current.get(name)
            if version is None:
                return None
            version.leases += 1
            return AdapterLease(version)

    def release(self, lease: AdapterLease) -> None:
        """Return a lease (idempotent); the last one on a retired version drops it."""
        with self._lock:
            if lease.released:
                return
            lease.released = True
            version = lease.version
            version.leases -= 1
            dead = version.retired and version.leases == 0
        if dead:
            self._drop(version.internal_name)

    def _retire(self, version: AdapterVersion) -> None:
        with self._lock:
            version.retired = True
            dead = version.leases == 0
        if dead:
            self._drop(version.internal_name)


VARIANT_SUFFIX = re.compile(r"(Linear|Embedding|Conv\dd)?Variant$")


def _variants(model: PeftModel, adapter: str) -> set[str]:
    """The LoRA variants (DoRA, aLoRA, …) ``adapter`` uses in ``model``, by class name."""
    return {
        VARIANT_SUFFIX.sub("", type(module.lora_variant[adapter]).__name__)
        for module in model.modules()
        if isinstance(module, LoraLayer) and adapter in getattr(module, "lora_variant", {})
    }


class AdapterModel:
    """The served model, wrapped in PEFT once the first adapter loads.

    At wrap time PEFT gets a placeholder adapter (rank 1, zero delta) that is never
    used or deleted: PEFT cannot load an adapter after its last one was deleted, and
    a failed load can always be rolled back while another adapter exists. From then
    on every forward pass names each row's adapter, so the placeholder never applies.

    Not thread-safe: the scheduler's worker thread is its only user.
    """

    PLACEHOLDER = "reef-placeholder"

    def __init__(self, base: PreTrainedModel) -> None:
        self.base = base
        self.peft: PeftModel | None = None
        self.lean = LeanDecoder(base) if supports(base) else None
        self.loaded: set[str] = set()
        self._hooks_needed: bool | None = None  # see _needs_hooks; None: not known yet

    def load(self, internal_name: str, path: Path) -> None:
        """Load the safetensors adapter at ``path`` as ``internal_name``.

        Raises ``AdapterRejectedError`` when PEFT cannot load it (bad config, weights
        that do not fit the base model); the adapter is then removed again.
        """
        started = time.monotonic()
        peft = self._wrapped()
        self._hooks_needed = None
        try:
            peft.load_adapter(str(path), adapter_name=internal_name, is_trainable=False)
        except (ValueError, KeyError, RuntimeError, OSError, TypeError) as exc:
            self._forget(internal_name)
            raise AdapterRejectedError(f"adapter at {str(path)!r} cannot be loaded: {exc}") from exc
        variants = _variants(peft, internal_name)
        if variants:
            self._forget(internal_name)
            raise AdapterRejectedError(
                f"adapter at {str(path)!r} uses {' and '.join(sorted(variants))}, not plain LoRA: "
                "the engine serves plain LoRA adapters only (PEFT cannot route rows of one "
                "batch to such adapters)"
            )
        self.loaded.add(internal_name)
        logger.info(
            "loaded adapter %s from %s in %.0f ms",
            internal_name,
            path,
            (time.monotonic() - started) * 1000,
        )

    def delete(self, internal_name: str) -> None:
        """Drop a version's weights (no request uses them any more)."""
        if internal_name in self.loaded:
            self.loaded.discard(internal_name)
            self._forget(internal_name)
            logger.info("dropped adapter %s", internal_name)

    def _wrapped(self) -> PeftModel:
        if self.peft is None:
            target = next(
                name
                for name, module in self.base.named_modules()
                if isinstance(module, torch.nn.Linear) and not name.endswith("lm_head")
            )
            config = LoraConfig(r=1, lora_alpha=1, target_modules=[target])
            self.peft = PeftModel(self.base, config, adapter_name=self.PLACEHOLDER)
            self.peft.eval()
        return self.peft

    def _forget(self, internal_name: str) -> None:
        self._hooks_needed = None
        if self.peft is not None and internal_name in self.peft.peft_config:
            self.peft.delete_adapter(internal_name)

    def _needs_hooks(self, peft: PeftModel) -> bool:
        """Whether the lean pass needs PEFT's forward hooks to route rows to adapters:
        only when some LoRA layer wraps a layer the pass calls (anything but the parts of
        a fused projection, whose adapters the pass adds itself). Setting the hooks up
        walks every module, ~5 ms per decode step of SmolLM2: an adapter on q/v alone
        (the quickstart's) skips it. Known once per set of loaded adapters."""
        if self._hooks_needed is None:
            self._hooks_needed = any(
                isinstance(module, LoraLayer)
                and not isinstance(module.get_base_layer(), SliceLinear)
                for module in peft.modules()
            )
        return self._hooks_needed

    def forward_logits(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        position_ids: torch.Tensor,
        cache: object,
        adapter_names: list[str],
    ) -> torch.Tensor:
        """Logits of the last position of each row, ``[rows, vocab]`` in float32,
        each row run under its own adapter (``BASE_ADAPTER`` for none)."""
        if self.lean is not None:
            assert isinstance(cache, DynamicCache)
            if self.peft is None:
                logits = self.lean.forward_last(input_ids, attention_mask, position_ids, cache)
                return logits.float()
            # PEFT's routing of each row to its adapter, as its own forward sets it up
            hooks = cast(
                Callable[..., AbstractContextManager[None]],
                self.peft.base_model._enable_peft_forward_hooks,
            )
            groups = adapter_groups(adapter_names, BASE_ADAPTER)
            routing = (
                hooks(adapter_names=adapter_names)
                if self._needs_hooks(self.peft)
                else nullcontext()
            )
            with routing:
                logits = self.lean.forward_last(
                    input_ids, attention_mask, position_ids, cache, groups
                )
            return logits.float()
        arguments = {
            "input_ids": input_ids,
            "attention_mask": attention_mask,
            "position_ids": position_ids,
            "cache": cache,
            "use_cache": True,
            "logits_to_keep": 1,
        }
        if self.peft is not None:
            output = self.peft(**arguments, adapter_names=adapter_names)
        else:
            output = self.base(**arguments)
        return cast(torch.Tensor, output.logits[:, -1, :]).float()
