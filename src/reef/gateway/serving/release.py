"""``ServingRelease``: what one request is served by, as activation staged it.

Its own module so that activation (which stages releases and canaries), the canary arm
(which picks one per request) and the inference routes all import it without importing
each other.
"""

from __future__ import annotations

from dataclasses import dataclass

from reef.harness import Harness
from reef.releases import RoutingComponent


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
    checkpoint_name: str | None = None  # the name the upstream serves the checkpoint under
    checkpoint_digest: str | None = None
    # A distilled scenario's teacher/student routing (``reef.gateway.distill``); None:
    # the model above answers every request.
    routing: RoutingComponent | None = None

    @property
    def weights_name(self) -> str | None:
        """The name the upstream serves this release's own weights under (its adapter,
        else its checkpoint), or None when it serves the base model as it is."""
        return self.adapter_name or self.checkpoint_name

    @property
    def model(self) -> str | None:
        """The model name to send upstream: the adapter or checkpoint when there is one."""
        return self.weights_name or self.base_model
