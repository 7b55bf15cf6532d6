"""Web pages cannot drive a keyless gateway, in a real browser (Debian's Chromium via
Playwright; skipped without it, failed under ``REEF_TEST_REQUIRE_BROWSER=1``).

A page on another loopback origin sends what a browser lets any page send: a
``text/plain`` form POST and ``no-cors`` fetches to ``/reef/scenarios/x/learn``. The gateway
refuses each with a 4xx it logs, and no job is queued. A page of an origin the operator
allowed (``server.allowed_origins``) does the same call and queues one, so the refusals
are the policy's and not a browser that never sent anything. A page reaching the gateway
under another name (DNS rebinding: Chromium maps ``attacker.example`` to 127.0.0.1) is
refused by the ``Host`` check.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from reef.jobs import JobQueue
from tests.dashboard.browser import TIMEOUT_MS, chromium_path
from tests.gateway.harness import GatewayThread
from tests.polling import eventually

ATTACK = """<!doctype html><title>attack</title>
<iframe name="sink"></iframe>
<form id="form" method="POST" action="{target}" enctype="text/plain" target="sink">
<input name='{{"trigger":"' value='manual"}}'></form>
<script>
document.getElementById("form").submit();
const done = [];
const mark = (name) => () => {{ done.push(name); document.body.dataset.done = done.join(); }};
fetch("{target}", {{mode: "no-cors", method: "POST", body: '{{"trigger": "manual"}}'}})
  .then(mark("text"), mark("text-failed"));
fetch("{target}", {{mode: "no-cors", method: "POST"}}).then(mark("empty"), mark("empty-failed"));
</script>"""

FRIEND = """<!doctype html><title>friend</title><script>
fetch("{target}", {{method: "POST", headers: {{"content-type": "application/json"}},
                   body: "{{}}"}})
  .then((r) => {{ document.body.dataset.status = String(r.status); }},
        (e) => {{ document.body.dataset.status = "failed " + e; }});
</script>"""


class PageServer:
    """A loopback web server of one HTML page at ``/`` (``html``, settable while it
    runs), on another origin than the gateway's: another port."""

    def __init__(self, html: str = "") -> None:
        self.html = html
        pages = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                body = pages.html.encode()
                self.send_response(200)
                self.send_header("content-type", "text/html; charset=utf-8")
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.origin = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> PageServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(scope="module")
def chromium() -> Iterator[Any]:
    """Chromium that resolves ``attacker.example`` to loopback, as a rebinding DNS would."""
    executable = chromium_path()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=executable,
            args=["--host-resolver-rules=MAP attacker.example 127.0.0.1"],
        )
        yield browser
        browser.close()


class GatewayLog(logging.Handler):
    """What the gateway logs at warning and above, straight from its logger (whatever
    propagation or levels other tests left on the logging tree)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())

    def refusals(self, path: str) -> list[str]:
        return [line for line in self.lines if f"refused POST {path} (4" in line]


@pytest.fixture
def gateway_log() -> Iterator[GatewayLog]:
    logger = logging.getLogger("reef.gateway")
    handler, level = GatewayLog(), logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.WARNING)
    yield handler
    logger.removeHandler(handler)
    logger.setLevel(level)


def test_a_page_of_another_origin_cannot_queue_learning(
    make_gateway: Callable[..., GatewayThread],
    tmp_path: Path,
    chromium: Any,
    gateway_log: GatewayLog,
) -> None:
    with PageServer() as friend_origin:
        recipe = tmp_path / "recipe.yaml"
        recipe.write_text("learners: [{type: fewshot, k: 2}]\n")
        gateway = make_gateway(
            server={"allowed_origins": [friend_origin.origin]},
            scenarios={"x": {"recipe": recipe}, "y": {"recipe": recipe}},
        )
        jobs = JobQueue(gateway.database)
        target = f"{gateway.url}/reef/scenarios/x/learn"
        context = chromium.new_context()
        page = context.new_page()
        page.set_default_timeout(TIMEOUT_MS)
        with PageServer(ATTACK.format(target=target)) as attacker:
            page.goto(attacker.origin + "/")
            page.wait_for_selector('body[data-done*="text"][data-done*="empty"]', state="attached")
            eventually(
                lambda: len(gateway_log.refusals("/reef/scenarios/x/learn")) >= 3,
                "the gateway to log the form POST and both fetches as refused",
            )
        refused = gateway_log.refusals("/reef/scenarios/x/learn")
        assert all("(403)" in line and "server.allowed_origins" in line for line in refused)
        assert jobs.list("x") == []  # nothing queued

        # The same call from an allowed origin's page, with its JSON, queues a job.
        friend_origin.html = FRIEND.format(target=f"{gateway.url}/reef/scenarios/y/learn")
        page.goto(friend_origin.origin + "/")
        page.wait_for_selector("body[data-status]", state="attached")
        assert page.get_attribute("body", "data-status") == "202"
        assert [job.scenario for job in jobs.list("y")] == ["y"]
        assert jobs.list("x") == []
        context.close()


def test_a_rebinding_page_is_refused_by_the_host_check(
    gateway: GatewayThread, chromium: Any, gateway_log: GatewayLog
) -> None:
    context = chromium.new_context()
    page = context.new_page()
    page.set_default_timeout(TIMEOUT_MS)
    records = f"http://attacker.example:{gateway.port}/reef/scenarios/support/records"
    answer = page.goto(records)
    assert answer is not None and answer.status == 400
    assert "server.allowed_hosts" in answer.text()
    assert any("attacker.example" in line for line in gateway_log.lines)
    # The same gateway under its own name answers: the refusal is the Host's.
    own = page.goto(f"{gateway.url}/reef/scenarios/support/records")
    assert own is not None and own.status == 200
    context.close()
