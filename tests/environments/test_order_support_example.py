"""examples/order-support is real: its recipe and play.py open with the command that
runs them, the recipe validates, its gate's tasks file resolves next to it and loads in
the ``python`` environment's ``orders`` toolset, and every task's ``expected`` can be
met — a scripted right run of each scores 1 — and tells a wrong run apart (a scripted
wrong run of each kind of task scores 0, for the reason the toolset gives). play.py
plays them all against an endpoint."""

from __future__ import annotations

import importlib.util
import re
from collections.abc import Iterator, Sequence
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from reef.environments import EpisodeResult, Task, build_environment, play_episode
from reef.learning import LearnerRegistry, load_recipe
from reef.learning.recipes import Recipe
from tests.environments.episodes import endpoint
from tests.fakes.scripted import ScriptedChatThread, calls, tool_call

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "order-support"
RECIPE = EXAMPLE / "recipe.yaml"
CHECKS = {"return_opened", "no_return", "answer_contains"}  # what orders.score reads
ORDER_ID = re.compile(r"\b[A-Z]-[0-9A-Z]{5}\b")
TRAIN_TASKS = EXAMPLE / "train-tasks.jsonl"


@cache
def recipe() -> Recipe:
    return load_recipe(RECIPE)


def spec() -> dict[str, Any]:
    episodes = recipe().gate.episodes
    assert episodes is not None
    return episodes.spec()


@cache
def tasks() -> dict[str, Task]:
    return {task.id: task for task in build_environment(spec()).tasks()}


@pytest.fixture(scope="module")
def model() -> Iterator[ScriptedChatThread]:
    with ScriptedChatThread() as server:
        yield server


async def play(model: ScriptedChatThread, task_id: str, script: Sequence[Any]) -> EpisodeResult:
    """``task_id`` played in a fresh environment of the recipe's spec by ``script``."""
    model.script = list(script)
    async with build_environment(spec()) as env:
        result = await play_episode(env, tasks()[task_id], endpoint(model.base_url))
    assert model.script == [], "the episode ended before its script did"
    assert result.stop == "finished", (result.stop, result.error)
    return result


def test_the_recipe_opens_with_its_command_and_validates() -> None:
    text = RECIPE.read_text(encoding="utf-8")
    first_line = text.splitlines()[0]
    assert first_line.startswith("# reef learn ")
    assert "--recipe examples/order-support/recipe.yaml" in first_line
    found = recipe()
    assert found.name == "order-support"
    # the learners' settings fit (each learner's own model, where it imports here)
    real = LearnerRegistry()
    for index, learner in enumerate(found.learners):
        if importlib.util.find_spec(f"reef.learning.learners.{learner.type}") is not None:
            real.build(learner.type, learner.settings(), f"learners[{index}]")
    # sft, then rl over episodes of its own tasks (never the gate's), resolved next to it
    assert [learner.type for learner in found.learners] == ["sft", "rl"]
    rl_environment = found.learners[1].settings()["environment"]
    assert rl_environment["tasks"] == str(TRAIN_TASKS)
    trained = {task.id for task in build_environment(rl_environment).tasks()}
    assert len(trained) == 12 and not trained & set(tasks())
    # the gate plays the orders toolset on the tasks file next to the recipe
    gate = found.gate
    assert gate.holdout is False and gate.suites == []
    assert gate.episodes is not None and gate.episodes.tasks == "all"
    environment = spec()
    assert (environment["type"], environment["toolset"]) == ("python", "orders")
    assert environment["tasks"] == str((EXAMPLE / "tasks.jsonl").resolve())
    assert environment["limits"]["max_turns"] == gate.episodes.max_turns


