"""``bench/rl.py``'s two sides without training them: the prompt TRL's ``GRPOTrainer``
samples from is the one Reef's engine serves, TRL's parser reads the calls Reef's format
writes, each rollout's shop keeps its own state, the reward is the ``orders`` toolset's
score, and ``--loss-type`` reaches Reef's spec or is refused with a message. The
figures of a run are in docs/benchmarks.md."""

from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from reef.environments import Task, build_environment

REPO = Path(__file__).resolve().parents[2]
pytest.importorskip("torch")
pytest.importorskip("trl")


def bench_module(name: str) -> ModuleType:
    """A script of bench/ as a module (they import their neighbours by name)."""
    if str(REPO / "bench") not in sys.path:
        sys.path.insert(0, str(REPO / "bench"))
    return importlib.import_module(name)


erl = bench_module("episode_rl")
bench = bench_module("rl")


def gate_tasks() -> list[Task]:
    return build_environment(erl.spec_for(erl.TASKS)).tasks()


def test_trl_samples_from_the_prompt_reef_serves(tmp_path: Path) -> None:
    from reef.engine.models import load_model

    task = gate_tasks()[0]
    tools = asyncio.run(bench.first_tools(task))
    served = bench.served_prompt(load_model("tiny-random", tmp_path).tokenizer, task, tools)
    tokenizer = bench.trl_tokenizer(load_model("tiny-random", tmp_path).tokenizer, tools)
    shop = bench.Shop()
    methods = [shop.lookup_order, shop.check_stock, shop.open_return]  # what TRL passes
    ours = tokenizer.apply_chat_template(
        list(task.messages), tools=methods, tokenize=False, add_generation_prompt=True
    )
    assert ours == served
    from trl.chat_template_utils import parse_response

    reply = '<tool_call>\n{"name": "lookup_order", "arguments": {"order_id": "A-1"}}\n</tool_call>'
    prefix = tokenizer(ours, add_special_tokens=False)["input_ids"]
    ids = tokenizer(reply + "<|im_end|>", add_special_tokens=False)["input_ids"]
    parsed = parse_response(tokenizer, ids, prefix=prefix, tools=methods)  # as TRL's loop
    assert [call["function"] for call in parsed["tool_calls"]] == [
        {"name": "lookup_order", "arguments": {"order_id": "A-1"}}
    ]


def play(shop: Any, task: Task, turns: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``turns`` played on ``shop`` as TRL's tool loop would: each call run, its result
    a tool message."""
    shop.reset(prompt=list(task.messages), task=json.dumps({"expected": task.expected,
                                                            "setup": task.setup}))  # fmt: skip
    messages: list[dict[str, Any]] = []
    for turn in turns:
        messages.append(turn)
        for call in turn.get("tool_calls") or ():
            function = call["function"]
            result = getattr(shop, function["name"])(**json.loads(function["arguments"]))
            messages.append({"role": "tool", "content": result})
    return messages


def test_each_rollout_has_its_own_shop_and_the_toolset_scores_it() -> None:
    returns = [t for t in gate_tasks() if t.expected.get("return_opened")][:2]
    assert len(returns) == 2
    right, idle = bench.Shop(), bench.Shop()
    done = play(right, returns[0], erl.right_turns(returns[0]))
    answer_only = [erl.right_turns(returns[1])[-1]]  # the answer, no return opened
    skipped = play(idle, returns[1], answer_only)
    assert bench.episode_reward([done, skipped], [right, idle]) == [1.0, 0.0]
    assert right.state["returns"] and not idle.state["returns"]


def test_loss_type_reaches_reefs_spec_or_is_refused_with_a_message(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from reef.learning.trainers.spec import RLSpec

    args = argparse.Namespace(
        model="tiny-random", home=tmp_path, work=tmp_path, group_size=2, batch_size=1,
        temperature=1.0, max_new_tokens=8, lr=1e-4, beta_kl=0.0, rl_steps=1, threads=1,
        seed=0, loss_type="no-such-loss",
    )  # fmt: skip
    environment = erl.spec_for(erl.TASKS)
    if "loss_type" in RLSpec.model_fields:
        with pytest.raises(SystemExit, match="no-such-loss"):
            bench.reef_spec(args, environment)
        return
    spec, loss = bench.reef_spec(args, environment)
    assert "no loss_type field" in loss and spec.group_size == 2
    assert "has no loss_type field" in capsys.readouterr().out
