"""Computed feedback: conversation signals written as feedback rows (source, confidence,
author) as records arrive, weighed by selection, kept out of the gate's evidence unless a
recipe lets them in, and counted by the worker's triggers. Real sessions through the
gateway (OpenAI SDK, keyed), on SQLite and PostgreSQL (REEF_TEST_POSTGRES_URL)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from reef.cli.main import app
from reef.core import InvalidInputError
from reef.evaluation import EvaluationStore
from reef.experience import FeedbackDraft, FeedbackView, SQLExperienceStore, calibrate
from reef.jobs import JobQueue
from reef.learning.computed import SignalWriter
from reef.learning.holdout import dropped_sentence, evidence_notes, holdout_items, select_holdout
from reef.learning.learners.preference import unpaired_examples
from reef.learning.recipes import parse_recipe
from reef.learning.selection import SelectionConfig, select_experience
from reef.learning.signals import SignalsConfig
from reef.learning.worker import Worker
from reef.releases import ReleaseChain, open_artifact_store
from tests.experience.agent import Agent, Sent
from tests.experience.conftest import pg_databases, pg_url, store_url  # noqa: F401 - fixtures
from tests.fakes.upstream import FakeUpstreamThread
from tests.gateway.harness import GatewayThread, make_settings

KEYS = {
    "keys": [
        {"id": "ana", "key": "sk-ana", "role": "inference", "trust": "user"},
        {"id": "ops", "key": "sk-ops", "role": "admin"},
    ]
}
ON = SignalsConfig()  # the default rules, on


@pytest.fixture(scope="module")
def fake() -> Iterator[FakeUpstreamThread]:
    with FakeUpstreamThread() as server:
        yield server


@pytest.fixture
def gateway(
    store_url: str,  # noqa: F811 - fixture
    tmp_path: Path,
    fake: FakeUpstreamThread,
) -> Iterator[GatewayThread]:
    settings = make_settings(tmp_path, fake.base_url, store={"url": store_url}, auth=KEYS)
    with GatewayThread(settings) as gw:
        yield gw


def writer(gateway: GatewayThread) -> SignalWriter:
    return SignalWriter(gateway.store, gateway.settings.trust_of)


def said(gateway: GatewayThread, *texts: str) -> list[Sent]:
    agent = Agent(gateway, "openai", key="sk-ana")
    return [agent.user(text).ask(tools=False) for text in texts]


def computed(gateway: GatewayThread, record_id: str) -> list[FeedbackView]:
    return [fb for fb in gateway.store.get_record(record_id).feedback if fb.source != "explicit"]


def batch(gateway: GatewayThread, **selection: Any) -> Any:
    config = SelectionConfig(holdout_fraction=0, max_per_principal=None, **selection)
    store: SQLExperienceStore = gateway.store
    return select_experience(store, ReleaseChain(gateway.database), "support", config)


def test_signals_become_feedback_once_with_source_confidence_and_author(
    gateway: GatewayThread,
) -> None:
    asked, corrected = said(gateway, "which team owns widgets?", "No, it's T-OPS, not T-POP.")
    first = writer(gateway)
    done = first.run("support", ON)
    assert (done.sessions, done.written, done.by_signal) == (1, 1, {"correction": 1})
    (row,) = computed(gateway, asked.record_id)
    assert (row.source, row.confidence, row.score) == ("signal:correction", 0.7, 0.0)
    assert row.correction == "T-OPS" and row.feedback == "No, it's T-OPS, not T-POP."
    # the author is the user whose next message carried the evidence, at her trust
    assert (row.principal, row.trust) == ("ana", "user")
    assert row.metadata == {"signal": "correction", "evidence_record_id": corrected.record_id}
    assert row.idempotency_key == f"signal:correction:{asked.record_id}"
    # a second pass, or another worker's first pass, writes nothing again
    assert first.run("support", ON).written == 0
    again = writer(gateway).run("support", ON)
    assert (again.written, again.already) == (0, 1)
    assert len(computed(gateway, asked.record_id)) == 1


def test_a_later_turn_is_seen_by_the_next_pass(gateway: GatewayThread) -> None:
    agent = Agent(gateway, "openai", key="sk-ana")
    asked = agent.user("where is my parcel?").ask(tools=False)
    signals = writer(gateway)
    assert signals.run("support", ON).written == 0  # nothing said about it yet
    agent.user("thanks, perfect!").ask(tools=False)
    done = signals.run("support", ON)
    assert done.by_signal == {"accept": 1}
    (row,) = computed(gateway, asked.record_id)
    assert (row.source, row.score) == ("signal:accept", 1.0)


def test_selection_weighs_computed_feedback_and_prefers_written_corrections(
    gateway: GatewayThread,
) -> None:
    asked, _ = said(gateway, "which team owns gadgets?", "No, it's T-GAD, not T-POP.")
    graded, _ = said(gateway, "which team owns gizmos?", "No, it's T-GIZ, not T-POP.")
    writer(gateway).run("support", ON)
    # an explicit correction on one of them, written before the signal was computed
    body = {"score": 0.0, "correction": "T-GIZMO", "metadata": {}, "feedback": None}
    gateway.store.add_feedback(
        FeedbackDraft(
            scenario="support", record_ids=(graded.record_id,), principal="ana",
            idempotency_key=None, **body,
        )
    )  # fmt: skip
    examples = {e.record_id: e for e in batch(gateway).train}
    assert examples[asked.record_id].correction == "T-GAD"  # computed alone still trains
    assert examples[graded.record_id].correction == "T-GIZMO"  # the written one wins
    assert batch(gateway).stats["computed_feedback"] == 2
    # weight 0 leaves computed feedback out as if it had never been given
    off = batch(gateway, sources={"signal": 0.0})
    (only,) = off.train  # the written correction's session, merged as ever
    assert graded.record_id in only.source_ids and only.correction == "T-GIZMO"
    assert off.stats["source_excluded"] == 2 and off.stats["no_feedback"] >= 1


def test_weighted_scores_mix_sources_by_weight_and_confidence(gateway: GatewayThread) -> None:
    asked, _ = said(gateway, "how do I pay?", "thanks, that works")
    writer(gateway).run("support", ON)  # accept: score 1, confidence 0.6
    gateway.store.add_feedback(
        FeedbackDraft(
            scenario="support", record_ids=(asked.record_id,), score=0.0, feedback=None,
            correction=None, metadata={}, principal="ops", idempotency_key=None,
        )
    )  # fmt: skip
    (example,) = batch(gateway).train
    assert example.score == pytest.approx(0.6 / 1.6)  # (1 x 0.6 + 0 x 1) / (0.6 + 1)
    (example,) = batch(gateway, sources={"signal:accept": 2.0}).train
    assert example.score == pytest.approx(1.2 / 2.2)


def test_the_gate_takes_computed_feedback_as_evidence_only_when_the_recipe_says(
    gateway: GatewayThread,
) -> None:
    asked, _ = said(gateway, "which team owns sprockets?", "No, it's T-SPR, not T-POP.")
    writer(gateway).run("support", ON)
    recipe: dict[str, Any] = {
        "learners": [{"type": "fewshot"}],
        "selection": {"holdout_fraction": 1},
    }
    chain = ReleaseChain(gateway.database)
    assert holdout_items(gateway.store, chain, "support", parse_recipe(recipe)) == []
    recipe["gate"] = {"evidence_sources": {"signal:correction": 1.0}}
    (item,) = holdout_items(gateway.store, chain, "support", parse_recipe(recipe))
    assert (item.id, item.reference) == (asked.record_id, "T-SPR")
    assert item.provenance.trust == "user" and item.provenance.authors == ("ana",)


def test_the_worker_writes_signals_before_its_triggers_count_feedback(
    gateway: GatewayThread,
) -> None:
    said(gateway, "which team owns bolts?", "No, it's T-BOLT, not T-POP.")
    recipe = parse_recipe(
        {
            "learners": [{"type": "fewshot"}],
            "trigger": {"type": "min_new_feedback", "count": 1},
            "signals": {"enabled": ["correction"]},
        }
    )
    worker = Worker(
        gateway.settings, gateway.store, ReleaseChain(gateway.database),
        open_artifact_store(str(gateway.settings.home / "artifacts")),
        queue=JobQueue(gateway.database), evaluations=EvaluationStore(gateway.database),
        recipes={"support": recipe},
    )  # fmt: skip
    (job,) = worker.check_triggers()
    assert job.scenario == "support" and job.input == {"trigger": "min_new_feedback"}


def test_a_source_is_checked_when_written(tmp_path: Path) -> None:
    store = SQLExperienceStore.from_url(f"sqlite:///{tmp_path / 'reef.db'}")
    store.migrate()
    base: dict[str, Any] = {
        "scenario": "s", "record_ids": ("r",), "score": 1.0, "feedback": None,
        "correction": None, "metadata": {}, "principal": None, "idempotency_key": None,
    }  # fmt: skip
    for source, confidence, message in [
        ("signal:Bad Name", 0.5, "neither 'explicit'"),
        ("oracle:x", 0.5, "neither 'explicit'"),
        ("signal:accept", None, "needs a confidence"),
        ("judge:rubric", 1.5, "needs a confidence"),
        ("explicit", 0.5, "carries no confidence"),
    ]:
        with pytest.raises(InvalidInputError, match=message):
            store.add_feedback(FeedbackDraft(**base, source=source, confidence=confidence))
    with pytest.raises(ValueError, match="sources"):
        SelectionConfig(sources={"everything": 1.0})


def post(gateway: GatewayThread, record_id: str, score: float, correction: Any = None) -> None:
    gateway.store.add_feedback(
        FeedbackDraft(
            scenario="support", record_ids=(record_id,), score=score, feedback=None,
            correction=correction, metadata={}, principal="ops", idempotency_key=None,
        )
    )  # fmt: skip


def test_calibration_measures_each_source_against_posted_feedback(
    gateway: GatewayThread, tmp_path: Path
) -> None:
    right, _ = said(gateway, "which team owns axles?", "No, it's T-AX, not T-POP.")
    wrong, _ = said(gateway, "which team owns hubs?", "that's wrong")
    (missed,) = said(gateway, "which team owns rims?")
    thanked, _ = said(gateway, "which team owns tyres?", "thanks, perfect")
    writer(gateway).run("support", ON)
    post(gateway, right.record_id, 0.0, "t-ax")  # the signal's correction, other case
    post(gateway, wrong.record_id, 1.0)  # the complaint was wrong: the answer was fine
    post(gateway, missed.record_id, 0.0)  # bad, and no signal saw it
    post(gateway, thanked.record_id, 1.0)
    found = {source.source: source for source in calibrate(gateway.store, "support")}
    correction = found["signal:correction"]
    assert (correction.rows, correction.compared, correction.polarity) == (2, 2, "bad")
    assert correction.precision == 0.5  # right agreed, wrong did not
    assert correction.recall == 0.5  # of the posted bad answers (right, missed): right
    assert (correction.corrections_compared, correction.corrections_agree) == (1, 1.0)
    accept = found["signal:accept"]
    assert (accept.polarity, accept.precision, accept.recall) == ("good", 1.0, 0.5)

    config = tmp_path / "reef.yaml"
    url = gateway.settings.store_url()
    config.write_text(f"home: {tmp_path / 'home'}\nstore: {{url: '{url}'}}\n")
    args = ["feedback", "calibrate", "--scenario", "support", "-c", str(config)]
    shown = CliRunner().invoke(app, [*args, "--json"])
    assert shown.exit_code == 0, shown.output
    rows = {row["source"]: row for row in json.loads(shown.output)}
    assert rows["signal:correction"]["precision"] == 0.5
    table = CliRunner().invoke(app, args)
    assert table.exit_code == 0 and "signal:correction" in table.output and "50%" in table.output


def test_a_source_measured_below_its_precision_does_not_train(gateway: GatewayThread) -> None:
    wrong = [said(gateway, f"which team owns part {n}?", "that's wrong")[0] for n in range(2)]
    kept, _ = said(gateway, "which team owns part 9?", "No, it's T-NINE, not T-POP.")
    writer(gateway).run("support", ON)
    for sent in wrong:  # people said those answers were fine: the complaints were wrong
        post(gateway, sent.record_id, 1.0)
    strict = {"min_source_precision": 0.5, "min_calibration_items": 2}
    chosen = batch(gateway, **strict)
    assert chosen.stats["low_precision:signal:correction"] == 3
    assert kept.record_id not in {e.record_id for e in chosen.train}  # its source is out
    # too few answers graded both ways to judge the rule: it trains
    lenient = batch(gateway, min_source_precision=0.5, min_calibration_items=3)
    assert kept.record_id in {e.record_id for e in lenient.train}


def conversation(
    gateway: GatewayThread, session: str, end_user: dict[str, Any], *texts: str
) -> list[str]:
    """One session of ``texts`` under key ``ana``, naming the end user through
    ``end_user`` (SDK keyword arguments, or ``extra_headers``); its record ids."""
    client = gateway.openai(api_key="sk-ana")
    headers = {"x-reef-scenario": "support", "x-reef-session": session}
    headers.update(end_user.pop("extra_headers", {}))
    history: list[Any] = []
    ids = []
    for text in texts:
        history.append({"role": "user", "content": text})
        raw = client.chat.completions.with_raw_response.create(
            model="gpt-4o", messages=history, extra_headers=headers, **end_user
        )
        history.append(raw.parse().choices[0].message.model_dump(exclude_none=True))
        ids.append(raw.headers["x-reef-record-id"])
    return ids


def test_end_users_behind_one_key_are_each_their_signals_author(gateway: GatewayThread) -> None:
    bob, _ = conversation(
        gateway, "s-bob", {"user": "bob"}, "which team owns widgets?", "No, it's T-OPS, not T-POP."
    )
    cyd, _ = conversation(
        gateway,
        "s-cyd",
        {"extra_headers": {"x-reef-end-user": "cyd"}},
        "which team owns gadgets?",
        "No, it's T-GAD, not T-POP.",
    )
    plain, _ = conversation(gateway, "s-key", {}, "which team owns gizmos?", "No, it's T-GIZ.")
    writer(gateway).run("support", ON)
    authors = {rid: computed(gateway, rid)[0] for rid in (bob, cyd, plain)}
    assert authors[bob].principal == "ana/bob"
    assert authors[cyd].principal == "ana/cyd"
    assert authors[plain].principal == "ana"  # no end user named: the key
    # the key's trust level, whoever the end user is
    assert {row.trust for row in authors.values()} == {"user"}
    # selection's per-principal cap counts the end users apart: three principals, no
    # single-source exemption, and each example names its own author
    config = SelectionConfig(holdout_fraction=0, max_per_principal=0.5)
    found = select_experience(gateway.store, ReleaseChain(gateway.database), "support", config)
    assert "principal_cap_single_source" not in found.stats
    assert {e.record_id: e.principals for e in found.train} == {
        bob: ["ana/bob"],
        cyd: ["ana/cyd"],
        plain: ["ana"],
    }


def test_what_was_dropped_is_counted_for_the_job_and_said_to_the_gate(
    gateway: GatewayThread,
) -> None:
    said(gateway, "which team owns widgets?", "No, that's wrong.")  # a complaint, no value
    corrected, _ = said(gateway, "which team owns gadgets?", "No, it's T-GAD, not T-POP.")
    said(gateway, "which team owns bolts?")  # nobody said anything of it
    writer(gateway).run("support", ON)
    assert batch(gateway).stats["complaint_without_value"] == 1
    recipe = parse_recipe(
        {
            "learners": [{"type": "fewshot"}],
            "selection": {"holdout_fraction": 1},
            "gate": {"evidence_sources": {"signal:correction": 1.0}},
        }
    )
    held = select_holdout(gateway.store, ReleaseChain(gateway.database), "support", recipe)
    assert [item.id for item in held.items] == [corrected.record_id]
    # the two follow-up turns and the bolts question carry no feedback of their own
    assert held.skipped == {"complaint_without_value": 1, "no_feedback": 3}
    sentence = dropped_sentence(held.skipped)
    assert sentence == (
        "1 held-out record had a complaint but no corrected value; "
        "3 had no feedback the gate counts as evidence"
    )
    notes = evidence_notes(held, None)
    assert notes.dropped == sentence
    assert notes.details == {"holdout_skipped": held.skipped}


def test_signals_preview_counts_and_samples_what_the_rules_find_writing_nothing(
    gateway: GatewayThread, tmp_path: Path
) -> None:
    vague, _ = said(gateway, "which team owns widgets?", "No, that's wrong.")
    valued, _ = said(gateway, "which team owns gadgets?", "No, it's T-GAD, not T-POP.")
    liked, _ = said(gateway, "where is my parcel?", "thanks, perfect!")
    config = tmp_path / "reef.yaml"
    url = gateway.settings.store_url()
    config.write_text(f"home: {tmp_path / 'home'}\nstore: {{url: '{url}'}}\n")
    args = ["signals", "preview", "--scenario", "support", "-c", str(config)]
    shown = CliRunner().invoke(app, [*args, "--since", "1h", "--json"])
    assert shown.exit_code == 0, shown.output
    found = json.loads(shown.output)
    assert found["by_signal"] == {"accept": 1, "correction": 2}
    assert (found["corrections"], found["complaints_without_value"]) == (1, 1)
    assert found["sessions"] == 3 and found["rules"].startswith("the default rules")
    (without,) = found["samples"]["complaint_without_value"]
    assert (without["record_id"], without["said"]) == (vague.record_id, "No, that's wrong.")
    assert without["answer"] == vague.text and without["correction"] is None
    (with_value,) = found["samples"]["correction"]
    assert (with_value["record_id"], with_value["correction"]) == (valued.record_id, "T-GAD")
    assert found["samples"]["accept"][0]["record_id"] == liked.record_id
    # nothing was written: no computed feedback on any answer
    assert all(computed(gateway, s.record_id) == [] for s in (vague, valued, liked))
    text = CliRunner().invoke(app, args)
    assert text.exit_code == 0, text.output
    assert "complaints without a value: 1" in text.output
    assert "corrections with a value:   1" in text.output
    # a time in the future finds nothing; a time that is neither form is refused
    later = CliRunner().invoke(app, [*args, "--since", "2999-01-01T00:00:00", "--json"])
    assert json.loads(later.output)["sessions"] == 0
    wrong = CliRunner().invoke(app, [*args, "--since", "yesterday"])
    assert wrong.exit_code == 2 and "neither an age" in wrong.output


def test_a_complaint_without_a_value_lowers_the_score_and_is_undesirable_for_kto(
    gateway: GatewayThread,
) -> None:
    vague, _ = said(gateway, "which team owns widgets?", "No, that's wrong.")
    liked, _ = said(gateway, "which team owns gadgets?", "thanks, perfect!")
    post(gateway, vague.record_id, 0.5)  # a person found it middling
    writer(gateway).run("support", ON)
    examples = {e.record_id: e for e in batch(gateway).train}
    complained = examples[vague.record_id]
    assert complained.complaint_without_value and complained.correction is None
    # 0.5 posted (weight 1) and the complaint's 0 (weight 0.7): below either alone
    assert complained.score == pytest.approx(0.5 / 1.7)
    kto, used = unpaired_examples(list(examples.values()), good_score=1.0, bad_score=0.0)
    verdicts = {(e.target, e.desirable) for e in kto}
    assert (vague.text, False) in verdicts  # what not to say, though no right value was given
    assert (liked.text, True) in verdicts
    assert set(used) >= {vague.record_id, liked.record_id}


def test_an_anthropic_requests_metadata_user_id_names_the_author(gateway: GatewayThread) -> None:
    client = gateway.anthropic(api_key="sk-ana")
    headers = {"x-reef-scenario": "support", "x-reef-session": "s-dee"}
    history: list[Any] = []
    ids = []
    for text in ("which team owns widgets?", "No, it's T-OPS, not T-POP."):
        history.append({"role": "user", "content": text})
        raw = client.messages.with_raw_response.create(
            model="claude-x", max_tokens=64, messages=history, extra_headers=headers,
            metadata={"user_id": "dee"},
        )  # fmt: skip
        reply = raw.parse()
        history.append({"role": "assistant", "content": [b.model_dump() for b in reply.content]})
        ids.append(raw.headers["x-reef-record-id"])
    writer(gateway).run("support", ON)
    (row,) = computed(gateway, ids[0])
    assert (row.principal, row.trust, row.correction) == ("ana/dee", "user", "T-OPS")
