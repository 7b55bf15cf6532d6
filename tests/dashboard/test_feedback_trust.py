"""Feedback trust on the dashboard, in headless Chromium against the populated gateway
(world.py): the candidate the independence rule rejected shows where the gate's evidence
came from (each source by trust and author, each leave-one-author-out check) and its
learning job's screening counts; the quarantine view lists the crowd key's held feedback
newest first and paged, shows markup in a correction as text, and Release lets a row out
(through the admin route, with the admin key)."""

from __future__ import annotations

from reef.experience import FeedbackDraft, RecordFilter
from tests.dashboard.browser import DashboardPage
from tests.dashboard.world import (
    ADMIN_KEY,
    PLANTED,
    POISON,
    POISONED,
    SCENARIO,
    DashboardWorld,
)
from tests.gateway import rawhttp

FEEDBACK_PAGE = f"#/scenarios/{SCENARIO}/feedback"


def _signed_in(tab: DashboardPage) -> None:
    tab.open("#/", "auth")
    tab.sign_in(ADMIN_KEY)
    tab.wait("#/")


def _cells(tab: DashboardPage, rows: str) -> list[list[str]]:
    found = tab.page.eval_on_selector_all(
        rows, "rows => rows.map(r => [...r.cells].map(c => c.textContent))"
    )
    return [[str(cell) for cell in row] for row in found]


def _listed(tab: DashboardPage) -> list[str]:
    """The feedback ids of the quarantine table, in page order."""
    found = tab.page.eval_on_selector_all(
        "#quarantine [data-release]", "buttons => buttons.map(b => b.dataset.release)"
    )
    return [str(feedback_id) for feedback_id in found]


def _held(world: DashboardWorld) -> list[str]:
    body = world.admin(f"/reef/scenarios/{SCENARIO}/feedback?quarantined=true&limit=500")
    return [row["id"] for row in body["data"]]


def test_the_rejected_candidate_shows_its_evidence_rule_and_screening_counts(
    tab: DashboardPage, world: DashboardWorld
) -> None:
    assert world.untrusted is not None
    _signed_in(tab)
    tab.open(f"#/candidates/{world.untrusted.id}")
    assert "rejected" in tab.text("h1")
    decision = tab.text("#decision")
    assert "not independent: without the 14 items of author 'app'" in decision
    assert "evidence_min_trust operator" in decision  # the rule's thresholds

    evidence = tab.text("#evidence")
    assert "Minimum trust" in evidence and "operator" in evidence
    assert tab.text("#items-below") == "18"
    basics, holdout = _cells(tab, "#sources tbody tr")
    assert basics[:3] == ["file:basics", "file", "12"]
    assert basics[3:] == ["operator 12", "the operator's file"]
    assert holdout[:3] == ["holdout", "holdout", "18"]
    assert holdout[3] == "untrusted 4user 14" and holdout[4] == "app 14anonymous 4"
    app, anonymous = _cells(tab, "#leave-one-out tbody tr")
    assert app[:4] == ["app", "14", "undecided", "16"]
    assert app[4].startswith("0.000") and "does not lie above zero yet" in app[5]
    assert anonymous[:4] == ["anonymous", "4", "passed", "26"]
    assert anonymous[4].startswith("+0.538")
    classes = tab.page.eval_on_selector_all(
        "#leave-one-out tbody tr", "rows => rows.map(r => r.className)"
    )
    assert classes == ["loss", "gain"]

    # the learning job's screening: every rule with its count, what was quarantined
    selection = world.admin(f"/reef/candidates/{world.untrusted.id}")["evidence"]["selection"]
    shown = {
        str(key): tab.text(f'#screening [data-count="{key}"]')
        for key in tab.page.eval_on_selector_all(
            "#screening [data-count]", "nodes => nodes.map(n => n.dataset.count)"
        )
    }
    assert shown == {
        "quarantined_new": "10",
        "quarantined_held": "0",
        "screened:repeated_correction": "10",
        "screened:contradicts_suite": "10",
        "screened:burst": "0",
        "screened:planted_instruction": "5",  # every other poisoned row
    }
    assert all(int(shown[key]) == selection.get(key, 0) for key in shown)
    tab.screenshot("candidate-untrusted")

    tab.page.click("#screening #quarantine-link")
    tab.wait(FEEDBACK_PAGE)
    assert len(_listed(tab)) >= 1
    assert tab.problems == []