def test_the_tasks_load_and_cover_the_shop() -> None:
    loaded = tasks()
    assert 12 <= len(loaded) <= 20
    assert recipe().gate.min_items <= len(loaded)
    kinds = {name.split("-")[0] for name in loaded}
    assert {"return", "past", "not", "cancelled", "status", "stock", "unknown"} <= kinds
    for task in loaded.values():
        assert task.expected and set(task.expected) <= CHECKS, task.id
        assert ("return_opened" in task.expected) != bool(task.expected.get("no_return"))
        assert task.expected["answer_contains"], task.id
        orders = task.setup["orders"]
        wanted = task.expected.get("return_opened")
        if wanted is not None:  # a return the toolset will open: delivered, in the window
            order = orders[wanted]
            assert order["status"] == "delivered" and order["days_since_delivery"] <= 30


def _user_text(task: Task) -> str:
    return " ".join(str(m["content"]) for m in task.messages if m["role"] == "user")


def right_run(task: Task) -> list[dict[str, Any]]:
    """A run that does what the task asks: look up every order the customer names and
    check every item of the shop's stock they name, open the expected return, and answer
    with what the answer must hold."""
    text = _user_text(task)
    looked = [
        tool_call(f"o{n}", "lookup_order", {"order_id": order})
        for n, order in enumerate(ORDER_ID.findall(text))
    ]
    looked += [
        tool_call(f"s{n}", "check_stock", {"item": item})
        for n, item in enumerate(task.setup.get("stock", {}))
        if item in text
    ]
    script = [calls(*looked)] if looked else []
    wanted = task.expected.get("return_opened")
    if wanted is not None:
        script.append(calls(tool_call("r", "open_return", {"order_id": wanted, "reason": "asked"})))
    script.append({"content": "Done: " + ", ".join(task.expected["answer_contains"]) + "."})
    return script


def right_agent(body: dict[str, Any]) -> dict[str, Any]:
    """A scripted model's next message: the right run's, for the task the conversation
    opens with (system messages aside)."""
    said = [m for m in body.get("messages") or [] if m.get("role") != "system"]
    for task in tasks().values():
        if said[: len(task.messages)] == list(task.messages):
            turn = sum(m.get("role") == "assistant" for m in said[len(task.messages) :])
            return right_run(task)[turn]
    raise AssertionError(f"no task opens this conversation: {said[:1]}")


@pytest.mark.parametrize("task_id", sorted(tasks()))
async def test_a_right_run_of_every_task_scores_1(model: ScriptedChatThread, task_id: str) -> None:
    result = await play(model, task_id, right_run(tasks()[task_id]))
    assert (result.score.value, result.score.reason) == (1.0, "every expected check holds")
    assert result.tool_status.get("malformed", 0) == 0


def lookup(order: str, call_id: str = "a") -> dict[str, Any]:
    return calls(tool_call(call_id, "lookup_order", {"order_id": order}))


def open_return(order: str, call_id: str = "b") -> dict[str, Any]:
    return calls(tool_call(call_id, "open_return", {"order_id": order, "reason": "customer"}))


def say(text: str) -> dict[str, Any]:
    return {"content": text}


