"""``reef serve``: open the store, build upstreams, run the gateway under uvicorn."""

from __future__ import annotations

import ipaddress
import logging
from typing import TYPE_CHECKING

import uvicorn

from reef.config import ReefSettings
from reef.experience import open_store
from reef.gateway import create_app
from reef.upstream import Upstream, build_upstream

if TYPE_CHECKING:
    from reef.cli.local_engine import LocalEngine

log = logging.getLogger("reef.serve")


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def effective_host(settings: ReefSettings) -> str:
    """Where to listen: never beyond loopback without API keys."""
    host = settings.bind_host()
    if not settings.auth.keys:
        if not _is_loopback(host):
            log.warning(
                "no API keys configured: refusing to listen on %s; listening on 127.0.0.1 "
                "only (configure auth.keys to serve other hosts)",
                host,
            )
            return "127.0.0.1"
        log.warning("no API keys configured: anyone on this machine can use the gateway")
    return host


def run_gateway(settings: ReefSettings) -> None:
    """Serve until interrupted; on exit, captures are drained and connections closed."""
    settings.home.mkdir(parents=True, exist_ok=True)
    store = open_store(settings.store_url())  # migrated on open
    engines: list[LocalEngine] = []
    if any(config.type == "local" for config in settings.upstreams.values()):
        from reef.cli.local_engine import start_local_upstreams

        resolved, engines = start_local_upstreams(dict(settings.upstreams), settings.home)
        settings = settings.model_copy(update={"upstreams": resolved})
    upstreams: dict[str, Upstream] = {
        name: build_upstream(name, config) for name, config in settings.upstreams.items()
    }
    app = create_app(settings, store, upstreams)
    host = effective_host(settings)
    log.info(
        "Reef gateway on http://%s:%d (store %s)", host, settings.server.port, settings.store_url()
    )
    try:
        uvicorn.run(
            app,
            host=host,
            port=settings.server.port,
            loop="uvloop",
            http="httptools",
            access_log=settings.server.access_log,
            log_level="warning",
            timeout_graceful_shutdown=10,
            # Forwarded headers are not trusted by default; nothing here reads them.
            proxy_headers=False,
        )
    finally:
        for engine in engines:
            engine.stop()
        store.close()
