"""A head that cannot be staged never serves: the previous release keeps serving and the
failure shows in /reef/status and the metrics."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from reef.releases import ModelComponent, ReleaseChain, ReleaseManifest, open_artifact_store
from tests.fakes.upstream import FakeUpstreamThread
from tests.gateway.harness import GatewayThread, make_settings
from tests.gateway.rawhttp import call
from tests.polling import eventually


def _failed(gateway: GatewayThread) -> dict[str, Any] | None:
    """Scenario ``s``'s status once its staging has failed, else None."""
    state: dict[str, Any] = call(gateway.port, "GET", "/reef/status").json()["scenarios"]["s"]
    return state if state["state"] == "failed" else None


def test_failed_staging_keeps_the_old_release(tmp_path: Path) -> None:
    adapter_dir = tmp_path / "adapter"
    adapter_dir.mkdir()
    (adapter_dir / "adapter_config.json").write_text("{}")
    (adapter_dir / "adapter_model.safetensors").write_bytes(b"not really weights")
    with FakeUpstreamThread() as fake:
        settings = make_settings(
            tmp_path,
            fake.base_url,
            scenarios={"s": {"upstream": "fake"}},
            activation={"poll_interval_seconds": 0.1},
        )
        with GatewayThread(settings) as gateway:
            client = gateway.openai()
            first = client.chat.completions.with_raw_response.create(
                model="reef/s", messages=[{"role": "user", "content": "before"}]
            )
            old = first.headers["x-reef-release-id"]
            chain = ReleaseChain(gateway.database)
            # the fake upstream has no adapter API: loading the adapter fails
            digest = open_artifact_store(settings.artifacts_url()).put_dir(adapter_dir, "adapter")
            manifest = ReleaseManifest(model=ModelComponent(base="fake-model", adapter=digest))
            candidate = chain.propose("s", manifest, old, "test", "unloadable")
            new = chain.publish(candidate.id, old, "test", "unloadable", require_passed=False)

            state = eventually(lambda: _failed(gateway), "staging the unloadable release to fail")
            assert state["head_release_id"] == new.id
            assert state["serving_release_id"] == old
            assert state["error"]

            after = client.chat.completions.with_raw_response.create(
                model="reef/s", messages=[{"role": "user", "content": "after"}]
            )
            assert after.headers["x-reef-release-id"] == old
            assert gateway.store.get_record(after.headers["x-reef-record-id"]).release_id == old
            metrics = call(gateway.port, "GET", "/metrics").body.decode()
            assert 'reef_activation_failed{scenario="s"} 1.0' in metrics
            assert "reef_activation_failures_total 1.0" in metrics
