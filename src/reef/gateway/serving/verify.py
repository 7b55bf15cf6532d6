"""Verified activation: holding an upstream to the fingerprint of the weights it was
asked to load (``reef.releases.fingerprints``).

After an adapter or checkpoint is loaded (and after an in-place reload), its probes go
through the upstream under the name requests will use (greedy, ``max_tokens`` the
fingerprint's length, logprobs and token ids where the upstream returns them) and the
answers are compared with the fingerprint. A mismatch raises
:class:`WeightsMismatchError` with the first difference; staging then fails and what
served goes on serving. An artifact without a fingerprint (made before fingerprints)
stages as before, reported ``unverified``.

An adapter's fingerprint also records how far the base model is from it
(``base_gap``, ``base_differs``). Where the tolerance used cannot tell the two apart (a
small adapter held in bfloat16), verification still passes but says so, once per
weights: a warning (:func:`base_gap_warning`) and ``distinguishes_base: false`` in the
verification status.

:class:`Verifications` remembers, per loaded weights name, the digest last verified and
when: ``/reef/status`` shows it per scenario, and the continuous check
(``Activation.verify_tick``) refreshes it.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import orjson

from reef.core import dumps
from reef.core.errors import ConflictError
from reef.releases import (
    Fingerprint,
    FingerprintMismatch,
    compare_fingerprint,
    distinguishes_base,
    parse_probe_answer,
    probe_request,
    read_fingerprint,
    serving_tolerance,
)
from reef.upstream import Upstream, UpstreamRequest

VerifyState = Literal["verified", "unverified", "failed"]


class WeightsMismatchError(ConflictError):
    """The upstream's answers under a weights name differ from the fingerprint of the
    artifact loaded under it: it serves other weights (swapped, evicted, base)."""


@dataclass
class Verification:
    """What was last found about one loaded weights name."""

    digest: str
    state: VerifyState
    at: float  # wall-clock seconds
    diff: str | None = None
    distinguishes_base: bool | None = None  # None: not an adapter, or not recorded

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready."""
        return {
            "digest": self.digest,
            "state": self.state,
            "at": self.at,
            "diff": self.diff,
            "distinguishes_base": self.distinguishes_base,
        }


def load_fingerprint(path: Path) -> Fingerprint | None:
    """The fingerprint of a materialized (verified) artifact directory, if it has one."""
    return read_fingerprint(path) if path.is_dir() else None


async def probe(
    upstream: Upstream, model: str, fingerprint: Fingerprint, served: str | None = None
) -> FingerprintMismatch | None:
    """Ask ``upstream`` every probe of ``fingerprint`` on ``model``; the first difference,
    None when all agree, within the tolerance of the precision it serves in (``served``,
    ``serving_tolerance``). Raises ``UpstreamError`` when the upstream fails."""
    answers = []
    for item in fingerprint.probes:
        body = dumps(probe_request(item, model))
        response = await upstream.send(UpstreamRequest("/chat/completions", body, False))
        answers.append(parse_probe_answer(orjson.loads(response.body)))
    return compare_fingerprint(fingerprint, answers, serving_tolerance(fingerprint, served))


class Verifications:
    """The last verification of each weights name, and the counters ``/metrics`` shows."""

    def __init__(self) -> None:
        self.by_name: dict[str, Verification] = {}
        self.failures_total = 0
        self.checks_total = 0
        self.restaged_total = 0
        self.lock = asyncio.Lock()
        self.warned_base: set[tuple[str, str]] = set()  # (name, digest) warned of once

    def record(
        self,
        name: str,
        digest: str,
        state: VerifyState,
        diff: str | None = None,
        distinguishes: bool | None = None,
    ) -> Verification:
        """Note what was found about ``name`` now; count a failure."""
        found = Verification(digest, state, time.time(), diff, distinguishes)
        self.by_name[name] = found
        self.checks_total += 1
        if state == "failed":
            self.failures_total += 1
        return found

    def forget(self, name: str) -> None:
        """``name`` was unloaded."""
        self.by_name.pop(name, None)

    def get(self, name: str | None) -> Verification | None:
        """The last verification of ``name``, if any."""
        return None if name is None else self.by_name.get(name)


def mismatch_error(kind: str, name: str, upstream: str, mismatch: FingerprintMismatch) -> str:
    """The message of a failed verification: what, where, the first difference."""
    return (
        f"{kind} {name!r} on upstream {upstream!r} does not answer its fingerprint: "
        f"{mismatch.describe()} (the upstream serves other weights under this name)"
    )


def base_check(fingerprint: Fingerprint, served: str | None) -> tuple[bool | None, float]:
    """Whether verifying ``fingerprint`` at the tolerance used for a server computing in
    ``served`` refuses the base model (``distinguishes_base``), and that tolerance."""
    tolerance = serving_tolerance(fingerprint, served)
    return distinguishes_base(fingerprint, tolerance), tolerance


def base_gap_warning(kind: str, name: str, fingerprint: Fingerprint, tolerance: float) -> str:
    """The warning for weights whose fingerprint cannot tell them from the base model at
    ``tolerance``: which, in what dtype, the largest difference against the tolerance."""
    return (
        f"{kind} {name!r}: at {fingerprint.dtype} this fingerprint cannot tell the adapter "
        f"from the base model: largest difference {fingerprint.base_gap:.2f} ≤ tolerance "
        f"{tolerance:g} (the base model served in its place would pass verification)"
    )
