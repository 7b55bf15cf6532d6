"""Prometheus metrics of the gateway, in a registry of its own.

With several gateway processes (``reef serve --workers``, ``reef.cli.gateway_workers``)
``PROMETHEUS_MULTIPROC_DIR`` is set: the counters and histograms below then live in
files of that directory and a scrape of any process returns their sums over all of
them (prometheus_client's multiprocess mode). The values read at scrape time (capture
writer, activation, spend, live export) are the answering process's own.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.registry import Collector

_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)


class _CaptureCollector(Collector):
    """Reads the capture writer's counters at scrape time (no work on the hot path)."""

    def __init__(self, stats: Callable[[], Any]) -> None:
        self._stats = stats

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        stats = self._stats()
        yield GaugeMetricFamily(
            "reef_capture_queue_depth", "Records waiting to be written.", value=stats.queue_depth
        )
        for name, doc, attr in (
            ("reef_records_written", "Records committed to the store.", "written_total"),
            ("reef_capture_batches", "Group-commit transactions.", "batches_total"),
            (
                "reef_capture_dropped",
                "Records dropped because the queue was full.",
                "dropped_total",
            ),
            (
                "reef_capture_queue_full",
                "Times a request waited for queue room.",
                "queue_full_total",
            ),
            ("reef_capture_failed", "Records whose write failed after retries.", "failed_total"),
        ):
            yield CounterMetricFamily(name, doc, value=getattr(stats, attr))


class _ActivationCollector(Collector):
    """Release activation counters, read at scrape time."""

    def __init__(self, activation: Callable[[], Any]) -> None:
        self._activation = activation

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        activation = self._activation()
        yield CounterMetricFamily(
            "reef_activation_flips", "Releases that started serving.", value=activation.flips_total
        )
        yield CounterMetricFamily(
            "reef_activation_failures",
            "Releases that failed to stage (the previous one kept serving).",
            value=activation.failures_total,
        )
        verifications = activation.verifications
        yield CounterMetricFamily(
            "reef_activation_verify_failures",
            "Probes of loaded weights that answered otherwise than their fingerprint, or "
            "weights the upstream no longer had (docs/releases.md, verified activation).",
            value=verifications.failures_total,
        )
        yield CounterMetricFamily(
            "reef_activation_verify_restaged",
            "Serving weights loaded again after a continuous verification found them "
            "evicted or changed.",
            value=verifications.restaged_total,
        )
        staging = GaugeMetricFamily(
            "reef_activation_failed",
            "1 when a scenario's head failed to stage.",
            labels=["scenario"],
        )
        for name, status in activation.status.items():
            staging.add_metric([name], 1.0 if status.state == "failed" else 0.0)
        yield staging
        yield from _adapter_cache_metrics(activation.adapter_cache.states)


def _adapter_cache_metrics(
    states: dict[str, Any],
) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
    """The adapter cache telemetry (``reef.gateway.serving.adapter_cache``) per upstream."""
    slots = GaugeMetricFamily(
        "reef_adapter_slots",
        "Adapters an upstream holds at once: kind gpu (max_loras) or cpu (max_cpu_loras), "
        "as the upstream or upstreams.<name>.adapter_slots says.",
        labels=["upstream", "kind"],
    )
    resident = GaugeMetricFamily(
        "reef_adapters_resident",
        "Adapters Reef loaded that the upstream lists.",
        labels=["upstream"],
    )
    needed = GaugeMetricFamily(
        "reef_adapters_needed",
        "Adapters Reef needs active: heads, canaries, candidates under the gate or shadow.",
        labels=["upstream"],
    )
    cliff = GaugeMetricFamily(
        "reef_adapter_cache_cliff",
        "1 when the adapters Reef needs active exceed the upstream's max_loras.",
        labels=["upstream"],
    )
    evictions = CounterMetricFamily(
        "reef_adapter_evictions",
        "Adapters Reef loaded that the upstream stopped listing (evicted by it).",
        labels=["upstream"],
    )
    for name, state in sorted(states.items()):
        for kind, value in (("gpu", state.max_loras), ("cpu", state.max_cpu_loras)):
            if value is not None:
                slots.add_metric([name, kind], float(value))
        resident.add_metric([name], float(len(state.resident)))
        needed.add_metric([name], float(len(state.needed)))
        cliff.add_metric([name], 1.0 if state.cliff else 0.0)
        evictions.add_metric([name], float(state.evictions_total))
    yield from (slots, resident, needed, cliff, evictions)


