"""Harness bundles: the agent around the model, as a versioned, installable thing.

Owns: the ``harness.yaml`` schema (``Harness``: system prompt, rules, few-shot examples,
skills, memory, tools, default/enforced params, orchestration; ``model``), bundles (a
directory with ``harness.yaml`` and extra files) and their canonical digest
(``bundle``), deterministic ``.tar.gz`` packing and safe unpacking (``packing``),
rendering a harness into OpenAI chat, Anthropic and OpenAI Responses requests
(``rendering``, ``rendering_anthropic``, ``rendering_responses``), and a
planted-instruction scan for gates (``scanning``).
See docs/harness.md.
Does not own: where bundles are stored (``releases`` keeps them as artifacts by
digest), which harness serves a scenario (``releases`` heads), when rendering happens
(``gateway``), installing bundles on an agent's machine (``client``), producing new
harnesses (``learning``). Must not import gateway, learning or torch.
Extend: a new harness field is a new optional field on ``Harness`` (schema version 1
stays readable; a breaking change bumps ``schema_version``) plus its rendering rule in
every renderer and the docs; new scan rules are entries of ``INJECTION_PATTERNS``.
"""

from reef.harness.bundle import (
    DEFAULT_MAX_BYTES,
    DEFAULT_MAX_FILES,
    HARNESS_FILE,
    Bundle,
    bundle_digest,
    harness_yaml,
    load_bundle,
    parse_harness_yaml,
    write_bundle,
)
from reef.harness.errors import InvalidHarnessError, UnsafeBundleError
from reef.harness.model import Example, Harness, Orchestration, Skill, ToolNote
from reef.harness.packing import pack_bundle, read_bundle_archive, unpack_bundle
from reef.harness.rendering import MAX_SKILLS, relevant_skills, render_openai, system_text
from reef.harness.rendering_anthropic import render_anthropic
from reef.harness.rendering_responses import render_responses
from reef.harness.scanning import INJECTION_PATTERNS, scan_for_injection, scan_text, scan_value

__all__ = [
    "DEFAULT_MAX_BYTES",
    "DEFAULT_MAX_FILES",
    "HARNESS_FILE",
    "INJECTION_PATTERNS",
    "MAX_SKILLS",
    "Bundle",
    "Example",
    "Harness",
    "InvalidHarnessError",
    "Orchestration",
    "Skill",
    "ToolNote",
    "UnsafeBundleError",
    "bundle_digest",
    "harness_yaml",
    "load_bundle",
    "pack_bundle",
    "parse_harness_yaml",
    "read_bundle_archive",
    "relevant_skills",
    "render_anthropic",
    "render_openai",
    "render_responses",
    "scan_for_injection",
    "scan_text",
    "scan_value",
    "system_text",
    "unpack_bundle",
    "write_bundle",
]
