"""``ServingRelease``: what one request is served by, as activation staged it.

Its own module so that activation (which stages releases and canaries), the canary arm
(which picks one per request) and the inference routes all import it without importing
each other.
"""

from __future__ import annotations

from dataclasses import dataclass

from reef.harness import Harness


@dataclass(frozen=True)
class ServingRelease:
    """What one request is served by: a release (or candidate) staged and ready."""

    scenario: str
    release_id: str | None  # None only before the scenario's first release exists
    base_model: str | None
    adapter_name: str | None  # the name the upstream serves the adapter under
    adapter_digest: str | None
    harness: Harness | None
    harness_digest: str | None  # the artifact (packed bundle) digest in the manifest
    bundle_digest: str | None  # the canonical bundle digest clients verify
    upstream: str

    @property
    def model(self) -> str | None:
        """The model name to send upstream: the adapter when there is one."""
        return self.adapter_name or self.base_model
