"""``reef quickstart`` in its reduced mode (the tiny random model, one round): the whole
loop runs through the real gateway, worker and gate, and leaves its report, its learning
curve and its experience in the store. Accuracy is the full run's business, not this
test's (the tiny model learns nothing useful in eight steps)."""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from reef.cli.main import app
from reef.engine.choice import CHOICE_FILE
from reef.experience import open_store
from reef.learning.recipes import parse_recipe
from reef.quickstart.application import GatewayClient
from reef.quickstart.scenario import LABELS, TicketGenerator, is_correct
from reef.quickstart.session import choose_port
from reef.quickstart.workspace import busy_cores, prepare, recipe_yaml, training_threads
from tests.engine.lora_factory import PEFT_WRAP_WARNING

os.environ.setdefault("HF_HUB_OFFLINE", "1")

REQUESTS, HELDOUT = 24, 12


@pytest.mark.slow
@pytest.mark.filterwarnings(PEFT_WRAP_WARNING)
def test_reduced_quickstart_runs_the_loop_and_reports_it(tmp_path: Path) -> None:
    root = tmp_path / "qs"
    args = ["quickstart", "--model", "tiny-random", "--rounds", "1", "--dir", str(root)]
    args += ["--requests", str(REQUESTS), "--heldout", str(HELDOUT), "--dtype", "bfloat16"]
    args += ["--port", "0"]  # a free port: 8600 may be bound between the check and the bind
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output + repr(result.exception)
    assert "Round 1" in result.output and "gate:" in result.output

    summary = json.loads((root / "summary.json").read_text())
    assert summary["dtype"] == "bfloat16", "the engine serves in the precision asked for"
    # backend: auto, resolved on this machine: eager unless the openvino extra is here
    assert (
        yaml.safe_load((root / "reef.yaml").read_text())["upstreams"]["local"]["backend"] == "auto"
    )
    assert summary["backend"] in ("eager", "openvino")
    [round_one] = summary["rounds"]
    assert round_one["traffic"] == REQUESTS
    assert round_one["job_state"] == "succeeded"
    # The tiny model's candidate gains nothing on 12 items: the sequential rule may
    # reject it or wait for more traffic (it stays evaluating), never publish by chance.
    assert round_one["gate_action"] in ("published", "rejected", "undecided")
    assert round_one["gate"]["decision"]["reasons"], "the gate says why"
    # No keys: the one caller is the operator, so its feedback is trusted evidence as it
    # is (no leave-one-author-out) and nothing is screened out.
    evidence = round_one["gate"]["decision"]["evidence"]
    assert evidence["items_below_min_trust"] == 0 and evidence["leave_one_out"] == []
    assert "adapter" in round_one["new_components"]
    assert summary["base"]["total"] == HELDOUT

    report = (root / "report.html").read_text()
    assert summary["base"]["release_id"][-8:] in report
    assert round_one["candidate_id"][-8:] in report
    assert "<style>" in report and "data:image/png;base64," in report
    assert "https://" not in report, "the report works offline"
    assert (root / "learning_curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    store = open_store(f"sqlite:///{root / '.reef' / 'reef.db'}")
    try:
        records = list(store.iter_export("triage"))
    finally:
        store.close()
    served = [r for r in records if r.purpose == "serve"]
    assert len(served) == REQUESTS
    assert all(len(r.feedback) == 1 for r in served), "every answer was graded"
    corrected = [r for r in served if r.feedback[0].correction is not None]
    assert all(r.feedback[0].score == 0.0 for r in corrected)
    evals = [r for r in records if r.purpose == "eval"]
    assert len(evals) >= HELDOUT, "held-out questions and gate calls are eval records"
    assert not any(r.feedback for r in evals)


def test_an_earlier_run_is_kept_unless_fresh(tmp_path: Path) -> None:
    root = tmp_path / "qs"
    root.mkdir()
    (root / ".reef-quickstart").write_text("")
    (root / "reef.yaml").write_text("home: .reef\n")
    args = ["quickstart", "--model", "tiny-random", "--dir", str(root), "--port", "1"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code != 0
    assert "--fresh" in str(result.exception)
    assert (root / "reef.yaml").read_text() == "home: .reef\n"


def test_fresh_keeps_the_converted_model_and_the_backend_choice(tmp_path: Path) -> None:
    workspace = prepare(tmp_path / "qs", fresh=False)
    engine = workspace.home / "engine"
    (workspace.home / "models" / "m").mkdir(parents=True)
    (engine / "adapters").mkdir(parents=True)
    (engine / CHOICE_FILE.name).write_text("{}")
    (engine / "other.json").write_text("{}")
    (workspace.home / "reef.db").write_text("")
    (workspace.root / "reef.yaml").write_text("home: .reef\n")

    prepare(workspace.root, fresh=True)
    assert sorted(p.name for p in workspace.home.iterdir()) == ["engine", "models"]
    assert [p.name for p in engine.iterdir()] == [CHOICE_FILE.name]
    assert (workspace.home / "models" / "m").is_dir()
    assert not (workspace.root / "reef.yaml").exists()


def test_fresh_never_clears_a_directory_it_did_not_write(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("mine")
    args = ["quickstart", "--model", "tiny-random", "--dir", str(tmp_path), "--fresh"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code != 0
    assert "not a quickstart directory" in str(result.exception)
    assert (tmp_path / "notes.txt").read_text() == "mine"


def test_tickets_are_distinct_balanced_and_the_heldout_phrasings_are_reserved() -> None:
    generator = TicketGenerator(seed=0)
    heldout = generator.draw(60, held_out=True)
    traffic = [t for _ in range(3) for t in generator.draw(120, held_out=False)]
    texts = [t.text for t in [*heldout, *traffic]]
    assert len(set(texts)) == len(texts) >= 300
    assert {t.label for t in heldout} == set(LABELS)
    assert all(sum(t.label == label for t in heldout) == 10 for label in LABELS)
    # no held-out phrasing is ever sent as traffic
    assert not {t.template for t in heldout} & {t.template for t in traffic}
    assert len({t.template for t in heldout}) == 3 * len(LABELS)


def test_traffic_is_split_by_sessions_named_from_its_text() -> None:
    # Issue 44: the gateway's random session and record ids held out different tickets
    # on each run of one seed. The quickstart names each unit's session from its text
    # (the n-th unit with a text gets the n-th name) and its recipe splits by session.
    texts = [t.text for t in TicketGenerator(seed=0).draw(12, held_out=False)]
    texts += texts[:2]  # a text sent again is another unit: another session
    runs = [GatewayClient("http://127.0.0.1:9", "triage") for _ in range(2)]
    try:
        first, second = ([run.traffic_session(text) for text in texts] for run in runs)
    finally:
        for run in runs:
            run.close()
    assert first == second
    assert len(set(first)) == len(texts)
    for implicit in (False, True):
        recipe = parse_recipe(yaml.safe_load(recipe_yaml("tiny-random", 2.0, implicit=implicit)))
        assert recipe.selection.holdout_key == "session"
    # The adapter alone by default; with demos, the adapter trains and serves under them.
    alone = parse_recipe(yaml.safe_load(recipe_yaml("smollm2-135m", 2.0)))
    assert [learner.type for learner in alone.learners] == ["sft"]
    with_demos = parse_recipe(yaml.safe_load(recipe_yaml("smollm2-135m", 2.0, demos=2)))
    fewshot, sft = with_demos.learners
    assert fewshot.type == "fewshot" and fewshot.settings()["k"] == 2
    assert sft.settings()["demos"] == "keep"


def test_the_grader_normalizes_like_the_gate() -> None:
    assert is_correct(" Billing.", "billing")
    assert is_correct("`shipping`", "shipping")
    assert not is_correct("billing issue", "billing")


@pytest.mark.slow
@pytest.mark.filterwarnings(PEFT_WRAP_WARNING)
def test_implicit_quickstart_learns_from_the_users_replies_alone(tmp_path: Path) -> None:
    root = tmp_path / "qs"
    args = ["quickstart", "--model", "tiny-random", "--rounds", "1", "--dir", str(root)]
    args += ["--requests", str(REQUESTS), "--heldout", str(HELDOUT), "--feedback", "implicit"]
    args += ["--port", "0"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output + repr(result.exception)
    assert "no feedback" in result.output and "signals:" in result.output

    summary = json.loads((root / "summary.json").read_text())
    [round_one] = summary["rounds"]
    assert summary["feedback"] == "implicit" and round_one["corrections"] == 0
    assert round_one["job_state"] == "succeeded", round_one
    signals = round_one["signals"]
    # the tiny random model is always wrong: the users' complaints are all it hears
    assert signals["wrong"] == REQUESTS and round_one["follow_ups"] == signals["flagged"] > 0
    assert signals["precision"] == 1.0 and signals["corrections_right"] == signals["corrections"]
    assert (root / "suite.jsonl").exists() and "suites: [suite.jsonl]" in (
        root / "recipe.yaml"
    ).read_text()

    store = open_store(f"sqlite:///{root / '.reef' / 'reef.db'}")
    try:
        records = list(store.iter_export("triage"))
    finally:
        store.close()
    served = [r for r in records if r.purpose == "serve"]
    assert len(served) == REQUESTS + round_one["follow_ups"]  # the replies are turns too
    sources = {fb.source for r in served for fb in r.feedback}
    assert sources == {"signal:correction"}, "nothing was posted; only the signals spoke"


def test_training_takes_every_core_only_on_an_idle_machine() -> None:
    assert training_threads(busy=0.1, cores=2) == 2
    assert training_threads(busy=0.6, cores=2) == 1, "something else is busy: one thread"
    assert training_threads(busy=1.5, cores=8) == 8
    assert training_threads(busy=2.5, cores=8) == 1
    busy = busy_cores(0.2)
    if Path("/proc/stat").exists():
        assert busy is not None and 0.0 <= busy <= (os.cpu_count() or 1)


def test_the_port_is_the_docs_one_when_free_else_a_free_one_said_aloud() -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        taken = int(held.getsockname()[1])
        port, note = choose_port(None, default=taken)
        assert port != taken and port > 0
        assert f"port {taken} is taken" in note
        assert f"reef.yaml serves on {port}" in note and f"127.0.0.1:{port}/v1" in note
    assert choose_port(None, default=taken) == (taken, "")  # free again: the docs' port
    assert choose_port(4321) == (4321, "")  # --port: as asked
    free, said = choose_port(0)
    assert free > 0 and said == ""
