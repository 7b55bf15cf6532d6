"""The canary arm of live traffic: which requests a scenario's live canary serves.

A candidate in state ``canary`` (``ReleaseChain.start_canary``) serves ``fraction`` of
its scenario's live requests; the head serves the rest. The arm is a function of the
request's session id, so a conversation stays on one arm while the canary lives.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any

from reef.gateway.serving.release import ServingRelease

_HASH_BYTES = 8
_HASH_RANGE = 1 << (8 * _HASH_BYTES)
_MAX_KEY_BYTES = 64  # blake2b's key limit


@dataclass(frozen=True)
class CanaryRoute:
    """A staged canary: the live requests of its scenario that it ``takes`` are served
    by ``serving`` (the candidate) and recorded with purpose ``canary``."""

    candidate_id: str
    fraction: float
    serving: ServingRelease
    _cutoff: int = field(init=False, repr=False)
    _key: bytes = field(init=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_cutoff", int(self.fraction * _HASH_RANGE))
        object.__setattr__(self, "_key", self.candidate_id.encode()[:_MAX_KEY_BYTES])

    def takes(self, session_id: str) -> bool:
        """Whether the request of ``session_id`` goes to the canary arm: the session's
        keyed hash, read as a number in [0, 1), is below ``fraction``. Keyed by the
        candidate, so each canary samples its own sessions (a fresh session id is a
        fresh, uniform draw)."""
        digest = hashlib.blake2b(
            session_id.encode(), digest_size=_HASH_BYTES, key=self._key
        ).digest()
        return int.from_bytes(digest, "big") < self._cutoff


@dataclass
class CanaryStatus:
    """A scenario's live canary as this gateway sees it, for ``/reef/status``."""

    candidate_id: str
    fraction: float
    state: str = "staging"  # staging | serving | failed (its arm then goes to the head)
    error: str | None = None
    failures: int = 0
    activated_at: float | None = None
    retry_at: float = 0.0  # monotonic; a failed canary is staged again from then on

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready."""
        return {
            "candidate_id": self.candidate_id,
            "fraction": self.fraction,
            "state": self.state,
            "error": self.error,
            "failures": self.failures,
            "activated_at": self.activated_at,
        }
