"""Shadow evidence decides an undecided candidate, on the tiny engine: corrections train
an adapter whose learning job's gate is ``undecided`` on its 10 held-out items (fewer
than ``min_items``); live traffic of the scenario is then also asked of the candidate in
the background (``gate.shadow``), a few live answers get a correction (pairs scored by
the scenario's scorer: provenance ``live``), the rest are judged blind by a pairwise judge
on loopback (``judged``); the worker's next pass, with no new job, decides again and
publishes it. The candidate's page in the dashboard then shows both suites, the shadow
one with its provenance."""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from reef.config import EvaluationConfig
from reef.evaluation import EvaluationStore
from reef.evaluation.shadow import SHADOW_OF_TAG
from reef.experience import RecordFilter
from reef.gateway.shadow import ShadowArm
from reef.jobs import JobQueue
from reef.learning.selection import in_holdout
from reef.learning.worker import Worker
from reef.releases import ReleaseChain, open_artifact_store
from tests.dashboard.browser import DashboardPage, chromium_path
from tests.e2e.tiny import tiny_gateway
from tests.engine.lora_factory import PEFT_WRAP_WARNING
from tests.fakes.shadow import PairwiseJudgeThread
from tests.gateway.harness import GatewayThread
from tests.gateway.rawhttp import call
from tests.polling import eventually

pytestmark = pytest.mark.filterwarnings(PEFT_WRAP_WARNING)

RIGHT = "Squid-7"
HOLDOUT_FRACTION = 0.5
HELD, TRAIN = 10, 24  # round 1: held-out items (undecided: < min_items) and training rows
LIVE, JUDGED = 4, 8  # round 2: shadow pairs with a correction, and (at least) judged ones
RECIPE = f"""\
schema_version: 1
trigger: {{type: manual}}
selection: {{holdout_fraction: {HOLDOUT_FRACTION}}}
learners:
  - type: sft
    model: tiny-random
    target_modules: [q_proj, v_proj, lm_head]
    lr: 0.01
    steps: 120
    threads: 1
    batch_size: 8
    seed: 0
gate:
  scorer: {{type: contains}}
  min_items: 20
  max_tokens: 8
  concurrency: 4
  evidence_sources: {{explicit: 1, "judge:shadow": 1}}
  shadow:
    fraction: 1.0
    max_requests: 40
    max_tokens: 8
    judge: {{upstream: judge, model: judge-1, position_check: 0.5, seed: 0}}
publish: auto
"""


def _ask(gateway: GatewayThread, question: int) -> str:
    """One live request (purpose ``serve``); its record id."""
    client = gateway.openai(**{"x-reef-scenario": "codes"})
    raw = client.chat.completions.with_raw_response.create(
        model="reef/codes",
        messages=[{"role": "user", "content": f"which code for case {question}?"}],
        max_tokens=8,
    )
    return str(raw.headers["x-reef-record-id"])


def _correct(gateway: GatewayThread, record_id: str) -> None:
    body = {"record_ids": [record_id], "score": 0.0, "correction": RIGHT}
    assert call(gateway.port, "POST", "/reef/feedback", body).status == 201


def _round_one(gateway: GatewayThread) -> list[str]:
    """Corrected traffic until exactly ``HELD`` held-out and ``TRAIN`` training records
    have feedback (record ids are random: which side a record falls on is not); the
    held-out record ids."""
    held: list[str] = []
    train = 0
    question = 0
    while len(held) < HELD or train < TRAIN:
        record_id = _ask(gateway, question)
        question += 1
        if in_holdout(record_id, HOLDOUT_FRACTION):
            if len(held) < HELD:
                held.append(record_id)
                _correct(gateway, record_id)
        elif train < TRAIN:
            train += 1
            _correct(gateway, record_id)
    return held


def _shadow_of(gateway: GatewayThread, record_id: str) -> str | None:
    """The release of the shadow record of the live record ``record_id``, once the
    gateway wrote it."""

    def found() -> list[str | None] | None:
        page = gateway.store.list_records("codes", RecordFilter(purpose="shadow"), None, 200)
        shadows = [r.release_id for r in page.records if r.tags.get(SHADOW_OF_TAG) == record_id]
        return shadows or None

    [release_id] = eventually(found, f"the shadow record of {record_id}")
    return release_id


