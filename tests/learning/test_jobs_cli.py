"""``reef learn`` and ``reef jobs list|show|cancel`` (mounted here as in reef.cli.main)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from reef.cli.learning import jobs_app, learn_command, worker_command
from reef.learning import LearnerRegistry, load_recipe
from reef.learning.recipes import parse_recipe

app = typer.Typer()
app.command("learn")(learn_command)
app.command("worker")(worker_command)
app.add_typer(jobs_app, name="jobs")


def _config(tmp_path: Path) -> Path:
    config = tmp_path / "reef.yaml"
    recipe = tmp_path / "support.yaml"
    recipe.write_text("learners: [{type: fewshot, k: 2}]\n")
    config.write_text(f"home: {tmp_path / 'home'}\nscenarios:\n  support: {{recipe: {recipe}}}\n")
    return config


def test_learn_then_list_show_cancel(tmp_path: Path) -> None:
    config = str(_config(tmp_path))
    runner = CliRunner()
    learned = runner.invoke(app, ["learn", "--scenario", "support", "-c", config])
    assert learned.exit_code == 0, learned.output
    job_id = learned.output.strip()
    again = runner.invoke(app, ["learn", "--scenario", "support", "-c", config])
    assert again.exit_code == 0 and again.output.strip().endswith(job_id)

    listed = runner.invoke(app, ["jobs", "list", "--json", "-c", config])
    assert [job["id"] for job in json.loads(listed.output)] == [job_id]
    table = runner.invoke(app, ["jobs", "list", "--scenario", "support", "-c", config])
    assert job_id in table.output and "queued" in table.output

    shown = json.loads(runner.invoke(app, ["jobs", "show", job_id, "-c", config]).output)
    assert shown["input"] == {"trigger": "manual"} and shown["state"] == "queued"
    cancelled = runner.invoke(app, ["jobs", "cancel", job_id, "-c", config])
    assert cancelled.output.strip() == f"job {job_id} is cancelled"


def test_learn_with_a_recipe_file_carries_it_in_the_job(tmp_path: Path) -> None:
    config = str(_config(tmp_path))
    recipe = tmp_path / "r.yaml"
    recipe.write_text("learners: [{type: fewshot, k: 2}]\n")
    runner = CliRunner()
    learned = runner.invoke(
        app, ["learn", "--scenario", "support", "--recipe", str(recipe), "-c", config]
    )
    assert learned.exit_code == 0, learned.output
    shown = json.loads(
        runner.invoke(app, ["jobs", "show", learned.output.strip(), "-c", config]).output
    )
    assert shown["input"]["recipe"]["learners"] == [{"type": "fewshot", "k": 2}]
    assert shown["input"]["recipe"]["name"] == "r"


EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.mark.parametrize(
    "name", ["support-fewshot.yaml", "support-sft.yaml", "order-support/recipe.yaml"]
)
def test_a_recipe_carried_in_a_job_parses_again_as_the_worker_reads_it(
    tmp_path: Path, name: str
) -> None:
    config = str(_config(tmp_path))
    runner = CliRunner()
    path = EXAMPLES / name
    learned = runner.invoke(
        app, ["learn", "--scenario", "support", "--recipe", str(path), "-c", config]
    )
    assert learned.exit_code == 0, learned.output
    shown = json.loads(
        runner.invoke(app, ["jobs", "show", learned.output.strip(), "-c", config]).output
    )
    # what the worker does with it (LearningJob._recipe): the same recipe again
    carried = parse_recipe(shown["input"]["recipe"], "(job)", LearnerRegistry())
    assert carried == load_recipe(path)
