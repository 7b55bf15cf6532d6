"""Adapter cache telemetry: the adapters resident on each upstream against its slots, the
evictions seen, and the cache-cliff warning.

An upstream holds only so many LoRA adapters at once (vLLM's ``--max-loras`` on the GPU,
``--max-cpu-loras`` in host memory; SGLang's ``--max-loras-per-batch``). Past that it
evicts and reloads adapters between batches, and latency falls off a cliff (SGLang's
median TTFT went from 40 ms to 6.3 s once active adapters overflowed its cache). The
slots come from the upstream's ``GET /models`` where a card gives ``max_loras`` /
``max_cpu_loras``, else from ``upstreams.<name>.adapter_slots``; unknown, they are
reported as such and no cliff is judged.

Each check lists the upstream's models (vLLM and the embedded engine list every loaded
adapter), counts as resident the adapters Reef loaded that are listed, and counts an
eviction for each adapter Reef loaded (and did not unload itself) that is no longer
listed: once per disappearance. The adapters Reef needs active are those of every
scenario's head, staged canary and pinned candidate (the gate's and the shadow arm's);
when they exceed ``max_loras``, the cliff warning fires: a log line when it starts, the
``reef_adapter_cache_cliff`` gauge and the status field ``cliff``.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

from reef.core.errors import ReefError
from reef.upstream import Upstream

log = logging.getLogger("reef.gateway.serving.adapter_cache")


@dataclass
class AdapterCacheState:
    """What the last check saw on one upstream."""

    max_loras: int | None = None
    max_cpu_loras: int | None = None
    slots_source: str | None = None  # "upstream" or "config"; None: unknown
    resident: list[str] = field(default_factory=list)  # Reef's adapters listed upstream
    listed: int = 0  # adapters the upstream lists (others' too, on a shared upstream)
    needed: list[str] = field(default_factory=list)
    evictions_total: int = 0
    evicted: list[str] = field(default_factory=list)  # gone now, not unloaded by Reef
    cliff: bool = False
    checked_at: float | None = None
    error: str | None = None

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready (``/reef/status``'s ``adapter_cache.<upstream>``)."""
        return {
            "adapter_slots": {
                "max_loras": self.max_loras,
                "max_cpu_loras": self.max_cpu_loras,
                "source": self.slots_source,
            },
            "resident": sorted(self.resident),
            "listed": self.listed,
            "needed": sorted(self.needed),
            "evictions_total": self.evictions_total,
            "evicted": sorted(self.evicted),
            "cliff": self.cliff,
            "checked_at": self.checked_at,
            "error": self.error,
        }


def _slot_count(cards: list[dict[str, Any]], key: str) -> int | None:
    """``key`` from the first card that gives it as a positive int."""
    for card in cards:
        value = card.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


class AdapterCacheTelemetry:
    """The adapter cache state of every upstream, updated by ``check``."""

    def __init__(self, slots: dict[str, tuple[int | None, int | None]]) -> None:
        # configured (max_loras, max_cpu_loras) per upstream name
        self._configured = slots
        self.states: dict[str, AdapterCacheState] = {}

    async def check(
        self, upstream: Upstream, loaded: set[str], needed: set[str]
    ) -> AdapterCacheState:
        """List ``upstream``'s models and update its state: ``loaded`` are the adapters
        Reef holds loaded there now, ``needed`` those it needs active. A failed listing
        keeps the last figures and records the error."""
        state = self.states.setdefault(upstream.name, AdapterCacheState())
        state.needed = sorted(needed)
        try:
            cards = await upstream.model_cards()
        except ReefError as exc:
            state.error = exc.message
            log.warning("could not list the models of upstream %s: %s", upstream.name, exc)
            return state
        state.error = None
        state.checked_at = time.time()
        listed = {str(card["id"]) for card in cards}
        # vLLM's and the engine's adapter cards name a parent model; a base has none
        state.listed = sum(1 for card in cards if card.get("parent"))
        state.resident = sorted(loaded & listed)
        gone = loaded - listed
        new = gone - set(state.evicted)
        state.evictions_total += len(new)
        for name in sorted(new):
            log.warning(
                "upstream %s no longer lists adapter %s, which Reef loaded: evicted",
                upstream.name,
                name,
            )
        state.evicted = sorted(gone)
        configured = self._configured.get(upstream.name, (None, None))
        told = (_slot_count(cards, "max_loras"), _slot_count(cards, "max_cpu_loras"))
        state.max_loras = told[0] or configured[0]
        state.max_cpu_loras = told[1] or configured[1]
        state.slots_source = (
            "upstream"
            if any(told)
            else "config"
            if any(v is not None for v in configured)
            else None
        )
        cliff = state.max_loras is not None and len(needed) > state.max_loras
        if cliff and not state.cliff:
            log.warning(
                "adapter cache cliff on upstream %s: %d adapters need to be active (%s) "
                "and it holds %d at once (max_loras); requests will wait for adapter "
                "swaps. Raise the server's --max-loras or end canaries and candidates",
                upstream.name,
                len(needed),
                ", ".join(sorted(needed)),
                state.max_loras,
            )
        state.cliff = cliff
        return state

    def forget_eviction(self, upstream: str, name: str) -> None:
        """``name`` was loaded again on ``upstream``: a later disappearance counts anew."""
        state = self.states.get(upstream)
        if state is not None and name in state.evicted:
            state.evicted = [n for n in state.evicted if n != name]

    def status_json(self) -> dict[str, Any]:
        """Every upstream's state, JSON-ready."""
        return {name: state.as_dict() for name, state in sorted(self.states.items())}
