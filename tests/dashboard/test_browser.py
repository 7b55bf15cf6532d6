"""The dashboard end to end in headless Chromium against a gateway with real data
(releases, a rollback, a rejected candidate, feedback, a running job): every page loads
with the admin key, shows its content, logs no console error, and screenshots as a real
picture. Skips without Chromium (Debian's ``chromium``); CI installs it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.dashboard.browser import DashboardPage
from tests.dashboard.world import ADMIN_KEY, INFERENCE_KEY, SCENARIO, DashboardWorld
from tests.fakes.upstream import FakeUpstreamThread
from tests.gateway.harness import GatewayThread, make_settings
from tests.gateway.rawhttp import call


def test_a_first_visit_asks_for_the_key_once_and_keeps_it_out_of_urls(
    tab: DashboardPage, world: DashboardWorld
) -> None:
    tab.page.goto(f"{world.url}/ui")  # redirects to /ui/
    tab.wait("#/", "auth")
    assert "Admin key needed" in tab.text()
    tab.screenshot("key-prompt")

    tab.sign_in(ADMIN_KEY)
    tab.wait("#/")
    assert SCENARIO in tab.text("#scenarios")
    assert tab.page.evaluate("sessionStorage.getItem('reef.adminKey')") == ADMIN_KEY
    assert ADMIN_KEY not in tab.page.url
    assert tab.page.context.cookies() == []
    # a hash change reuses the key: no second prompt
    tab.page.click(f'a[data-scenario="{SCENARIO}"]')
    tab.wait(f"#/scenarios/{SCENARIO}")
    assert tab.problems == []


def test_every_page_shows_the_real_data(tab: DashboardPage, world: DashboardWorld) -> None:
    assert world.published and world.rejected and world.pending and world.evaluation_id
    tab.open("#/", "auth")
    tab.sign_in(ADMIN_KEY)
    tab.wait("#/")

    # overview: the scenario with its head and live state
    card = tab.text(f'a[data-scenario="{SCENARIO}"]')
    assert "#4" in card and "serving" in card
    tab.screenshot("overview")

    # scenario: the chain as a timeline, the curve, candidates, jobs, recent feedback
    tab.open(f"#/scenarios/{SCENARIO}")
    operations = tab.page.eval_on_selector_all(
        "#timeline > li", "items => items.map(li => li.dataset.operation)"
    )
    assert operations == ["rollback", "learn", "learn", "create"]
    timeline = tab.text("#timeline")
    assert "cli:ops" in timeline and "check the old prompt" in timeline
    assert "components of #2" in timeline and "gate" in timeline
    assert "candidate 1.000 vs baseline 0.400" in timeline
    assert tab.count("#curve circle.series-0") == 4  # live feedback mean of each release
    assert tab.count("#curve circle.series-1") == 2  # the gate's mean when it admitted one
    candidates = tab.text("#candidates")
    for state in ("published", "rejected", "pending"):
        assert state in candidates
    assert "running" in tab.text("#jobs")
    recent = tab.text("#recent")
    assert "wrong answer" in recent and "correction" in recent and "answer-13" in recent
    tab.screenshot("scenario")

    # a published candidate: decision, harness diff, training metrics, item differences
    tab.open(f"#/candidates/{world.published.id}")
    decision = tab.text("#decision")
    assert "passed" in decision and "30 paired items evaluated" in decision
    added = tab.texts("#harness-diff .add")
    assert any("capital 11 => answer-11" in line for line in added)
    assert tab.texts("#harness-diff .del") == []
    assert tab.count('[data-metric="0:sft.loss_curve"] circle') == 6
    # train and validation losses together, and how the run stopped
    assert tab.count('[data-metric="0:sft.convergence"] circle') == 6 + 3
    stopped = tab.text('[data-metric="0:sft.convergence"] .stop-reason')
    assert "stopped: completed after 6 of 6 planned steps" in stopped
    assert "undertrained" in stopped
    assert "0:sft.examples" in tab.text("#training")
    assert tab.count("#items rect.bar.pos") == 12 and tab.count("#items rect.bar.neg") == 0
    # operator evidence only: counted as it is, no author left out
    assert "Every item is at or above trust operator" in tab.text("#evidence")
    assert "recorded no selection stats" in tab.text("#screening")
    tab.screenshot("candidate-published")

    # the rejected candidate: its verdict and reason, what it removed, its losses
    tab.open(f"#/candidates/{world.rejected.id}")
    assert "rejected" in tab.text("h1")
    decision = tab.text("#decision")
    assert world.rejected_reason in decision
    assert "regression:" in decision
    removed = tab.texts("#harness-diff .del")
    assert any("capital 11 => answer-11" in line for line in removed)
    assert tab.count("#items rect.bar.neg") > 0
    assert "answer-9" in tab.text("#changed-items")
    tab.screenshot("candidate-rejected")

    # a pending candidate has no decision yet
    tab.open(f"#/candidates/{world.pending.id}")
    assert "Not evaluated by the gate yet" in tab.text("#decision")

    # an evaluation, item by item
    tab.open(f"#/evaluations/{world.evaluation_id}")
    assert "passed" in tab.text("h1")
    assert tab.count("#items rect.bar") == 30
    assert "Q: capital 3" in tab.text("#changed-items")
    assert "file:quiz" in tab.text("#sources")
    tab.screenshot("evaluation")

    # records with their feedback, then all records (the gate's eval traffic too)
    tab.open(f"#/scenarios/{SCENARIO}/records")
    records = tab.text("#records")
    assert "wrong answer" in records and "right" in records and "#4" in records
    assert tab.count("#records tbody tr") == 25 and tab.count("#older") == 1
    tab.screenshot("records")
    tab.page.select_option("#feedback-filter", "")
    tab.wait(f"#/scenarios/{SCENARIO}/records?feedback=")
    assert "eval" in tab.text("#records")
    # the scenario page's "All records" link opens them all, not only those with feedback
    tab.open(f"#/scenarios/{SCENARIO}")
    tab.page.click("#all-records")
    tab.wait(f"#/scenarios/{SCENARIO}/records?feedback=")
    assert tab.page.input_value("#feedback-filter") == ""
    assert "eval" in tab.text("#records")

    # live status: capture queue, activation, the running job
    tab.open("#/status")
    assert "Queue depth" in tab.text("#capture")
    assert "serving" in tab.text("#activation")
    assert "running" in tab.text("#jobs") and "step 3/6" in tab.text("#jobs")
    tab.screenshot("status")

    assert tab.problems == []


def test_a_key_without_the_admin_role_gets_a_clear_403(
    tab: DashboardPage, world: DashboardWorld
) -> None:
    tab.open("#/", "auth")
    tab.sign_in(INFERENCE_KEY)
    tab.wait("#/", "error")
    message = tab.text()
    assert "may not read the admin API (403)" in message
    assert "is not an admin key" in message
    assert tab.count("#admin-key") == 1  # offered to enter another key
    tab.screenshot("forbidden")
    assert tab.problems and all("status of 403" in problem for problem in tab.problems)

    tab.problems.clear()
    tab.sign_in(ADMIN_KEY)
    tab.wait("#/")
    assert tab.problems == []


def test_a_refused_key_is_forgotten_and_asked_for_again(
    tab: DashboardPage, world: DashboardWorld
) -> None:
    tab.open("#/", "auth")
    tab.sign_in("not-a-key")
    tab.wait("#/", "auth")
    assert "The key was refused: invalid API key" in tab.text()
    assert tab.page.evaluate("sessionStorage.getItem('reef.adminKey')") is None
    assert tab.problems and all("status of 401" in problem for problem in tab.problems)


def test_without_keys_it_opens_at_once_and_shows_empty_states(browser: Any, tmp_path: Path) -> None:
    with (
        FakeUpstreamThread() as fake,
        GatewayThread(make_settings(tmp_path, fake.base_url)) as gateway,
    ):
        context = browser.new_context(viewport={"width": 1280, "height": 900})
        tab = DashboardPage(context.new_page(), gateway.url, tmp_path)
        tab.open("#/")  # no key asked for: the gateway has none configured
        assert "support" in tab.text("#scenarios")
        tab.open("#/scenarios/support")
        page = tab.text()
        assert "No candidates yet" in page
        assert "No learning jobs yet" in page
        assert "No feedback yet" in page
        assert "No scores yet" in tab.text()
        assert "Nothing quarantined" in tab.text("#quarantine")
        tab.screenshot("empty-scenario")
        tab.open("#/scenarios/support/feedback")
        assert "Nothing is quarantined in this scenario" in tab.text("#quarantine")
        tab.open("#/candidates/no-such-candidate", "error")
        assert "Could not load this page (HTTP 404)" in tab.text()
        assert all("status of 404" in problem for problem in tab.problems)
        context.close()


def gateway_scenarios(gateway: GatewayThread) -> list[dict[str, Any]]:
    listed: list[dict[str, Any]] = call(gateway.port, "GET", "/reef/scenarios").json()["data"]
    return listed


def test_a_scenario_created_by_a_stray_name_is_folded_away(browser: Any, tmp_path: Path) -> None:
    with (
        FakeUpstreamThread() as fake,
        GatewayThread(make_settings(tmp_path, fake.base_url)) as gateway,
    ):
        for model in ("reef/suport", "reef/support", "fake-model"):  # a typo, a name, none
            gateway.openai().chat.completions.create(
                model=model, messages=[{"role": "user", "content": "hi"}]
            )
        context = browser.new_context(viewport={"width": 1280, "height": 900})
        tab = DashboardPage(context.new_page(), gateway.url, tmp_path)
        tab.open("#/")
        shown = tab.texts("#scenarios > .card h2")
        assert "support" in shown and "default" in shown and "suport" not in shown
        assert tab.count("#unconfigured[open]") == 0
        assert "1 scenario not in the configuration" in tab.text("#unconfigured summary")
        assert tab.texts("#unconfigured .card h2") == ["suport"]

        # Recorded, it holds experience: the dashboard says why it stays.
        tab.page.click("#unconfigured summary")
        tab.page.click('button[data-delete="suport"]')
        tab.page.click('button[data-delete="suport"]')  # the confirmation
        tab.page.wait_for_selector('[data-stray="suport"] [role="status"]:has-text("Not deleted")')
        assert "holds 1 record" in tab.text('[data-stray="suport"] [role="status"]')

        # Served with capture off, it holds nothing: deleted, and gone from the page.
        gateway.openai(**{"x-reef-capture": "off"}).chat.completions.create(
            model="reef/typo", messages=[{"role": "user", "content": "hi"}]
        )
        tab.page.reload()
        tab.wait("#/")
        tab.page.click("#unconfigured summary")
        tab.page.click('button[data-delete="typo"]')
        tab.page.click('button[data-delete="typo"]')
        tab.page.wait_for_selector('[data-stray="typo"]', state="detached")
        tab.wait("#/")
        assert tab.texts("#unconfigured .card h2") == ["suport"]
        assert "typo" not in [s["name"] for s in gateway_scenarios(gateway)]
        assert all("status of 409" in problem for problem in tab.problems), tab.problems
        context.close()
