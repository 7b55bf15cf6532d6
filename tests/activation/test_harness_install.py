"""A client installs the serving harness from a real gateway, follows a new release, and
rolls back; the HTTP routes speak the contract the client verifies."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from reef.client import current_release, load_installed
from reef.harness import Bundle, Harness, pack_bundle, write_bundle
from reef.releases import ModelComponent, ReleaseChain, ReleaseManifest, open_artifact_store
from tests.fakes.upstream import FakeUpstreamThread
from tests.gateway.harness import GatewayThread, make_settings
from tests.gateway.rawhttp import call
from tests.polling import eventually


def reef(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "reef", *args], capture_output=True, text=True, timeout=60
    )


def _wait_serving(gateway: GatewayThread, scenario: str, release_id: str) -> None:
    def serving() -> bool:
        state = call(gateway.port, "GET", "/reef/status").json()["scenarios"].get(scenario, {})
        return bool(state.get("serving_release_id") == release_id)

    eventually(serving, f"{release_id} to serve")


def test_install_follow_and_roll_back(tmp_path: Path) -> None:
    with FakeUpstreamThread() as fake:
        _install_follow_and_roll_back(tmp_path, fake)


def _install_follow_and_roll_back(tmp_path: Path, fake: FakeUpstreamThread) -> None:
    first = tmp_path / "first"
    write_bundle(
        Bundle(
            harness=Harness(schema_version=1, system_prompt="You triage tickets.", memory=["v1"]),
            files={"skills/refunds.md": b"# refunds\n"},
        ),
        first,
    )
    settings = make_settings(
        tmp_path,
        fake.base_url,
        scenarios={"agent": {"upstream": "fake", "harness": "managed", "initial_harness": first}},
        activation={"poll_interval_seconds": 0.1},
    )
    install_dir = tmp_path / "installed"
    with GatewayThread(settings) as gateway:
        manifest = call(gateway.port, "GET", "/reef/scenarios/agent/harness")
        assert manifest.status == 200
        etag = manifest.headers["etag"]
        assert manifest.json()["harness"]["system_prompt"] == "You triage tickets."
        again = call(
            gateway.port, "GET", "/reef/scenarios/agent/harness", headers={"if-none-match": etag}
        )
        assert again.status == 304

        result = reef(
            "harness",
            "install",
            "--url",
            gateway.url,
            "--scenario",
            "agent",
            "--dir",
            str(install_dir),
        )
        assert result.returncode == 0, result.stderr
        v1 = current_release(install_dir)
        assert load_installed(install_dir).memory == ["v1"]
        assert (v1.path / "skills" / "refunds.md").read_bytes() == b"# refunds\n"
        assert f'"{v1.digest}"' == etag
        shown = reef("harness", "show", "--dir", str(install_dir))
        assert shown.returncode == 0, shown.stderr
        assert json.loads(shown.stdout)["files"] == ["skills/refunds.md"]

        # the managed harness is applied server-side, and recorded both ways
        raw = gateway.openai().chat.completions.with_raw_response.create(
            model="reef/agent", messages=[{"role": "user", "content": "hello"}]
        )
        record = gateway.store.get_record(raw.headers["x-reef-record-id"])
        assert record.request["messages"] == [{"role": "user", "content": "hello"}]
        assert record.rendered_request is not None
        assert "You triage tickets." in record.rendered_request["messages"][0]["content"]

        # a new harness release: install follows it
        chain = ReleaseChain(gateway.database)
        artifacts = open_artifact_store(settings.artifacts_url())
        bundle = Bundle(harness=Harness(schema_version=1, system_prompt="v2 prompt"), files={})
        digest = artifacts.put_bytes(pack_bundle(bundle), "harness")
        head = chain.head("agent")
        assert head is not None
        candidate = chain.propose(
            "agent",
            ReleaseManifest(model=ModelComponent(base="fake-model"), harness=digest),
            head.id,
            "test",
            "v2",
        )
        v2_release = chain.publish(candidate.id, head.id, "test", "v2", require_passed=False)
        _wait_serving(gateway, "agent", v2_release.id)
        result = reef(
            "harness",
            "install",
            "--url",
            gateway.url,
            "--scenario",
            "agent",
            "--dir",
            str(install_dir),
        )
        assert result.returncode == 0, result.stderr
        assert current_release(install_dir).release_id == v2_release.id
        assert load_installed(install_dir).system_prompt == "v2 prompt"

        # roll the installation back, then the server
        result = reef("harness", "rollback", "--dir", str(install_dir), "--release", v1.release_id)
        assert result.returncode == 0, result.stderr
        assert load_installed(install_dir).system_prompt == "You triage tickets."
        response = call(gateway.port, "POST", "/reef/scenarios/agent/rollback", {"to": head.id})
        assert response.status == 201, response.body
        stale = call(
            gateway.port,
            "POST",
            "/reef/scenarios/agent/rollback",
            {"to": head.id, "expected_head": v2_release.id},
        )
        assert stale.status == 409
        served = call(gateway.port, "GET", "/reef/scenarios/agent/harness").json()
        assert served["harness"]["system_prompt"] == "You triage tickets."
        releases = call(gateway.port, "GET", "/reef/scenarios/agent/releases").json()["data"]
        assert [r["operation"] for r in releases] == ["rollback", "learn", "create"]
        scenarios = call(gateway.port, "GET", "/reef/scenarios").json()["data"]
        agent = next(s for s in scenarios if s["name"] == "agent")
        assert agent["serving_release_id"] == releases[0]["id"]