def _round_two(gateway: GatewayThread, candidate_id: str) -> tuple[set[str], set[str]]:
    """Live traffic, each request's shadow awaited before the next, until ``LIVE`` of
    them are corrected (training-side records only, so the held-out items stay 10 and
    only shadow evidence grows) and at least ``JUDGED`` are left to the judge; both sets
    of live record ids."""
    live: set[str] = set()
    judged: set[str] = set()
    question = 100  # cases neither round 1 nor training saw
    while len(live) < LIVE or len(judged) < JUDGED:
        record_id = _ask(gateway, question)
        question += 1
        assert _shadow_of(gateway, record_id) == candidate_id  # asked of the candidate
        if len(live) < LIVE and not in_holdout(record_id, HOLDOUT_FRACTION):
            _correct(gateway, record_id)
            live.add(record_id)
        else:
            judged.add(record_id)
    return live, judged


@dataclass(frozen=True)
class ShadowLoop:
    """What the loop left: the running gateway, the judge, the job of round 1, the
    candidate and the live records of round 2 (``live``: corrected, ``judged``)."""

    gateway: GatewayThread
    judge: PairwiseJudgeThread
    job_id: str
    base_id: str
    candidate_id: str
    live: set[str]
    judged: set[str]
    tmp: Path


@pytest.fixture(scope="module")
def loop(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ShadowLoop]:
    """Round 1 (a learning job, undecided), round 2 (shadowed live traffic) and the
    worker's next pass. The gateway reads the evaluating candidate on every live request,
    not at most every 5 s: round 1's read (no candidate yet) would otherwise hide it."""
    tmp = tmp_path_factory.mktemp("shadow-loop")
    (tmp / "recipe.yaml").write_text(RECIPE)
    scenarios = {"codes": {"upstream": "engine", "recipe": tmp / "recipe.yaml"}}
    with (
        pytest.MonkeyPatch.context() as patch,
        PairwiseJudgeThread("content", good=RIGHT) as judge,
        tiny_gateway(
            tmp,
            scenarios=scenarios,
            upstreams={"judge": {"type": "openai", "base_url": judge.base_url, "model": "judge-1"}},
        ) as gateway,
    ):
        patch.setattr(ShadowArm, "refresh_seconds", 0.0)
        settings = gateway.settings
        chain = ReleaseChain(gateway.database)
        gate_settings = settings.model_copy(
            update={"evaluation": EvaluationConfig(gateway_url=gateway.url)}
        )
        worker = Worker(
            gate_settings,
            gateway.store,
            chain,
            open_artifact_store(settings.artifacts_url()),
            queue=JobQueue(gateway.database),
            evaluations=EvaluationStore(gateway.database),
        )
        base = chain.head("codes")
        assert base is not None

        # Round 1: a learning job trains an adapter; its gate has 10 held-out items.
        _round_one(gateway)
        assert call(gateway.port, "POST", "/reef/scenarios/codes/learn", {}).status == 202
        [job] = worker.run_once()
        assert job.state == "succeeded", job.as_dict()
        assert job.result is not None
        outcome = job.result["gate"]
        assert outcome["action"] == "undecided", outcome
        assert outcome["missing"]
        candidate_id = outcome["candidate_id"]
        waiting = chain.get_candidate(candidate_id)
        assert waiting.state == "evaluating"
        [first] = (waiting.evidence or {})["gate"]["history"]
        assert first["suites"] == {"holdout": HELD}
        assert first["shadow"] == {"pairs": 0, "references": 0}
        assert worker.resume_undecided()[0].reason is None  # nothing new yet

        # Round 2: live traffic, shadowed; a few corrections, the rest judged.
        live, judged = _round_two(gateway, candidate_id)
        assert not judge.prompts  # judging waits for the gate's look

        # The worker's next pass decides again, with no new job.
        assert worker.run_once() == []
        yield ShadowLoop(gateway, judge, job.id, base.id, candidate_id, live, judged, tmp)


