"""The world the end-to-end tests run in: the tiny random model served by the embedded
engine on loopback, and a real gateway in front of it."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from reef.engine.models import load_model
from reef.engine.runtime import Engine
from reef.engine.server import BackgroundServer
from tests.gateway.harness import GatewayThread, make_settings
from tests.gateway.rawhttp import call
from tests.polling import eventually


@contextmanager
def tiny_gateway(
    tmp_path: Path,
    scenarios: dict[str, Any],
    upstreams: dict[str, Any] | None = None,
    **overrides: Any,
) -> Iterator[GatewayThread]:
    """A gateway whose upstream ``engine`` is the tiny model (one compute thread), serving
    ``scenarios``; ``upstreams`` are further upstreams (a judge), ``overrides`` further
    settings (``auth``, …)."""
    engine = BackgroundServer(Engine(load_model("tiny-random", tmp_path), max_batch=8, threads=1))
    engine.start()
    try:
        upstream = {"type": "openai", "base_url": engine.base_url, "model": "tiny-random"}
        settings = make_settings(
            tmp_path,
            engine.base_url,
            upstreams={"engine": upstream, **(upstreams or {})},
            scenarios=scenarios,
            **{"activation": {"poll_interval_seconds": 0.1}, **overrides},
        )
        with GatewayThread(settings) as gateway:
            yield gateway
    finally:
        engine.stop()


def serving_release(gateway: GatewayThread, scenario: str) -> str | None:
    """The release the gateway serves ``scenario`` from now (``/reef/status``)."""
    status: dict[str, Any] = call(gateway.port, "GET", "/reef/status").json()
    return status["scenarios"][scenario]["serving_release_id"]  # type: ignore[no-any-return]


def until_serving(gateway: GatewayThread, scenario: str, release_id: str) -> None:
    """Wait until the gateway serves ``scenario`` from ``release_id``: it activates a new
    head on its next poll of the chain, so answers asked right after a publish may still
    come from the release before."""
    eventually(
        lambda: serving_release(gateway, scenario) == release_id,
        f"the gateway serving release {release_id} for {scenario!r}",
    )
