"""Config drift: the configured model against the model the release chain serves.

The chain decides what serves. A scenario's first release (``create``) takes its base
model from the configuration (``scenarios.<s>.model``, else its upstream's
``upstreams.<u>.model``); later releases copy it from their parent. Editing the model in
``reef.yaml`` afterwards therefore changes nothing by itself: the gateway logs one
warning per scenario on start (``warn_on_drift``), and an operator adopts the change
with ``reef releases adopt-config --scenario <s>`` or
``POST /reef/scenarios/{s}/adopt-config`` (``adopt_config``), which appends an ``adopt``
release through the usual compare-and-swap head move.

The adopted release keeps the head's harness and serves the configured model bare: a
LoRA adapter or a checkpoint is weights trained on the old base, which another base
cannot load (other shapes) or would serve as noise, so both are dropped. They stay on
the chain: a rollback to the earlier release serves them again, on their own base.

The upstream is not part of a release: the configured ``scenarios.<s>.upstream`` always
serves, so only the model name can drift.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from reef.config import ReefSettings
from reef.core.errors import RefusedError
from reef.releases import (
    EscalationRules,
    ModelComponent,
    Release,
    ReleaseChain,
    ReleaseManifest,
    RoutingComponent,
    ScenarioHasNoReleaseError,
    TeacherEndpoint,
)

log = logging.getLogger("reef.gateway.serving.drift")

# The base model of a release whose scenario names no model: the client's choice serves.
CLIENT_CHOSEN_MODEL = "(client-chosen)"


class NothingToAdoptError(RefusedError):
    """The head already serves the configured model (409; CLI exit 2)."""


@dataclass(frozen=True)
class ConfiguredModel:
    """The model the configuration names for a scenario, and the setting that names it
    (``scenarios.<s>.model`` or ``upstreams.<u>.model``; None when neither does)."""

    name: str
    setting: str | None

    def describe(self) -> str:
        """``upstreams.fake.model = 'm'``, for messages."""
        if self.setting is None:
            return "no model configured: the client's choice serves"
        return f"{self.setting} = {self.name!r}"


def configured_model(settings: ReefSettings, scenario: str) -> ConfiguredModel:
    """What ``scenario``'s first release would serve if it were created now."""
    upstream_name, upstream = settings.upstream_for(scenario)
    own = settings.scenario(scenario).model
    if own is not None:
        return ConfiguredModel(own, f"scenarios.{scenario}.model")
    if upstream.model is not None:
        return ConfiguredModel(upstream.model, f"upstreams.{upstream_name}.model")
    return ConfiguredModel(CLIENT_CHOSEN_MODEL, None)


@dataclass(frozen=True)
class ConfigDrift:
    """A scenario whose head serves another model than the configuration names."""

    scenario: str
    head: Release
    configured: ConfiguredModel

    @property
    def served(self) -> str:
        """The head's base model."""
        return self.head.manifest.model.base

    def warning(self) -> str:
        """The one start-up line: both values, the scenario and the command that adopts."""
        return (
            f"scenario {self.scenario!r}: the configuration names model "
            f"{self.configured.name!r} ({self.configured.setting or 'none configured'}), but "
            f"its head release {self.head.id} (seq {self.head.seq}) serves "
            f"{self.served!r}, which keeps serving: the release chain decides. To serve "
            f"the configured model, run: reef releases adopt-config --scenario "
            f"{self.scenario} (or POST /reef/scenarios/{self.scenario}/adopt-config)"
        )


def config_drift(settings: ReefSettings, scenario: str, head: Release) -> ConfigDrift | None:
    """The drift between ``scenario``'s configuration and its ``head``, or None."""
    configured = configured_model(settings, scenario)
    if configured.name == head.manifest.model.base:
        return None
    return ConfigDrift(scenario, head, configured)


def warn_on_drift(settings: ReefSettings, chain: ReleaseChain) -> list[ConfigDrift]:
    """Log one warning per configured scenario whose head serves another model than the
    configuration names (scenarios without a release yet have nothing to drift from);
    the drifts found."""
    found = []
    for scenario in settings.scenarios:
        head = chain.head(scenario)
        drift = None if head is None else config_drift(settings, scenario, head)
        if drift is not None:
            log.warning("%s", drift.warning())
            found.append(drift)
    return found


def initial_routing(settings: ReefSettings, scenario: str) -> RoutingComponent | None:
    """The routing of a distilled ``scenario``'s first release (``scenarios.<s>.distill``):
    the teacher answers every request (student share 0) and Reef records it; None when
    the scenario is not distilled."""
    distill = settings.scenario(scenario).distill
    if distill is None:
        return None
    return RoutingComponent(
        student_share=0.0,
        teacher=TeacherEndpoint(**distill.teacher.model_dump()),
        escalation=EscalationRules(**distill.escalation.model_dump()),
    )


def adopted_manifest(
    head: ReleaseManifest, base: str, routing: RoutingComponent | None = None
) -> ReleaseManifest:
    """``head``'s manifest on the model ``base``: the harness kept, the adapter and the
    checkpoint (weights trained on the old base) dropped. A student on a new base has
    learned nothing yet: a distilled head's routing goes back to the teacher (share 0),
    and a head without routing takes ``routing`` (the configured one), if any."""
    kept = head.routing
    if kept is not None:
        kept = kept.model_copy(update={"student_share": 0.0})
    return ReleaseManifest(
        model=ModelComponent(base=base), harness=head.harness, routing=kept or routing
    )


def adopt_config(
    chain: ReleaseChain,
    settings: ReefSettings,
    scenario: str,
    actor: str,
    reason: str | None = None,
    expected_head: str | None = None,
) -> Release:
    """Append an ``adopt`` release serving the configured model of ``scenario``, if the
    head is still ``expected_head`` (default: the head read now).

    Raises ``ScenarioHasNoReleaseError`` before its first release,
    ``NothingToAdoptError`` when the head already serves the configured model, and
    ``ReleaseConflictError`` (nothing written) when the head moved meanwhile.
    """
    head = chain.get_release(expected_head) if expected_head else chain.head(scenario)
    if head is None:
        raise ScenarioHasNoReleaseError(scenario)
    drift = config_drift(settings, scenario, head)
    if drift is None:
        configured = configured_model(settings, scenario)
        raise NothingToAdoptError(
            f"nothing to adopt: the head of scenario {scenario!r} ({head.id}) already "
            f"serves the configured model ({configured.describe()}); edit the model in "
            "the configuration first"
        )
    routing = initial_routing(settings, scenario)
    manifest = adopted_manifest(head.manifest, drift.configured.name, routing)
    dropped = {
        name: digest
        for name, digest in (
            ("adapter", head.manifest.model.adapter),
            ("checkpoint", head.manifest.model.checkpoint),
        )
        if digest is not None
    }
    evidence: dict[str, Any] = {
        "adopted": {
            "setting": drift.configured.setting,
            "from": drift.served,
            "to": drift.configured.name,
        },
        "dropped": dropped,
    }
    why = reason or f"adopt the configured model {drift.configured.name!r}"
    return chain.adopt(scenario, manifest, head.id, actor, why, evidence)
