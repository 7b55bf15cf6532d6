"""``reef status`` against a real keyed gateway: readable times, releases and jobs; a
refused key names ``--api-key`` and ``REEF_API_KEY``."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from reef.jobs import JobQueue
from reef.releases import ReleaseChain
from tests.fakes.upstream import FakeUpstreamThread
from tests.gateway.harness import GatewayThread, make_settings

KEYS = {
    "keys": [
        {"id": "ops", "key": "sk-admin", "role": "admin"},
        {"id": "app", "key": "sk-app", "role": "inference"},
    ]
}
EPOCH = re.compile(r"\b1\d{9}(\.\d+)?\b")


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayThread]:
    tmp_path = tmp_path_factory.mktemp("status")
    with (
        FakeUpstreamThread() as fake,
        GatewayThread(make_settings(tmp_path, fake.base_url, auth=KEYS)) as gateway,
    ):
        JobQueue(gateway.database).enqueue("support", "learn", {"trigger": "manual"})
        yield gateway


def status(gateway: GatewayThread, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if k != "REEF_API_KEY"}
    return subprocess.run(
        [sys.executable, "-m", "reef", "status", "--url", gateway.url, *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**clean, **env},
        cwd=gateway.settings.home.parent,
    )


def test_status_is_human_readable(gateway: GatewayThread) -> None:
    result = status(gateway, "--api-key", "sk-admin")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert not EPOCH.search(out), out  # no epoch timestamps
    assert re.search(r"20\d\d-\d\d-\d\d \d\d:\d\d:\d\d", out), out
    heads = {s.name: s.head_release_id for s in ReleaseChain(gateway.database).scenarios()}
    for scenario in ("support", "claude"):
        assert scenario in out and str(heads[scenario]) in out, out
    [job] = JobQueue(gateway.database).list(scenario="support")
    assert job.id in out and "queued" in out, out
    assert "capture" in out and "sync" in out, out


def test_status_reads_the_key_from_the_environment(gateway: GatewayThread) -> None:
    result = status(gateway, REEF_API_KEY="sk-admin")
    assert result.returncode == 0, result.stderr
    assert "support" in result.stdout


def test_status_json_keeps_the_gateway_answer(gateway: GatewayThread) -> None:
    result = status(gateway, "--api-key", "sk-admin", "--json")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert set(data["scenarios"]) == {"support", "claude"}
    assert data["capture"]["durability"] == "sync"
    assert [job["state"] for job in data["jobs"]["support"]] == ["queued"]


@pytest.mark.parametrize("key", [None, "sk-wrong"])
def test_a_401_says_to_pass_an_admin_key(gateway: GatewayThread, key: str | None) -> None:
    result = status(gateway, *(["--api-key", key] if key else []))
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    [line] = result.stderr.strip().splitlines()
    assert "--api-key" in line and "REEF_API_KEY" in line, line
    assert "sk-wrong" not in line


def test_a_403_says_the_key_is_not_an_admin_key(gateway: GatewayThread) -> None:
    result = status(gateway, "--api-key", "sk-app")
    assert result.returncode == 1
    [line] = result.stderr.strip().splitlines()
    assert "not an admin key" in line and "--api-key" in line, line


def test_no_gateway_is_one_line(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "reef", "status", "--url", "http://127.0.0.1:9"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert result.returncode == 1
    [line] = result.stderr.strip().splitlines()
    assert "no gateway at http://127.0.0.1:9" in line and "--url" in line, line
