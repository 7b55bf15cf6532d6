"""Two gateway processes on one PostgreSQL both serve a newly published head (how soon
after the publish: ``bench/activation.py``)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from reef.experience import SQLExperienceStore
from reef.harness import Bundle, Harness, pack_bundle
from reef.releases import ModelComponent, ReleaseChain, ReleaseManifest, open_artifact_store
from tests.experience.conftest import PG_ENV, ThrowawayDatabases
from tests.fakes.upstream import FakeUpstreamThread
from tests.gateway.harness import free_port
from tests.gateway.rawhttp import RawResponse, call
from tests.polling import eventually

pytestmark = pytest.mark.postgres
CHAT = {"model": "reef/shared", "messages": [{"role": "user", "content": "which release?"}]}


@pytest.fixture
def pg_url() -> Iterator[str]:
    url = os.environ.get(PG_ENV)
    if not url:
        pytest.skip(f"{PG_ENV} is not set; the two-gateway test needs a PostgreSQL server")
    databases = ThrowawayDatabases(url)
    try:
        yield databases.create()
    finally:
        databases.drop_all()


def _gateway(
    tmp_path: Path, name: str, pg_url: str, upstream: str, artifacts: Path
) -> tuple[subprocess.Popen[bytes], int]:
    port = free_port()
    config = {
        "home": str(tmp_path / name),
        "server": {"port": port},
        "store": {"url": pg_url},
        "artifacts": {"url": str(artifacts)},
        "upstreams": {"fake": {"type": "openai", "base_url": upstream, "model": "fake-model"}},
        "scenarios": {"shared": {"harness": "managed"}},
        "activation": {"poll_interval_seconds": 0.5},
    }
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(config))
    process = subprocess.Popen(
        [sys.executable, "-m", "reef", "serve", "-c", str(path), "--log-level", "WARNING"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    return process, port


def _ask(port: int) -> RawResponse:
    return call(port, "POST", "/v1/chat/completions", CHAT)


def _wait_up(process: subprocess.Popen[bytes], port: int) -> None:
    def healthy() -> bool:
        assert process.poll() is None, "gateway exited"
        return call(port, "GET", "/healthz").status == 200

    eventually(healthy, "the gateway to start", timeout_seconds=60, ignoring=(OSError,))


def test_both_gateways_serve_a_new_head(tmp_path: Path, pg_url: str) -> None:
    artifacts_dir = tmp_path / "artifacts"
    processes = []
    with FakeUpstreamThread() as fake:
        try:
            for name in ("one", "two"):
                processes.append(_gateway(tmp_path, name, pg_url, fake.base_url, artifacts_dir))
            for process, port in processes:
                _wait_up(process, port)
            first = {_ask(port).headers["x-reef-release-id"] for _, port in processes}
            assert len(first) == 1, "both gateways serve the same create release"

            store = SQLExperienceStore.from_url(pg_url)
            try:
                chain = ReleaseChain(store.database)
                head = chain.head("shared")
                assert head is not None and head.id in first
                bundle = Bundle(harness=Harness(schema_version=1, system_prompt="v2"), files={})
                harness = open_artifact_store(str(artifacts_dir)).put_bytes(
                    pack_bundle(bundle), "harness"
                )
                manifest = ReleaseManifest(model=ModelComponent(base="fake-model"), harness=harness)
                candidate = chain.propose("shared", manifest, head.id, "test", "v2")
                release = chain.publish(candidate.id, head.id, "test", "v2", require_passed=False)
            finally:
                store.close()

            switched: set[int] = set()

            def both_switched() -> bool:
                for _, port in processes:
                    if port in switched:
                        continue
                    if _ask(port).headers["x-reef-release-id"] == release.id:
                        switched.add(port)
                return len(switched) == 2

            eventually(both_switched, "both gateways to serve the new head", timeout_seconds=5)
        finally:
            for process, _ in processes:
                process.terminate()
            for process, _ in processes:
                process.wait(timeout=20)
