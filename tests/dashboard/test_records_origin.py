"""The records page shows where each record came from and filters by it, in headless
Chromium against a gateway holding live traffic and records imported through the upload
route (``POST /reef/scenarios/{s}/import``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from reef.experience import IMPORT_FORMATS
from tests.dashboard.browser import DashboardPage
from tests.dashboard.world import DashboardWorld
from tests.fakes.upstream import FakeUpstreamThread
from tests.gateway.harness import GatewayThread, make_settings
from tests.gateway.rawhttp import call

DATA = Path(__file__).resolve().parents[1] / "data" / "import"
RECORDS = "#/scenarios/support/records"


def _origins(tab: DashboardPage) -> list[str]:
    """The Origin cell of each row of the records table, in page order."""
    found = tab.page.eval_on_selector_all(
        "#records tbody tr",
        "rows => rows.map(r => r.cells[[...r.closest('table').tHead.rows[0].cells]"
        ".findIndex(c => c.textContent === 'Origin')].textContent)",
    )
    return [str(origin) for origin in found]


def test_the_records_page_shows_and_filters_by_origin(
    world: DashboardWorld, browser: Any, tmp_path: Path
) -> None:
    # ``world`` first, though unused: the package's shared gateway runs the gate
    # (asyncio.run) when built, which cannot start once Playwright holds this thread's loop.
    with (
        FakeUpstreamThread() as fake,
        GatewayThread(make_settings(tmp_path, fake.base_url)) as gateway,
    ):
        gateway.openai().chat.completions.create(
            model="reef/support", messages=[{"role": "user", "content": "a live question"}]
        )
        answer = call(
            gateway.port,
            "POST",
            "/reef/scenarios/support/import?format=openai-finetune",
            (DATA / "openai-finetune.jsonl").read_bytes(),
            {"content-type": "application/x-ndjson"},
        )
        assert answer.status == 200 and answer.json()["records"] == 4
        context = browser.new_context(viewport={"width": 1280, "height": 900})
        tab = DashboardPage(context.new_page(), gateway.url, tmp_path)

        tab.open(f"{RECORDS}?feedback=")
        assert sorted(_origins(tab)) == ["import:openai-finetune"] * 4 + ["live"]
        source = tab.page.get_attribute("#records .badge.origin", "title")
        assert source is not None and source.startswith("source id: ")
        tab.screenshot("records-origin")
        # the filter offers every import format, read from the API description
        offered = tab.page.eval_on_selector_all(
            "#origin-filter option", "options => options.map(o => o.value)"
        )
        assert offered == ["", "live", *(f"import:{name}" for name in IMPORT_FORMATS)]

        tab.page.select_option("#origin-filter", "import:openai-finetune")
        tab.wait(f"{RECORDS}?feedback=&origin=import%3Aopenai-finetune")
        assert _origins(tab) == ["import:openai-finetune"] * 4
        assert "capital of France" in tab.text("#records")

        tab.page.select_option("#origin-filter", "live")
        tab.wait(f"{RECORDS}?feedback=&origin=live")
        assert _origins(tab) == ["live"]
        assert "a live question" in tab.text("#records")

        # the feedback filter keeps the origin: imported demonstrations carry feedback
        tab.page.select_option("#feedback-filter", "true")
        tab.wait(f"{RECORDS}?feedback=true&origin=live")
        assert "No records of this origin." in tab.text()
        tab.page.select_option("#origin-filter", "import:reef")
        tab.wait(f"{RECORDS}?feedback=true&origin=import%3Areef")
        assert "No records of this origin." in tab.text()
        assert tab.problems == []
        context.close()