class _LiveExportCollector(Collector):
    """Live export's counters (``reef.telemetry``), read at scrape time."""

    def __init__(self, live: Any) -> None:
        self._live = live

    def collect(self) -> Iterator[CounterMetricFamily]:
        live = self._live
        counts = live.counts
        yield CounterMetricFamily(
            "reef_otel_export_failures",
            "OTLP exports that failed (collector down, refused or timed out).",
            value=counts["failed_exports"],
        )
        yield CounterMetricFamily(
            "reef_otel_spans_failed",
            "Spans in the failed OTLP exports.",
            value=counts["failed_spans"],
        )
        yield CounterMetricFamily(
            "reef_otel_spans_exported",
            "Spans the OTLP collector accepted.",
            value=counts["exported_spans"],
        )
        yield CounterMetricFamily(
            "reef_otel_spans_dropped",
            "Spans dropped before export: the queue was full (otel.max_queue_size) or the "
            "export process was gone.",
            value=live.dropped_spans,
        )


class _ScrapeTimeCollector(Collector):
    """The collectors of ``registry`` other than the shared ``names``."""

    def __init__(self, registry: CollectorRegistry, names: frozenset[str]) -> None:
        self._registry = registry
        self._names = names

    def collect(self) -> Iterator[Metric]:
        for metric in self._registry.collect():
            if metric.name not in self._names:
                yield metric


class GatewayMetrics:
    """The counters and histograms the gateway updates while serving."""

    def __init__(self, capture_stats: Callable[[], Any], activation: Callable[[], Any]) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.requests = Counter(
            "reef_requests", "Requests served.", ["route", "status"], registry=self.registry
        )
        self.latency = Histogram(
            "reef_request_duration_seconds",
            "Time from request to the end of the response.",
            ["route"],
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.upstream_errors = Counter(
            "reef_upstream_errors",
            "Upstream calls that failed.",
            ["upstream", "kind"],
            registry=self.registry,
        )
        self.feedback_written = Counter(
            "reef_feedback_written", "Feedback items stored.", registry=self.registry
        )
        self.shadow_requests = Counter(
            "reef_shadow_requests",
            "Live requests sampled for the shadow arm, by outcome: sent, failed, dropped "
            "(concurrency full), capped (max_requests reached), skipped, budget (a learning "
            "budget counting shadow spent).",
            ["scenario", "outcome"],
            registry=self.registry,
        )
        self.idempotency_waits = Counter(
            "reef_idempotency_waits",
            "Requests that waited for another's answer under their idempotency key, by "
            "where that answer came from: process (a request in this gateway), store (a "
            "claim of another gateway on the store).",
            ["where"],
            registry=self.registry,
        )
        self.connections = Counter(
            "reef_connections",
            "Connections taken, by gateway process (reef serve --workers: its index; 1 "
            "with one process): how evenly the processes share the clients.",
            ["worker"],
            registry=self.registry,
        )
        # Labelled children cached: ``labels()`` costs a lock and a lookup per call.
        self._children: dict[tuple[str, int], tuple[Counter, Histogram]] = {}
        self.registry.register(_CaptureCollector(capture_stats))
        self.registry.register(_ActivationCollector(activation))
        self._scrape = self.registry
        if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
            shared = frozenset(
                family.name
                for metric in (
                    self.requests,
                    self.latency,
                    self.upstream_errors,
                    self.feedback_written,
                    self.shadow_requests,
                    self.idempotency_waits,
                    self.connections,
                )
                for family in metric.describe()
            )
            self._scrape = CollectorRegistry()
            # prometheus_client leaves this constructor untyped; it registers itself.
            summed: Callable[[CollectorRegistry], Collector] = MultiProcessCollector
            summed(self._scrape)
            self._scrape.register(_ScrapeTimeCollector(self.registry, shared))

    def watch_live_export(self, live: Any) -> None:
        """Expose the counters of ``live`` (a ``reef.telemetry.live.LiveExport``)."""
        self.registry.register(_LiveExportCollector(live))

    def observe(self, route: str, status: int, seconds: float) -> None:
        """Count one finished request."""
        children = self._children.get((route, status))
        if children is None:
            children = (self.requests.labels(route, str(status)), self.latency.labels(route))
            self._children[(route, status)] = children
        children[0].inc()
        children[1].observe(seconds)

    def count_connection(self, worker: int) -> None:
        """Count one connection taken by gateway process ``worker``."""
        self.connections.labels(str(worker)).inc()

    def count_shadow(self, scenario: str, outcome: str) -> None:
        """Count one shadow sample's outcome (``reef.gateway.shadow``)."""
        self.shadow_requests.labels(scenario, outcome).inc()

    def render(self) -> bytes:
        """The Prometheus text exposition."""
        return generate_latest(self._scrape)