def test_shadow_evidence_publishes_an_undecided_candidate(loop: ShadowLoop) -> None:
    gateway, candidate_id = loop.gateway, loop.candidate_id
    chain = ReleaseChain(gateway.database)
    last = JobQueue(gateway.database).last_job("codes")
    assert last is not None and last.id == loop.job_id  # no new job
    published = chain.get_candidate(candidate_id)
    assert published.state == "published", (published.evidence or {})["gate"]["decision"]
    head = chain.head("codes")
    assert head is not None and head.parent_id == loop.base_id
    assert head.manifest.model.adapter == published.manifest.model.adapter
    assert head.manifest.model.adapter is not None

    # What the dashboard reads: GET /reef/candidates/{id}.
    response = call(gateway.port, "GET", f"/reef/candidates/{candidate_id}")
    assert response.status == 200
    gate = response.json()["evidence"]["gate"]
    history = gate["history"]
    pairs = len(loop.live) + len(loop.judged)
    assert [look["verdict"] for look in history] == ["undecided", "passed"]
    assert history[1]["suites"] == {"holdout": HELD, "shadow": pairs}
    assert history[1]["shadow"] == {"pairs": pairs, "references": LIVE}
    decision = gate["decision"]
    suites = {s["suite"]: s for s in decision["suites"]}
    assert set(suites) == {"holdout", "shadow"}
    assert suites["holdout"]["items"] == HELD
    assert suites["shadow"]["items"] == pairs
    for suite in suites.values():  # the adapter says the code, the head does not
        assert suite["candidate_mean"] > suite["baseline_mean"], suite
    shadow = decision["evidence"]["shadow"]
    assert (shadow["pairs"], shadow["live"], shadow["judged"]) == (pairs, LIVE, len(loop.judged))
    assert shadow["void"] == 0 and shadow["unscored"] == 0
    summaries = shadow["summaries"]
    assert (summaries["live"]["items"], summaries["judged"]["items"]) == (LIVE, len(loop.judged))
    assert summaries["judged"]["difference"]["mean"] > 0

    # Each pair's provenance, and the judge's position check, in the stored results.
    evaluation = call(
        gateway.port, "GET", f"/reef/evaluations/{history[1]['evaluation_id']}?items=1"
    ).json()
    rows = [r for r in evaluation["results"] if r["suite"] == "shadow" and r["arm"] == "candidate"]
    assert {r["item"]: r["details"]["provenance"] for r in rows} == {
        **{f"shadow/{rid}": "live" for rid in loop.live},
        **{f"shadow/{rid}": "judged" for rid in loop.judged},
    }
    checked = [r for r in rows if "position_flipped" in r["details"]]
    assert shadow["judge"]["checked"] == len(checked) and shadow["judge"]["flips"] == 0
    assert shadow["judge"]["flagged"] is False
    assert len(loop.judge.prompts) == len(loop.judged) + len(checked)  # each asked once
    for prompt in loop.judge.prompts:  # blind: no arm named
        assert candidate_id not in prompt and "candidate" not in prompt.lower()


def test_the_candidate_page_shows_both_suites_and_the_provenance(loop: ShadowLoop) -> None:
    executable = chromium_path()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=executable)
        try:
            context = browser.new_context(viewport={"width": 1280, "height": 900})
            tab = DashboardPage(context.new_page(), loop.gateway.url, loop.tmp / "shots")
            tab.open(f"#/candidates/{loop.candidate_id}")
            decided, panel = tab.text("#decision"), tab.text("#shadow")
            suites = tab.texts("#decision table:first-of-type tbody tr td:first-child")
            looks = tab.texts("#decision table:nth-of-type(2) tbody tr td:nth-child(2)")
            assert tab.problems == []
        finally:
            browser.close()
    assert "passed" in decided
    assert suites == ["overall", "holdout", "shadow"]
    assert "undecided" in looks and "passed" in looks  # the evidence over time
    lines = panel.splitlines()
    assert any(line.startswith("live") and f"\t{LIVE}\t" in line for line in lines), panel
    judged = f"\t{len(loop.judged)}\t"
    assert any(line.startswith("judged") and judged in line for line in lines), panel
    assert "judge-1" in panel
