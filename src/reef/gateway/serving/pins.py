"""Who may pin what with ``x-reef-release`` (and read which harness with ``?release=``).

A pin names a release or a candidate. The rules (``check_pin``):

- **Releases.** Any key may pin a release on its scenario's chain, old ones included. An
  id that is not on that chain — unknown, or another scenario's — is a 404 that reads the
  same either way, so a key learns nothing about scenarios it may not use. Only an
  unlimited admin key is told which scenario owns it (400).
- **Candidates** serve only the evaluation gate and admin keys, and only while the gate
  or the canary is deciding them (``evaluating`` or ``canary``). An inference key pinning
  a candidate of its own scenario gets 403 (it names the id, and the key may use the
  scenario, so nothing leaks; the message says to pin a release); a candidate of another
  scenario is the 404 above. Every other state (``pending``, ``passed``, ``rejected``,
  ``abandoned``, ``published``) serves an admin key only, and is recorded with purpose
  ``eval`` whatever the request asked: it is inspection, never trained on, never canary
  evidence.
- **The gate** is the key ``evaluation.api_key`` names (``reef serve`` makes it an admin
  key, ``reef-gate``); it may be an inference key, and may then pin candidates that are
  ``evaluating`` or on ``canary``, nothing else.
- **Harness downloads** of a candidate are admin-only (``PinAccess`` ``admin``); the gate
  reads harnesses from the artifact store, never through that route.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Literal

from reef.config import ReefSettings
from reef.core.errors import InvalidInputError, NotFoundError, PermissionDeniedError
from reef.gateway.auth import Principal
from reef.releases import CandidateState, ReleaseManifest

PinAccess = Literal["inference", "gate", "admin"]
"""What a caller may pin: releases only; also candidates the gate or the canary is
deciding; anything (non-live candidates as ``eval``)."""

LIVE_PIN_STATES: frozenset[CandidateState] = frozenset({"evaluating", "canary"})
"""Candidate states the gate may pin (an admin may pin any)."""


@dataclass(frozen=True)
class PinTarget:
    """What a pinned id names: its scenario, manifest and, for a candidate, its state
    (None for a release)."""

    scenario: str
    manifest: ReleaseManifest
    candidate_state: CandidateState | None = None


def gate_key_id(settings: ReefSettings) -> str | None:
    """The id of the configured key that ``evaluation.api_key`` is (the gate's), or None
    when it is unset or not one of ``auth.keys``."""
    secret = settings.evaluation.api_key
    if secret is None:
        return None
    digest = hashlib.sha256(secret.get_secret_value().encode()).hexdigest()
    return next((key.id for key in settings.auth.keys if key.sha256 == digest), None)


def pin_access(principal: Principal, gate_key: str | None) -> PinAccess:
    """What ``principal`` may pin: ``admin`` for an admin key (and with no keys), ``gate``
    for the gate's key, else ``inference``."""
    if principal.role == "admin":
        return "admin"
    if gate_key is not None and principal.key_id == gate_key:
        return "gate"
    return "inference"


def check_pin(
    target: PinTarget | None,
    release_id: str,
    scenario: str,
    principal: Principal,
    access: PinAccess,
) -> bool:
    """Whether ``principal`` (with ``access``) may pin ``release_id`` (``target``: what it
    names, None when nothing) for ``scenario``: False when it serves as asked, True when it
    serves only as ``eval`` (an admin's pin of a candidate nobody is deciding).

    Raises ``NotFoundError`` for an id not on the scenario's chain (the same message
    whether it exists elsewhere or not), ``InvalidInputError`` naming the owner for an
    unlimited admin key, and ``PermissionDeniedError`` for a candidate the caller may not
    be served (module docstring)."""
    if target is None or target.scenario != scenario:
        if target is not None and access == "admin" and principal.scenarios is None:
            raise InvalidInputError(
                f"release {release_id!r} belongs to scenario {target.scenario!r}, not {scenario!r}"
            )
        raise NotFoundError(
            f"no release or candidate {release_id!r} on the chain of scenario {scenario!r}: "
            "pin one of its releases (the x-reef-release-id of a receipt names one)"
        )
    state = target.candidate_state
    if state is None:
        return False
    if access == "admin":
        return state not in LIVE_PIN_STATES
    if access == "gate" and state in LIVE_PIN_STATES:
        return False
    if access == "gate":
        raise PermissionDeniedError(
            f"candidate {release_id!r} of scenario {scenario!r} is {state}: the gate's key "
            "may pin a candidate only while it is evaluating or on canary; an admin key "
            "may pin it (served as eval)"
        )
    raise PermissionDeniedError(
        f"{release_id!r} is a candidate of scenario {scenario!r}, not a release: candidates "
        "are served only to the evaluation gate and admin keys; key "
        f"{principal.key_id!r} may pin the scenario's releases"
    )
