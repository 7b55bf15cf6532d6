"""Config drift: a model edited in the configuration after the first release is named
in one warning on start, and serves only once adopted (``reef releases adopt-config``,
``POST /reef/scenarios/{s}/adopt-config``), through the chain's compare-and-swap."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from reef.cli.exits import run
from reef.cli.main import app
from reef.config import ReefSettings
from reef.db import open_database
from reef.gateway.serving.drift import (
    NothingToAdoptError,
    adopt_config,
    config_drift,
    configured_model,
)
from reef.releases import ModelComponent, ReleaseChain, ReleaseConflictError, ReleaseManifest
from tests.fakes.upstream import FakeUpstreamThread
from tests.gateway.harness import GatewayThread, make_settings
from tests.gateway.rawhttp import call

DRIFT_LOGGER = "reef.gateway.serving.drift"
ADAPTER = "sha256:" + "a" * 64
CHECKPOINT = "sha256:" + "c" * 64
HARNESS = "sha256:" + "b" * 64


@pytest.fixture(scope="module")
def fake() -> Iterator[FakeUpstreamThread]:
    with FakeUpstreamThread() as server:
        yield server


def _with_model(settings: ReefSettings, model: str) -> ReefSettings:
    """``settings`` with ``upstreams.fake.model`` edited, as an operator edits reef.yaml."""
    upstreams = dict(settings.upstreams)
    upstreams["fake"] = upstreams["fake"].model_copy(update={"model": model})
    return settings.model_copy(update={"upstreams": upstreams})


def _model_sent(gateway: GatewayThread, fake: FakeUpstreamThread) -> Any:
    """Send one chat request to scenario support; the model name the upstream received."""
    gateway.openai().chat.completions.create(
        model="reef/support", messages=[{"role": "user", "content": "hi"}]
    )
    return fake.server.last_request_body["model"]


def _drift_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == DRIFT_LOGGER and r.levelno == logging.WARNING
    ]


def test_a_changed_model_warns_on_restart_and_serves_once_adopted(
    tmp_path: Path, fake: FakeUpstreamThread, caplog: pytest.LogCaptureFixture
) -> None:
    first = make_settings(tmp_path, fake.base_url)
    with GatewayThread(first) as gateway:
        assert _model_sent(gateway, fake) == "fake-model"
    assert _drift_warnings(caplog) == []

    edited = _with_model(first, "fake-model-2")
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger=DRIFT_LOGGER), GatewayThread(edited) as gateway:
        [warning] = _drift_warnings(caplog)  # one line, for the one scenario that drifted
        for named in ("'support'", "'fake-model-2'", "'fake-model'", "upstreams.fake.model"):
            assert named in warning, warning
        assert "reef releases adopt-config --scenario support" in warning
        # the chain decides: the old model still serves
        assert _model_sent(gateway, fake) == "fake-model"

        adopted = call(gateway.port, "POST", "/reef/scenarios/support/adopt-config", {})
        assert adopted.status == 201, adopted.text
        release = adopted.json()
        assert (release["operation"], release["seq"]) == ("adopt", 2)
        assert release["manifest"]["model"]["base"] == "fake-model-2"
        assert release["evidence"]["adopted"] == {
            "setting": "upstreams.fake.model",
            "from": "fake-model",
            "to": "fake-model-2",
        }
        # the route waited for the flip: the next request goes out with the new name
        assert _model_sent(gateway, fake) == "fake-model-2"

        again = call(gateway.port, "POST", "/reef/scenarios/support/adopt-config", {})
        assert again.status == 409, again.text
        assert "nothing to adopt" in again.json()["error"]["message"]

    caplog.clear()
    with caplog.at_level(logging.WARNING, logger=DRIFT_LOGGER), GatewayThread(edited):
        assert _drift_warnings(caplog) == []  # adopted: nothing left to warn about


def test_a_stale_expected_head_is_a_conflict_on_the_route(
    tmp_path: Path, fake: FakeUpstreamThread
) -> None:
    first = make_settings(tmp_path, fake.base_url)
    with GatewayThread(first):
        pass  # the create release, serving fake-model
    edited = _with_model(first, "fake-model-2")
    database = open_database(edited.store_url())
    try:
        chain = ReleaseChain(database)
        created = chain.head("support")
        assert created is not None
        # someone else moves the head after the caller read it
        harnessed = created.manifest.model_copy(update={"harness": HARNESS})
        candidate = chain.propose("support", harnessed, created.id, "worker", "job")
        chain.publish(candidate.id, created.id, "worker", "gate", require_passed=False)
    finally:
        database.close()
    with GatewayThread(edited) as gateway:
        stale = call(
            gateway.port,
            "POST",
            "/reef/scenarios/support/adopt-config",
            {"expected_head": created.id},
        )
        assert stale.status == 409, stale.text
        assert "moved" in stale.json()["error"]["message"]


# -- the chain and the CLI, without a gateway ------------------------------------------


@pytest.fixture
def settings(tmp_path: Path) -> ReefSettings:
    return make_settings(tmp_path, "http://127.0.0.1:9/v1")


@pytest.fixture
def chain(settings: ReefSettings) -> Iterator[ReleaseChain]:
    database = open_database(settings.store_url())
    try:
        yield ReleaseChain(database)
    finally:
        database.close()


def _learned_head(chain: ReleaseChain, base: str) -> str:
    """A chain for ``support`` whose head serves an adapter and a checkpoint on ``base``."""
    root = chain.create(
        "support", ReleaseManifest(model=ModelComponent(base=base), harness=HARNESS), "t", "i"
    )
    learned = ReleaseManifest(
        model=ModelComponent(base=base, adapter=ADAPTER, checkpoint=CHECKPOINT), harness=HARNESS
    )
    candidate = chain.propose("support", learned, root.id, "worker", "job")
    return chain.publish(candidate.id, root.id, "worker", "gate", require_passed=False).id


def test_adopting_keeps_the_harness_and_drops_weights_of_the_old_base(
    settings: ReefSettings, chain: ReleaseChain
) -> None:
    head_id = _learned_head(chain, "old-model")
    head = chain.get_release(head_id)
    drift = config_drift(settings, "support", head)
    assert drift is not None
    assert (drift.served, drift.configured.name) == ("old-model", "fake-model")

    release = adopt_config(chain, settings, "support", "cli:test")
    assert (release.parent_id, release.operation) == (head_id, "adopt")
    assert release.manifest.model == ModelComponent(base="fake-model")
    assert release.manifest.harness == HARNESS
    assert release.evidence is not None
    assert release.evidence["dropped"] == {"adapter": ADAPTER, "checkpoint": CHECKPOINT}
    assert chain.head("support") == release


def test_a_concurrent_head_move_makes_the_adoption_lose(
    settings: ReefSettings, chain: ReleaseChain
) -> None:
    head_id = _learned_head(chain, "old-model")
    # another writer rolls back after this caller read the head
    [_learned, root] = chain.releases("support")
    chain.rollback("support", root.id, head_id, "cli:other", "undo")
    with pytest.raises(ReleaseConflictError):
        adopt_config(chain, settings, "support", "cli:test", expected_head=head_id)
    assert chain.head("support").operation == "rollback"  # type: ignore[union-attr]


def test_the_scenario_model_wins_over_the_upstream_model(tmp_path: Path) -> None:
    settings = make_settings(
        tmp_path, "http://127.0.0.1:9/v1", scenarios={"support": {"model": "own"}}
    )
    found = configured_model(settings, "support")
    assert (found.name, found.setting) == ("own", "scenarios.support.model")


def _reef(*args: str) -> int:
    with pytest.raises(SystemExit) as exited:
        run(app, list(args))
    return int(exited.value.code or 0)


def test_the_cli_adopts_once_then_refuses_with_exit_2(
    tmp_path: Path, settings: ReefSettings, chain: ReleaseChain, capsys: pytest.CaptureFixture[str]
) -> None:
    _learned_head(chain, "old-model")
    config = tmp_path / "reef.yaml"
    config.write_text(
        f"store: {{url: '{settings.store_url()}'}}\n"
        "upstreams: {fake: {base_url: 'http://127.0.0.1:9/v1', model: fake-model}}\n"
        "scenarios: {support: {upstream: fake}}\n",
        encoding="utf-8",
    )
    assert _reef("releases", "adopt-config", "--scenario", "support", "-c", str(config)) == 0
    assert chain.head("support").manifest.model.base == "fake-model"  # type: ignore[union-attr]
    capsys.readouterr()

    assert _reef("releases", "adopt-config", "--scenario", "support", "-c", str(config)) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: nothing to adopt") and "upstreams.fake.model" in err, err
    assert err.count("\n") == 1 and "Traceback" not in err
    with pytest.raises(NothingToAdoptError):
        adopt_config(chain, settings, "support", "cli:test")
