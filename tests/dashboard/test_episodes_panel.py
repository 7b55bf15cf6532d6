"""The evaluation page's Episodes panel in headless Chromium: the real gate plays paired
episodes of the orders environment through a real gateway (the shop of
tests/e2e/test_gated_episodes.py: a candidate that handles every return against a head
that handles two), stores them, and the page shows every task's both sides (score, stop,
turns, tool calls, reason), both conversations side by side when opened, and a link to
each episode's recorded trajectory."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from tests.dashboard.browser import DashboardPage
from tests.e2e.test_gated_episodes import ITEMS, SCENARIO, shop


def test_the_episodes_panel_shows_both_sides_and_opens_their_conversations(
    browser: Any, tmp_path: Path
) -> None:
    with shop(tmp_path) as world:
        world.publish_directly(ITEMS[:2])  # the head handles the kettle and the toaster
        candidate = world.propose(ITEMS)
        # the gate runs its own event loop: not in this thread, where Playwright holds one
        with ThreadPoolExecutor(1) as pool:
            outcome = pool.submit(world.gate().run, candidate.id).result()
        assert outcome.action == "published", outcome
        evaluation_id = outcome.evaluation_id
        assert evaluation_id is not None
        stored = world.evaluations.episodes(evaluation_id)
        assert len(stored) == len(ITEMS) * 2 * 2  # tasks x repeats x sides

        context = browser.new_context(viewport={"width": 1280, "height": 900})
        tab = DashboardPage(context.new_page(), world.gateway.url, tmp_path)
        tab.open(f"#/evaluations/{evaluation_id}")  # no keys configured: no prompt
        assert "python environment, 6 tasks, 2 repeats per side" in tab.text("#episodes")
        headers = tab.texts("#episodes > table > thead th")
        assert headers[:4] == ["Task", "Repeat", "Candidate", "Baseline"]

        # one row per task and repeat, in the store's order
        rows = tab.page.locator("#episodes > table > tbody > tr")
        assert rows.count() == len(ITEMS) * 2
        cells = [
            [str(cell) for cell in rows.nth(n).locator(":scope > td").all_inner_texts()]
            for n in range(rows.count())
        ]
        tasks = [(row[0], row[1]) for row in cells]
        assert tasks == sorted((f"return-{item}", str(r)) for item in ITEMS for r in range(2))
        by_task = {(row[0], row[1]): row for row in cells}

        # a task both sides finish: score, stop, turns, tool calls, reason on each
        _, _, mine, theirs, _ = by_task[("return-kettle", "0")]
        for side in (mine, theirs):
            assert "1.00" in side and "finished" in side
            assert "3 turns, 2 tool calls" in side
            assert "every expected check holds" in side
            assert "trajectory" in side
        # a task only the candidate finishes: the head declined at once
        _, _, mine, theirs, _ = by_task[("return-radio", "1")]
        assert "1.00" in mine and "3 turns, 2 tool calls" in mine
        assert "0.00" in theirs and "1 turn, 0 tool calls" in theirs
        assert "no return was opened for B5" in theirs
        # rows where the candidate did better are marked; none did worse
        better = tab.page.locator("#episodes > table > tbody > tr.better")
        assert better.count() == 4 * 2  # blender, lamp, fan, radio; both repeats
        assert tab.count("#episodes > table > tbody > tr.worse") == 0
        tab.screenshot("evaluation-episodes")

        # opening a task's conversations loads both sides of that repeat
        radio = rows.nth(tasks.index(("return-radio", "1")))
        radio.locator("summary").click()
        side_by_side = radio.locator("table.side-by-side")
        side_by_side.wait_for()
        assert side_by_side.locator("thead th").all_text_contents() == ["candidate", "baseline"]
        candidate_side, baseline_side = side_by_side.locator("td.conversation").all()
        said = candidate_side.inner_text()
        assert "lookup_order" in said and '"order_id":"B5"' in said
        assert "open_return" in said and "Your return R-B5 is open." in said
        assert candidate_side.locator(".said.role-tool").count() == 2  # both tool results
        heard = baseline_side.inner_text()
        assert "Sorry, I cannot help with that." in heard and "lookup_order" not in heard
        assert "My radio from order B5 is broken" in heard  # the task's prompt, both sides
        tab.screenshot("evaluation-episode-conversations")

        # each side links to its recorded session: the trajectory of its own release
        sessions = {
            e.arm: e.session_id for e in stored if (e.task_id, e.repeat) == ("return-radio", 1)
        }
        assert None not in sessions.values() and len(set(sessions.values())) == 2
        links = {
            arm: radio.locator(":scope > td").nth(column).locator("a.session-link")
            for arm, column in (("candidate", 2), ("baseline", 3))
        }
        for arm, link in links.items():
            assert link.get_attribute("href") == f"#/scenarios/{SCENARIO}/sessions/{sessions[arm]}"
        links["candidate"].click()
        tab.wait(f"#/scenarios/{SCENARIO}/sessions/{sessions['candidate']}")
        summary = tab.text("#summary")
        assert "3 turns" in summary and "2 tool calls" in summary
        turns = tab.text("#trajectory")
        assert "lookup_order" in turns and "open_return" in turns
        assert "R-B5" in turns
        tab.screenshot("evaluation-episode-trajectory")

        assert tab.problems == []
        context.close()
