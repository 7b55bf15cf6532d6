"""Everything a scenario needs is checked before ``reef serve`` or ``reef worker`` starts:
each problem is one line naming the setting, exit code 2, no traceback.

The commands run in-process through ``reef.cli.exits.run`` (the error mapping a user
gets). The configured port is held by the test, so a check that wrongly passes ends in a
port error instead of a gateway that serves forever.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from reef.cli.exits import run
from reef.cli.main import app
from reef.cli.preflight import recipe_error_lines

UPSTREAMS = (
    "upstreams:\n"
    "  fake: {base_url: 'http://127.0.0.1:9/v1', model: m}\n"
    "  other: {base_url: 'http://127.0.0.1:9/v1'}\n"
)


@pytest.fixture
def held_port() -> Iterator[int]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield int(sock.getsockname()[1])


@pytest.fixture
def folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)  # relative paths in reef.yaml are relative to here
    return tmp_path


def _config(folder: Path, port: int, scenarios: str) -> Path:
    path = folder / "reef.yaml"
    path.write_text(
        f"home: '{folder / 'home'}'\n"
        f"store: {{url: 'sqlite:///{folder / 'reef.db'}'}}\n"
        f"server: {{port: {port}}}\n" + UPSTREAMS + f"scenarios:\n{scenarios}",
        encoding="utf-8",
    )
    return path


def _reef(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, list[str]]:
    """Run ``reef ARGS``; its exit code and the lines it wrote on stderr."""
    with pytest.raises(SystemExit) as exited:
        run(app, list(args))
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    return int(exited.value.code or 0), err.splitlines()


def _recipe(folder: Path, text: str, name: str = "recipe.yaml") -> None:
    (folder / name).write_text(text, encoding="utf-8")


def _harness(folder: Path) -> None:
    (folder / "harness").mkdir()
    (folder / "harness" / "harness.yaml").write_text(
        "schema_version: 1\nsystem_prompt: be brief\n", encoding="utf-8"
    )


GOOD_RECIPE = "learners: [{type: fewshot, k: 2}]\n"


@pytest.mark.parametrize(
    ("scenario", "files", "line"),
    [
        (
            "{initial_harness: harness}",
            {},
            "error: scenarios.support.initial_harness: folder harness ({folder}/harness) "
            "does not exist",
        ),
        (
            "{initial_harness: harness}",
            {"harness": ""},
            "error: scenarios.support.initial_harness: harness ({folder}/harness) is not a "
            "folder (a harness bundle is a folder)",
        ),
        (
            "{recipe: missing.yaml}",
            {},
            "error: scenarios.support.recipe: file missing.yaml ({folder}/missing.yaml) does "
            "not exist",
        ),
        (
            "{recipe: recipe.yaml}",
            {"recipe.yaml": "learners: [{type: fewshot, k: 2}]\ntriger: {type: manual}\n"},
            "error: scenarios.support.recipe (recipe.yaml): unknown key 'triger'; allowed "
            "keys here: gate, judges, learners, learning_budget, name, on_stale, publish, "
            "schema_version, selection, signals, trigger",
        ),
        (
            "{recipe: recipe.yaml}",
            {"recipe.yaml": "learners: [{type: fewshot, kk: 2}]\n"},
            "error: scenarios.support.recipe (recipe.yaml): ",  # the learner's own check
        ),
        (
            "{recipe: recipe.yaml}",
            {"recipe.yaml": GOOD_RECIPE + "gate: {suites: [suite.jsonl]}\n"},
            "error: scenarios.support.recipe (recipe.yaml): gate.suites[0]: file "
            "{folder}/suite.jsonl does not exist",
        ),
        (
            "{recipe: recipe.yaml}",
            {"recipe.yaml": GOOD_RECIPE + "judges: [{name: j, rubric: r, upstream: nope}]\n"},
            "error: scenarios.support.recipe (recipe.yaml): judges[0].upstream: unknown "
            "upstream 'nope'; configured upstreams: ['fake', 'other']",
        ),
        (
            "{recipe: recipe.yaml}",
            {"recipe.yaml": GOOD_RECIPE + "gate: {shadow: {judge: {model: m}}}\n"},
            "error: scenarios.support.recipe (recipe.yaml): gate.shadow.judge.upstream "
            "('fake') and gate.shadow.judge.model ('m') name the model that serves scenario "
            "'support', one of the arms the judge compares; name another model or upstream",
        ),
        (
            "{upstream: nope}",
            {},
            "  scenarios.support.upstream: scenario 'support' names upstream 'nope', which is "
            "not configured; configured upstreams: ['fake', 'other']",
        ),
    ],
    ids=[
        "no-harness-folder",
        "harness-not-a-folder",
        "no-recipe-file",
        "recipe-typo",
        "learner-setting-typo",
        "no-suite-file",
        "unknown-judge-upstream",
        "shadow-judge-is-an-arm",
        "unknown-scenario-upstream",
    ],
)
def test_each_bad_setting_stops_serve_with_one_line_and_exit_2(
    folder: Path,
    held_port: int,
    capsys: pytest.CaptureFixture[str],
    scenario: str,
    files: dict[str, str],
    line: str,
) -> None:
    for name, text in files.items():
        (folder / name).write_text(text, encoding="utf-8")
    config = _config(folder, held_port, f"  support: {scenario}\n")
    code, lines = _reef(capsys, "serve", "-c", str(config))
    assert code == 2, lines
    expected = line.replace("{folder}", str(folder))
    problems = [text for text in lines if text.startswith(("error: scenarios", "  scenarios"))]
    assert len(problems) == 1, lines
    assert problems[0].startswith(expected), (problems[0], expected)
    assert str(held_port) not in " ".join(lines), lines  # stopped before binding


def test_every_problem_is_listed_one_line_each(
    folder: Path, held_port: int, capsys: pytest.CaptureFixture[str]
) -> None:
    _recipe(folder, "learners: [{type: fewshot}]\nsurprise: 1\n")
    scenarios = (
        "  support: {initial_harness: harness, recipe: recipe.yaml}\n"
        "  billing: {recipe: gone.yaml}\n"
    )
    code, lines = _reef(capsys, "serve", "-c", str(_config(folder, held_port, scenarios)))
    assert code == 2
    assert [line.split(":")[1].strip() for line in lines] == [
        "scenarios.support.initial_harness",
        "scenarios.support.recipe (recipe.yaml)",
        "scenarios.billing.recipe",
    ], lines
    assert all(line.startswith("error: ") for line in lines), lines


def test_a_valid_scenario_passes_the_checks(
    folder: Path, held_port: int, capsys: pytest.CaptureFixture[str]
) -> None:
    _harness(folder)
    _recipe(folder, GOOD_RECIPE)
    config = _config(
        folder, held_port, "  support: {initial_harness: harness, recipe: recipe.yaml}\n"
    )
    code, lines = _reef(capsys, "serve", "-c", str(config))
    # past every check, it stops only at the port the test holds
    assert code == 2 and len(lines) == 1 and str(held_port) in lines[0], lines
    assert "scenarios." not in lines[0], lines


def test_without_the_worker_recipes_are_not_read(
    folder: Path, held_port: int, capsys: pytest.CaptureFixture[str]
) -> None:
    config = _config(folder, held_port, "  support: {recipe: gone.yaml}\n")
    code, lines = _reef(capsys, "serve", "--no-worker", "-c", str(config))
    assert code == 2 and str(held_port) in lines[0] and "scenarios." not in lines[0], lines


def test_the_worker_checks_recipes_before_it_starts(
    folder: Path, held_port: int, capsys: pytest.CaptureFixture[str]
) -> None:
    config = _config(folder, held_port, "  support: {recipe: gone.yaml}\n")
    # a store it cannot open (under a file): a check that wrongly passes fails there
    # instead of looping
    (folder / "a-file").write_text("", encoding="utf-8")
    text = config.read_text(encoding="utf-8")
    unopenable = f"sqlite:///{folder / 'a-file' / 'reef.db'}"
    config.write_text(text.replace(f"sqlite:///{folder / 'reef.db'}", unopenable), "utf-8")
    code, lines = _reef(capsys, "worker", "-c", str(config))
    assert code == 2
    assert lines == [
        f"error: scenarios.support.recipe: file gone.yaml ({folder}/gone.yaml) does not exist"
    ]


def test_recipe_error_lines() -> None:
    listed = "invalid recipe r.yaml:\n  trigger: bad\n  learners: missing"
    assert recipe_error_lines(listed) == ["trigger: bad", "learners: missing"]
    nested = (
        "invalid recipe r.yaml:\n  gate.episodes.environment: Value error, invalid settings "
        "for environment 'python' at gate.episodes.environment:\n"
        "  gate.episodes.environment.toolset: Field required"
    )
    assert recipe_error_lines(nested) == ["gate.episodes.environment.toolset: Field required"]
    assert recipe_error_lines("recipe r.yaml is not valid YAML:\n  line 2") == [
        "recipe r.yaml is not valid YAML: line 2"
    ]
