"""Adapter cache telemetry: the adapters resident on an upstream against its slots, the
evictions seen, and the cache-cliff warning (``reef.gateway.serving.adapter_cache``).

A loopback vLLM-protocol server (runtime LoRA API, adapters listed in ``/v1/models``)
with ``max_loras: 2`` configured serves three scenarios, each on an adapter of its own:
three adapters need to be active, so the warning fires in ``/reef/status``, ``/metrics``
and the log. The server then drops one adapter on its own, as vLLM's LRU cache does:
one eviction is counted, and only once. Slots the upstream tells in ``/v1/models``
override the configured ones.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

from reef.cli.status import _adapter_cache_line
from reef.config import UpstreamConfig
from reef.gateway.serving.adapter_cache import AdapterCacheTelemetry
from reef.releases import ModelComponent, ReleaseChain, ReleaseManifest, open_artifact_store
from reef.upstream.http import HTTPUpstream
from tests.fakes.upstream import FakeUpstream, FakeUpstreamThread
from tests.gateway.harness import GatewayThread, make_settings
from tests.gateway.rawhttp import call
from tests.gateway.sdk_calls import turn
from tests.polling import eventually

SCENARIOS = ("s1", "s2", "s3")


def _adapter(tmp_path: Path, scenario: str) -> Path:
    adapter = tmp_path / f"adapter-{scenario}"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text("{}")
    # different bytes: a different digest, so a different adapter name upstream
    (adapter / "adapter_model.safetensors").write_bytes(f"weights of {scenario}".encode())
    return adapter


def _cache(gateway: GatewayThread) -> dict[str, Any]:
    cache: dict[str, Any] = call(gateway.port, "GET", "/reef/status").json()["adapter_cache"]
    return cache.get("fake", {})


def _metric(gateway: GatewayThread, line_start: str) -> float | None:
    text = call(gateway.port, "GET", "/metrics").body.decode()
    for line in text.splitlines():
        if line.startswith(line_start + " "):
            return float(line.rsplit(" ", 1)[1])
    return None


def test_three_active_adapters_on_two_slots_warn_of_the_cache_cliff_and_an_eviction_counts(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="reef.gateway.serving.adapter_cache")
    with FakeUpstreamThread(adapters=True, lists_adapters=True) as fake:
        settings = make_settings(tmp_path, fake.base_url)
        upstream = settings.upstreams["fake"].model_dump()
        upstream["adapter_slots"] = {"max_loras": 2, "max_cpu_loras": 8}
        settings = make_settings(
            tmp_path,
            fake.base_url,
            upstreams={"fake": upstream},
            scenarios={name: {"upstream": "fake"} for name in SCENARIOS},
            activation={"poll_interval_seconds": 0.05, "adapter_cache_interval_seconds": 0.05},
        )
        with GatewayThread(settings) as gateway:
            client = gateway.openai()
            chain = ReleaseChain(gateway.database)
            store = open_artifact_store(settings.artifacts_url())
            published = {}
            for scenario in SCENARIOS:
                headers = {"x-reef-scenario": scenario}
                old = turn(client, "before", stream=False, headers=headers).release
                assert old is not None
                digest = store.put_dir(_adapter(tmp_path, scenario), "adapter")
                manifest = ReleaseManifest(model=ModelComponent(base="fake-model", adapter=digest))
                candidate = chain.propose(scenario, manifest, old, "test", "an adapter")
                published[scenario] = chain.publish(
                    candidate.id, old, "test", "an adapter", require_passed=False
                ).id

            eventually(
                lambda: len(_cache(gateway).get("needed", ())) == 3 and _cache(gateway)["cliff"],
                "the cache cliff with three adapters needed",
            )
            cache = _cache(gateway)
            assert len(fake.adapters) == 3
            assert cache["resident"] == sorted(fake.adapters) == cache["needed"]
            assert cache["adapter_slots"] == {
                "max_loras": 2,
                "max_cpu_loras": 8,
                "source": "config",
            }
            assert cache["evictions_total"] == 0 and cache["evicted"] == []
            assert _metric(gateway, 'reef_adapter_cache_cliff{upstream="fake"}') == 1.0
            assert _metric(gateway, 'reef_adapter_slots{kind="gpu",upstream="fake"}') == 2.0
            assert _metric(gateway, 'reef_adapter_slots{kind="cpu",upstream="fake"}') == 8.0
            assert _metric(gateway, 'reef_adapters_needed{upstream="fake"}') == 3.0
            assert _metric(gateway, 'reef_adapters_resident{upstream="fake"}') == 3.0
            warnings = [r for r in caplog.records if "adapter cache cliff" in r.getMessage()]
            assert len(warnings) == 1  # when it starts, not on every check
            assert "3 adapters need to be active" in warnings[0].getMessage()
            line = _adapter_cache_line("fake", cache)
            assert "3 resident, 3 needed active, 2 slots (+8 in host memory)" in line
            assert "CACHE CLIFF" in line

            # the server drops one adapter on its own (vLLM's LRU): one eviction
            victim = sorted(fake.adapters)[0]
            fake.server.evict(victim)
            eventually(lambda: _cache(gateway)["evictions_total"] == 1, "the eviction counted")
            checked = _cache(gateway)["checked_at"]
            eventually(lambda: _cache(gateway)["checked_at"] != checked, "another check after it")
            cache = _cache(gateway)
            assert cache["evictions_total"] == 1  # still gone, counted once
            assert cache["evicted"] == [victim]
            assert victim not in cache["resident"] and len(cache["resident"]) == 2
            assert _metric(gateway, 'reef_adapter_evictions_total{upstream="fake"}') == 1.0
            assert any(
                victim in r.getMessage() and "evicted" in r.getMessage() for r in caplog.records
            )


async def test_slots_the_upstream_tells_win_and_a_failed_listing_keeps_the_last_figures() -> None:
    fake = FakeUpstream(adapters=True, lists_adapters=True, card_extra={"max_loras": 2})
    await fake.start()
    config = UpstreamConfig(type="openai", base_url=fake.base_url, model="fake-model")
    upstream = HTTPUpstream("fake", config)
    telemetry = AdapterCacheTelemetry({"fake": (8, 16)})
    try:
        fake.adapters.update({"s@a", "s@b", "s@c"})
        state = await telemetry.check(upstream, {"s@a", "s@b", "s@c"}, {"s@a", "s@b", "s@c"})
        # the upstream says 2 GPU slots; the configured 8 gives way, the CPU slots stay
        assert (state.max_loras, state.max_cpu_loras, state.slots_source) == (2, 16, "upstream")
        assert state.cliff and state.listed == 3 and state.evictions_total == 0
        fake.evict("s@b")
        state = await telemetry.check(upstream, {"s@a", "s@b", "s@c"}, {"s@a", "s@c"})
        assert state.evictions_total == 1 and state.evicted == ["s@b"]
        assert not state.cliff  # two needed, two slots
        await fake.stop()  # the upstream goes away: the last figures stay, with the error
        state = await telemetry.check(upstream, {"s@a", "s@b", "s@c"}, {"s@a", "s@c"})
        assert state.error is not None and "fake" in state.error
        assert state.evictions_total == 1 and state.resident == ["s@a", "s@c"]
    finally:
        await upstream.aclose()
        await fake.stop()
