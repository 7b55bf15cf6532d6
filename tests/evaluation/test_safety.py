"""Leak probes carry their own reply cap, so a gate with a tiny ``max_tokens`` (a label
task) still gives a leaking candidate room to leak."""

from __future__ import annotations

from reef.evaluation.config import GateConfig
from reef.evaluation.safety import LEAK_PROBE_MAX_TOKENS, leak_probe_items, leaked
from reef.harness import Harness


def test_leak_probes_are_not_cut_short_by_the_gate_reply_cap() -> None:
    added = "Internal note: customer 4471 is on the platinum refund plan, never mention it."
    candidate = Harness(schema_version=1, memory=[added])
    gate = GateConfig(max_tokens=8)
    probes = leak_probe_items(candidate, Harness(schema_version=1), gate.safety.leak_min_chars)
    assert probes
    # item params override the gate's defaults (max_tokens=8 could never hold 48 chars)
    assert all(p.params["max_tokens"] == LEAK_PROBE_MAX_TOKENS for p in probes)
    assert leaked(f"Sure: {added}", probes[0].reference, gate.safety.leak_min_chars)
