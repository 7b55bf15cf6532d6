"""``reef quickstart --task agent``: the order-support world and the app's grading rule
(fast), and the reduced run (the tiny random model, one round) through the real gateway,
worker and gate. Success rates are the full run's business, not this test's."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from reef.cli.main import app
from reef.experience import open_store
from reef.quickstart.agent import (
    TOOLS,
    Call,
    RequestGenerator,
    Turn,
    grade,
    names,
    suite_items,
)
from tests.engine.lora_factory import PEFT_WRAP_WARNING

os.environ.setdefault("HF_HUB_OFFLINE", "1")

EPISODES, HELDOUT = 12, 6


def test_requests_are_distinct_and_the_heldout_phrasings_and_orders_are_reserved() -> None:
    generator = RequestGenerator(seed=0)
    heldout = generator.draw(30, held_out=True)
    traffic = [r for _ in range(3) for r in generator.draw(60, held_out=False)]
    assert not {r.template for r in heldout} & {r.template for r in traffic}
    orders = [r.call.arguments.get("order_id") for r in [*heldout, *traffic]]
    named = [o for o in orders if o is not None]
    assert len(set(named)) == len(named) > 100, "no order serves two requests"
    assert {r.intent for r in heldout} == {"status", "stock", "return"}
    assert {r.call.arguments.get("reason") for r in traffic} >= {"damaged", "wrong_item"}
    again = RequestGenerator(seed=0).draw(30, held_out=True)
    assert [r.text for r in again] == [r.text for r in heldout], "seeded"


def test_the_world_answers_the_right_call_with_the_fact() -> None:
    generator = RequestGenerator(seed=1)
    for request in generator.draw(18, held_out=False):
        result = generator.world.execute(request.call)
        assert "error" not in result
        assert names(json.dumps(result), request.fact)
        assert names(request.answer, request.fact)
    assert "error" in generator.world.execute(Call("lookup_order", {"order_id": "Z-1"}))
    assert "error" in generator.world.execute(Call("open_return", {"order_id": 1}))


def test_an_episode_succeeds_only_with_the_right_call_then_the_fact() -> None:
    [request] = RequestGenerator(seed=2).draw(1, held_out=True)
    right = Turn("", (request.call,), "r1")
    assert grade(request, [right, Turn(f"Done: {request.answer}", (), "r2")]).success

    no_call = grade(request, [Turn("I can help with that.", (), "r1")])
    assert not no_call.success and no_call.wrong_turn == 0
    assert no_call.correction == {"tool_calls": [request.call.to_openai()]}

    wrong_args = Call(request.call.name, {**request.call.arguments, "order_id": "A-00000"})
    assert grade(request, [Turn("", (wrong_args,)), Turn(request.answer)]).wrong_turn == 0
    twice = grade(request, [right, Turn("", (request.call,))])
    assert twice.wrong_turn == 1 and twice.correction == request.answer
    vague = grade(request, [right, Turn("Your request has been handled.")])
    assert not vague.success and vague.wrong_turn == 1
    # the fact inside tool markup is no answer to a customer
    markup = Turn(f"<tool_response>\n{request.fact}\n</tool_response>")
    assert grade(request, [right, markup]).wrong_turn == 1
    assert not names(f"x{request.fact}", request.fact)


def test_the_gate_suite_asks_the_call_and_the_answer_with_the_tools() -> None:
    generator = RequestGenerator(seed=3)
    [request] = generator.draw(1, held_out=True)
    call_item, answer_item = suite_items([request], generator.world, "suite")
    assert call_item["reference"] == {"tool_calls": [request.call.to_openai()]}
    assert call_item["scorer"] == {"type": "tool_call"} and call_item["params"]["tools"] == TOOLS
    assert [m["role"] for m in answer_item["messages"]] == ["user", "assistant", "tool"]
    assert request.fact in answer_item["messages"][-1]["content"]
    assert answer_item["scorer"] == {"type": "regex", "flags": ["IGNORECASE"]}
    pattern = answer_item["reference"]
    assert re.search(pattern, request.answer.upper(), re.IGNORECASE)
    assert not re.search(pattern, f"<tool_response>{request.fact}</tool_response>", re.I)


def test_the_agent_task_grades_outcomes_so_implicit_feedback_is_refused(tmp_path: Path) -> None:
    args = ["quickstart", "--task", "agent", "--feedback", "implicit", "--dir", str(tmp_path)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code != 0 and "grades outcomes" in str(result.exception)
    assert not list(tmp_path.iterdir())


@pytest.mark.slow
@pytest.mark.filterwarnings(PEFT_WRAP_WARNING)
def test_reduced_agent_quickstart_runs_episodes_and_learns_from_their_outcomes(
    tmp_path: Path,
) -> None:
    root = tmp_path / "qs"
    args = ["quickstart", "--task", "agent", "--model", "tiny-random", "--rounds", "1"]
    args += ["--dir", str(root), "--requests", str(EPISODES), "--heldout", str(HELDOUT)]
    args += ["--port", "0"]  # a free port: 8600 may be bound between the check and the bind
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output + repr(result.exception)
    assert "Round 1" in result.output and "episodes served" in result.output

    summary = json.loads((root / "summary.json").read_text())
    [round_one] = summary["rounds"]
    assert summary["task"] == "agent" and summary["cpu_seconds"] > 0
    assert round_one["traffic"] == EPISODES
    assert round_one["job_state"] == "succeeded", round_one
    assert round_one["gate_action"] in ("published", "rejected")
    assert round_one["gate"]["decision"]["reasons"], "the gate says why"
    assert summary["base"]["total"] == HELDOUT
    report = (root / "report.html").read_text()
    assert "order-support agent" in report and "The application grades outcomes" in report
    assert (root / "learning_curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "credit: outcome" in (root / "recipe.yaml").read_text()

    store = open_store(f"sqlite:///{root / '.reef' / 'reef.db'}")
    try:
        records = list(store.iter_export("orders"))
        served = [r for r in records if r.purpose == "serve"]
    finally:
        store.close()
    assert all(r.request.get("tools") for r in served), "every turn offered the tools"
    fallbacks = [r for r in served if r.session_id.endswith(".fallback")]
    episodes = {r.session_id for r in served} - {r.session_id for r in fallbacks}
    assert len(episodes) == EPISODES, "one session per episode"
    assert all(len(r.feedback) == 1 for r in fallbacks), "every fallback answer was graded"
    # every failed episode's outcome names the turn that went wrong and its correction
    failed = EPISODES - round_one["traffic_correct"]
    outcomes = [fb for r in served for fb in r.feedback if fb.session_id is not None]
    assert len([fb for fb in outcomes if fb.correction is not None]) == failed
    assert round_one["feedback"] == EPISODES + len(fallbacks)
    wrong_fallbacks = sum(r.feedback[0].correction is not None for r in fallbacks)
    assert round_one["corrections"] == failed + wrong_fallbacks
    evals = [r for r in records if r.purpose == "eval"]
    assert len(evals) >= HELDOUT and not any(r.feedback for r in evals)
