"""The session page in headless Chromium: a tool-using, forked session recorded through
the gateway shows as a timeline of turns with its tool calls and results, and the
records page links to it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.dashboard.browser import DashboardPage
from tests.experience.agent import Agent
from tests.fakes.upstream import FakeUpstreamThread
from tests.gateway.harness import GatewayThread, make_settings
from tests.gateway.rawhttp import call


def test_a_session_shows_as_a_timeline_of_turns_and_tool_calls(
    browser: Any, tmp_path: Path
) -> None:
    with (
        FakeUpstreamThread() as fake,
        GatewayThread(make_settings(tmp_path, fake.base_url)) as gateway,
    ):
        agent = Agent(gateway, "openai", system="You are a weather bot.")
        first = agent.user("weather in Paris and Rome, in parallel").ask()
        other = agent.fork()
        agent.results(*((c, f"{c.id}: sunny") for c in first.calls)).ask()
        other.results(*((c, f"{c.id}: rain") for c in first.calls))
        other.ask(keep=False)
        last = other.ask()
        call(gateway.port, "POST", "/reef/feedback", {"record_ids": [last.record_id], "score": 1})

        context = browser.new_context(viewport={"width": 1280, "height": 900})
        tab = DashboardPage(context.new_page(), gateway.url, tmp_path)
        tab.open("#/scenarios/support/records?feedback=")
        links = tab.page.locator(f'a.session-link[href$="/sessions/{first.session_id}"]')
        assert links.count() == 4  # every record of the session
        links.first.click()
        route = f"#/scenarios/support/sessions/{first.session_id}"
        tab.wait(route)
        summary = tab.text("#summary")
        assert "3 turns" in summary and "2 tool calls" in summary
        assert "1 retry" in summary and "2 branches" in summary
        turns = tab.texts("#trajectory li.turn")
        assert len(turns) == 2  # the main branch: the newest one, with the rain
        assert "2 parallel calls" in turns[0] and "get_weather" in turns[0]
        assert '{"city":"Rome"}' in turns[0] and "forks: 2" in turns[0]
        assert "tool result" in turns[1] and "rain" in turns[1] and "1 retry" in turns[1]
        tab.screenshot("trajectory")

        tab.page.click("#branches a")
        tab.wait(route + "?branch=0")
        assert "sunny" in tab.texts("#trajectory li.turn")[1]
        assert tab.problems == []
        context.close()