def test_quarantined_feedback_is_listed_as_text_newest_first_and_paged(
    tab: DashboardPage, world: DashboardWorld
) -> None:
    dialogs: list[str] = []
    tab.page.on("dialog", lambda dialog: (dialogs.append(dialog.message), dialog.dismiss()))
    _signed_in(tab)
    held = _held(world)
    assert set(held) <= set(world.quarantined) and len(held) >= len(POISONED) - 1

    # the scenario page shows the newest few, linking to the whole list
    tab.open(f"#/scenarios/{SCENARIO}")
    assert _listed(tab) == held[:5]
    assert "newest 5 shown" in tab.text("#quarantine-link")

    tab.open(FEEDBACK_PAGE)
    assert "No computed feedback yet" in tab.text("#calibration")  # nothing computed here
    assert _listed(tab) == held  # newest first: ids are UUIDv7
    rows = _cells(tab, "#quarantine tbody tr")
    assert {row[1] for row in rows} == {"crowduntrusted"}  # author, trust
    said = {row[3] for row in rows}  # the markup, as text
    assert said == {f"wrongcorrection: {POISON}", f"{PLANTED}correction: {POISON}"}
    assert tab.count("#quarantine img") == 0 and tab.count("#view img") == 0
    assert all("repeated_correction" in row[4] for row in rows)
    rules = set(tab.texts("#quarantine code.rule"))
    assert {"repeated_correction", "contradicts_suite", "planted_instruction"} <= rules
    tab.screenshot("quarantine")

    # paging: limit and before stay in the address
    tab.open(f"{FEEDBACK_PAGE}?limit=4")
    assert _listed(tab) == held[:4]
    tab.page.click("#older")
    tab.wait(f"{FEEDBACK_PAGE}?limit=4&before={held[3]}")
    assert _listed(tab) == held[4:8]
    tab.page.click("#newest")
    tab.wait(f"{FEEDBACK_PAGE}?limit=4")
    assert _listed(tab) == held[:4]

    # the records page flags the same rows
    tab.open(f"#/scenarios/{SCENARIO}/records?feedback=true")
    flagged = tab.texts("#records .held")
    older = str(tab.page.get_attribute("#older", "href"))
    tab.page.click("#older")  # the crowd's rows are older than most of the app's
    tab.wait(older)
    flagged += tab.texts("#records .held")
    assert flagged == ["quarantined"] * len(held)
    assert dialogs == [] and tab.problems == []


def test_release_takes_a_row_out_of_quarantine(tab: DashboardPage, world: DashboardWorld) -> None:
    _signed_in(tab)
    tab.open(FEEDBACK_PAGE)
    listed = _listed(tab)
    released, kept = listed[0], listed[1]

    # the first click asks again; Cancel leaves the row as it was
    button = f'#quarantine [data-release="{kept}"]'
    tab.page.click(button)
    assert tab.text(button) == "Confirm release"
    tab.page.click(f"{button} + button")  # Cancel
    assert tab.text(button) == "Release"
    assert kept in _held(world)

    button = f'#quarantine [data-release="{released}"]'
    tab.page.click(button)
    tab.page.click(button)
    tab.page.wait_for_selector(button, state="detached")  # the page read the list again
    assert _listed(tab) == listed[1:]
    assert released not in _held(world)
    rows = world.admin(f"/reef/scenarios/{SCENARIO}/feedback?quarantined=false&limit=500")
    row = next(row for row in rows["data"] if row["id"] == released)
    assert row["released_by"] == "ops" and row["released_at"] is not None
    assert row["quarantine_reason"]  # the reason stays for the record
    assert tab.problems == []


def test_a_row_released_elsewhere_meanwhile_just_leaves_the_list(
    tab: DashboardPage, world: DashboardWorld
) -> None:
    _signed_in(tab)
    tab.open(FEEDBACK_PAGE)
    target = _listed(tab)[-1]
    elsewhere = _release(world, target)
    assert elsewhere.status == 200, elsewhere.body

    button = f'#quarantine [data-release="{target}"]'
    tab.page.click(button)
    tab.page.click(button)  # 409: not quarantined any more
    tab.page.wait_for_selector(button, state="detached")
    assert target not in _listed(tab)
    assert tab.problems and all("status of 409" in problem for problem in tab.problems)


def _release(world: DashboardWorld, feedback_id: str) -> rawhttp.RawResponse:
    return rawhttp.call(
        world.gateway.port,
        "POST",
        f"/reef/feedback/{feedback_id}/release",
        headers={"authorization": f"Bearer {ADMIN_KEY}"},
    )


def test_the_feedback_page_samples_complaints_without_a_value(
    tab: DashboardPage, world: DashboardWorld
) -> None:
    # Last in this file: the rows it adds would fill the computed-feedback table above.
    # Unscored, so the learning curve other pages chart does not move.
    store = world.gateway.store
    (newest,) = store.list_records(SCENARIO, RecordFilter(), None, 1).records
    vague = "No, my order number is <b>A-17</b>"
    for said, correction in [(vague, None), ("No, it's A-18, not A-81.", "A-18")]:
        store.add_feedback(
            FeedbackDraft(
                scenario=SCENARIO, record_ids=(newest.id,), score=None, feedback=said,
                correction=correction, metadata={}, principal="app/ana", idempotency_key=None,
                trust="user", source="signal:correction", confidence=0.7,
            )
        )  # fmt: skip
    listed = world.admin(f"/reef/scenarios/{SCENARIO}/feedback?limit=500")["data"]
    _signed_in(tab)
    tab.open(FEEDBACK_PAGE)
    assert f"1 of the newest {len(listed)} feedback rows" in tab.text("#complaints")
    [row] = _cells(tab, "#complaints tbody tr")
    assert row[2:] == ["app/ana", vague]  # author; the markup as text
    assert row[1] and row[1] in newest.id  # the short form of the id
    assert tab.count("#complaints b") == 0
