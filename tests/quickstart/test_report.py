"""The quickstart's account of a round: the console line and the report's table row name
the model training of the round's last learner that reports a loss curve."""

from __future__ import annotations

from reef.quickstart.report import _round_row, round_line
from reef.quickstart.rounds import RoundResult

LEARNERS = {
    "fewshot:demos": {"demos": 2},
    "sft:adapter": {"examples": 96, "loss_curve": [1.964, 0.7, 0.412], "seconds": 75.4},
}


def test_the_console_line_names_the_training() -> None:
    line = round_line(RoundResult(number=1, traffic=120, learners=LEARNERS))
    assert "  adapter trained on 96 examples, 3 steps, loss 1.96 → 0.41; gate: " in line


def test_the_report_row_names_the_training_and_its_seconds() -> None:
    row = _round_row(RoundResult(number=1, traffic=120, learners=LEARNERS))
    assert "<td>adapter: 96 examples, 3 steps, loss 1.96 → 0.41, 75 s</td>" in row


def test_a_round_without_model_training_says_so() -> None:
    result = RoundResult(number=2, traffic=120, learners={"fewshot:demos": {"demos": 2}})
    assert "trained on" not in round_line(result)
    assert "<td>-</td>" in _round_row(result)
