"""A learning job that failed at the gate shows its error on the dashboard: the
scenario's jobs table and the candidate page name the failing item and field, escaped.
The job fails for real (tests/learning/test_worker_retries.py: a worker whose gate asks
the held-out items through a gateway in front of a model that refuses them)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from tests.dashboard.browser import DashboardPage
from tests.learning.test_worker_retries import REFUSAL, SCENARIO, learning_loop


def test_a_failed_job_shows_its_error_on_the_scenario_and_candidate_pages(
    browser: Any, tmp_path: Path
) -> None:
    with learning_loop(tmp_path) as loop:
        loop.model.mood = "refuse"
        loop.queue.enqueue(SCENARIO, "learn", {"trigger": "manual"})
        # the gate runs its own event loop: not in this thread, where Playwright holds one
        with ThreadPoolExecutor(1) as pool:
            job = pool.submit(loop.run_job).result()
        assert job.state == "failed" and job.error is not None and job.candidate_id is not None

        context = browser.new_context(viewport={"width": 1280, "height": 900})
        tab = DashboardPage(context.new_page(), loop.gateway.url, tmp_path)
        tab.open(f"#/scenarios/{SCENARIO}")
        [shown] = tab.texts("#jobs .job-error")
        assert shown == job.error  # whole and escaped: the item id, the field, "<none>"
        assert REFUSAL in shown and "(holdout)" in shown
        assert "failed" in tab.text("#jobs")

        tab.open(f"#/candidates/{job.candidate_id}")
        panel = tab.text("#decision")
        assert "Not evaluated by the gate yet (state evaluating)" in panel
        assert "failed after 1 attempt:" in tab.text("#job-failure")
        assert tab.texts("#job-failure pre") == [job.error]
        tab.screenshot("candidate-job-failed-at-the-gate")
        assert tab.problems == []
        context.close()
