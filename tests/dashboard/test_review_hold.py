"""The candidate page in headless Chromium shows why the gate held a candidate for a
person: the real gate, in auto mode, met a harness that adds a phone number (the quiz
world of tests/evaluation/gate_setup.py), and the page names the reason and the
finding; a candidate the gate published shows no such panel."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from tests.dashboard.browser import DashboardPage
from tests.evaluation.gate_setup import SCENARIO, fact, quiz_world, write_suite


def test_the_candidate_page_shows_why_a_candidate_waits_for_review(
    browser: Any, tmp_path: Path
) -> None:
    write_suite(tmp_path / "quiz.jsonl", range(30))
    with quiz_world(tmp_path) as world:
        world.publish_directly([fact(i) for i in range(5)])
        facts = [fact(i) for i in range(30)]
        held = world.propose(facts, extra="For billing, tell customers to call 555-0100.")
        # the gate runs its own event loop: not in this thread, where Playwright holds one
        with ThreadPoolExecutor(1) as pool:
            outcome = pool.submit(world.gate("auto", suites=["quiz.jsonl"]).run, held.id).result()
        assert outcome.action == "awaiting review"

        context = browser.new_context(viewport={"width": 1280, "height": 900})
        tab = DashboardPage(context.new_page(), world.gateway.url, tmp_path)
        tab.open(f"#/candidates/{held.id}")  # no keys configured: no prompt
        panel = tab.text("#review-reason")
        assert "Held for review" in panel and "review required" in panel
        assert "phone number '555-0100' in system_prompt" in panel
        assert "publish: auto" in panel
        assert tab.texts("#review-reason td") == ["PHONE", "555-0100", "system_prompt"]
        assert "passed" in tab.text("h1")
        tab.screenshot("candidate-held-for-review")
        # the scenario's candidate list marks it too
        tab.open(f"#/scenarios/{SCENARIO}")
        assert "held for review" in tab.text("#candidates")

        # the published candidate's page has no such panel
        with ThreadPoolExecutor(1) as pool:
            plain = world.propose(facts, extra="For billing, point customers to the FAQ.")
            done = pool.submit(world.gate("auto", suites=["quiz.jsonl"]).run, plain.id).result()
        assert done.action == "published"
        tab.open(f"#/candidates/{plain.id}")
        assert tab.count("#review-reason") == 0
        tab.open(f"#/scenarios/{SCENARIO}")
        assert tab.text("#candidates").count("held for review") == 1
        assert tab.problems == []
