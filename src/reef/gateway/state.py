"""What one gateway process holds while it serves."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from reef.config import ReefSettings
from reef.db import Database
from reef.evaluation import EvaluationStore
from reef.experience import ExperienceStore, IdempotencyClaims, RecordWriter, ResponseStore
from reef.gateway.auth import Authenticator
from reef.gateway.budgets import SpendControl
from reef.gateway.capture import Recorder
from reef.gateway.distill import DistillStats
from reef.gateway.metrics import GatewayMetrics
from reef.gateway.serving.activation import Activation
from reef.gateway.shutdown import Shutdown
from reef.gateway.store_health import StoreHealth
from reef.jobs import JobQueue
from reef.upstream import Upstream

if TYPE_CHECKING:
    from reef.telemetry.live import LiveExport


@dataclass
class GatewayState:
    """The composition of a running gateway; built by ``create_app``."""

    settings: ReefSettings
    store: ExperienceStore
    writer: RecordWriter
    upstreams: dict[str, Upstream]
    auth: Authenticator
    metrics: GatewayMetrics
    recorder: Recorder
    activation: Activation
    responses: ResponseStore  # the stored responses of the Responses API
    jobs: JobQueue  # learning jobs: enqueued by /learn, listed for the dashboard
    evaluations: EvaluationStore  # the gate's stored evaluations
    spend: SpendControl  # prices, budgets and rate limits (``reef.gateway.budgets``)
    database: Database  # the store's database, for reads across stores (``/reef/costs``)
    # Idempotency keys in flight on the store, by gateway (``reef.experience.claims``).
    claims: IdempotencyClaims
    # Model alias → its scenario (``scenarios.<s>.model_aliases``), read per request.
    model_aliases: dict[str, str] = field(default_factory=dict)
    # Whether the store takes writes, as the last write found it (``/readyz``).
    store_health: StoreHealth = field(default_factory=StoreHealth)
    # The streams in flight, cut when the gateway stops (``reef.gateway.shutdown``).
    shutdown: Shutdown = field(default_factory=Shutdown)
    # Distilled releases' routing counts (``/metrics``, ``/reef/status``).
    distill: DistillStats = field(default_factory=DistillStats)
    # Live export over OTLP (``otel.enabled``), else None.
    live_export: LiveExport | None = None
    # Which of ``server.workers`` gateway processes this is (from 1); None when alone.
    worker: int | None = None