# task, a right run, a wrong run and why the wrong one scores 0
CASES = {
    "return-damaged-kettle": (
        [lookup("A-10432"), open_return("A-10432"), say("Your return R-A-10432 is open.")],
        # claims the return without opening it
        [lookup("A-10432"), say("Your return R-A-10432 is open.")],
        "no return was opened for A-10432",
    ),
    "past-window-blender": (
        [lookup("A-10288"), say("A-10288 arrived 45 days ago, past our 30-day return window.")],
        # the tool refuses the return; the agent says it is open anyway
        [lookup("A-10288"), open_return("A-10288"), say("Your return is open.")],
        "the answer lacks '30'",
    ),
    "not-delivered-shipped": (
        [lookup("H-40663"), say("H-40663 has shipped; once it arrives you can return it.")],
        # answers without looking
        [say("I have cancelled that order for you.")],
        "the answer lacks 'shipped'",
    ),
    "status-delivered": (
        [lookup("G-87345"), say("Yes, G-87345 was delivered yesterday.")],
        # opens a return nobody asked for
        [lookup("G-87345"), open_return("G-87345"), say("It was delivered; return R-G-87345.")],
        "a return was opened for G-87345 though none should be",
    ),
    "stock-count": (
        [
            calls(tool_call("a", "check_stock", {"item": "webcam"})),
            say("We have 12 webcams in stock."),
        ],
        [say("Yes, plenty in stock!")],  # guesses
        "the answer lacks '12'",
    ),
    "unknown-order-typo": (
        [lookup("A-1O432"), say("I could not find order A-1O432. Could you check the number?")],
        # guesses the order it resembles and returns that one
        [lookup("A-1O432"), open_return("A-10432"), say("Your return R-A-10432 is open.")],
        "a return was opened for A-10432 though none should be; the answer lacks 'find'",
    ),
    "return-one-of-two-orders": (
        [
            calls(
                tool_call("a", "lookup_order", {"order_id": "E-70211"}),
                tool_call("b", "lookup_order", {"order_id": "E-70388"}),
            ),
            open_return("E-70211", "c"),
            say("Return R-E-70211 is open; E-70388 is past the 30-day return window."),
        ],
        # gives up on both because one is too old
        [lookup("E-70388"), say("Sorry, your orders are past the 30-day return window.")],
        "no return was opened for E-70211; the answer lacks 'R-E-70211'",
    ),
}


@pytest.mark.parametrize("task_id", sorted(CASES))
async def test_a_right_run_scores_1_and_a_wrong_run_0(
    model: ScriptedChatThread, task_id: str
) -> None:
    right, wrong, why = CASES[task_id]
    good = await play(model, task_id, right)
    assert (good.score.value, good.score.reason) == (1.0, "every expected check holds")
    bad = await play(model, task_id, wrong)
    assert (bad.score.value, bad.score.reason) == (0.0, why)


def test_play_py_plays_every_task_against_an_endpoint(capsys: pytest.CaptureFixture[str]) -> None:
    path = EXAMPLE / "play.py"
    first_line = path.read_text(encoding="utf-8").splitlines()[0]
    assert first_line.startswith("# python examples/order-support/play.py --base-url ")
    loaded = importlib.util.spec_from_file_location("order_support_play", path)
    assert loaded is not None and loaded.loader is not None
    play_py = importlib.util.module_from_spec(loaded)
    loaded.loader.exec_module(play_py)
    with ScriptedChatThread([right_agent] * len(tasks()) * 4) as server:
        assert play_py.main(["--base-url", server.base_url, "--model", "m"]) == 0
        # each episode asks as the gate would: the recipe's reply cap, purpose eval
        assert {r["max_tokens"] for r in server.requests} == {recipe().gate.max_tokens}
        assert {h["x-reef-purpose"] for h in server.headers} == {"eval"}
    lines = capsys.readouterr().out.splitlines()
    assert lines[-1] == f"{len(tasks())}/{len(tasks())} tasks done right"
    assert len(lines) == len(tasks()) + 1
    assert all(line.startswith("1  ") for line in lines[:-1])


@cache
def train_tasks() -> dict[str, Task]:
    spec = {"type": "python", "toolset": "orders", "tasks": str(TRAIN_TASKS)}
    return {task.id: task for task in build_environment(spec).tasks()}


@pytest.mark.parametrize("task_id", sorted(train_tasks()))
async def test_a_right_run_of_every_rl_training_task_scores_1(
    model: ScriptedChatThread, task_id: str
) -> None:
    task = train_tasks()[task_id]
    model.script = right_run(task)
    async with build_environment(spec()) as env:
        result = await play_episode(env, task, endpoint(model.base_url))
    assert model.script == [] and result.stop == "finished"
    assert (result.score.value, result.score.reason) == (1.0, "every expected check holds")
