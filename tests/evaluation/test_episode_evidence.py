"""``gate.episodes``: its settings, the interleaved pairing of episodes, how episodes
become scored items and error checks, and their rows in the store on SQLite and
PostgreSQL."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from reef.environments import EpisodeResult, Score, Task, build_environment
from reef.evaluation.config import GateConfig
from reef.evaluation.decision import decide_results
from reef.evaluation.episode_evidence import (
    EpisodeRun,
    as_item_results,
    endpoint_for,
    episode_jobs,
    resolve_spec,
    select_tasks,
)
from reef.evaluation.gate import EvaluationFailedError, check_errors
from reef.evaluation.results import EvaluationStore
from reef.evaluation.runner import GatewayTarget
from reef.evaluation.suites import is_current_suite, is_episode_suite
from reef.evaluation.values import ItemResult
from reef.experience import Redactor, SQLExperienceStore
from tests.experience.conftest import pg_databases, pg_url, store_url  # noqa: F401

ORDERS = {"type": "python", "toolset": "orders"}


def config(**episodes: Any) -> GateConfig:
    return GateConfig(episodes={"environment": ORDERS, **episodes})


def task(n: int) -> Task:
    return Task(f"t{n}", ({"role": "user", "content": f"task {n}"},))


def run(task_id: str, arm: Any, repeat: int = 0, score: float = 1.0, **result: Any) -> EpisodeRun:
    fields: dict[str, Any] = {
        "task_id": task_id,
        "environment": "python",
        "session_id": f"s-{task_id}-{arm}-{repeat}",
        "stop": "finished",
        "score": Score(score, "scored"),
        "turns": 2,
        "tool_calls": 1,
        "tool_status": {"ok": 1},
        "truncated": 0,
        "seconds": 0.5,
        "messages": (
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "done"},
        ),
        "record_ids": ("r1", "r2"),
    }
    fields.update(result)
    return EpisodeRun("env:python", task_id, arm, repeat, f"rel-{arm}", EpisodeResult(**fields))


# -- settings --------------------------------------------------------------------------


def test_episodes_default_to_every_task_once() -> None:
    episodes = config().episodes
    assert episodes is not None
    assert (episodes.tasks, episodes.repeats) == ("all", 1)
    assert GateConfig().episodes is None


def test_limit_overrides_go_into_the_spec() -> None:
    episodes = config(max_turns=3, environment={**ORDERS, "limits": {"step_timeout_seconds": 2}})
    assert episodes.episodes is not None
    assert episodes.episodes.spec()["limits"] == {"step_timeout_seconds": 2, "max_turns": 3}


@pytest.mark.parametrize(
    ("episodes", "message"),
    [
        ({"environment": {"toolset": "orders"}}, "needs a 'type'"),
        ({"environment": {"type": "nowhere"}}, "unknown environment type 'nowhere'"),
        ({"environment": {**ORDERS, "toolsett": "x"}}, "unknown key"),
        ({"environment": ORDERS, "tasks": 0}, "at least 1"),
        ({"environment": ORDERS, "tasks": "some"}, "tasks"),
        ({"environment": ORDERS, "repeats": 0}, "repeats"),
        ({"environment": ORDERS, "max_turns": 0}, "max_turns"),
        ({"environment": ORDERS, "rounds": 2}, "rounds"),
    ],
)
def test_bad_episode_settings_are_refused(episodes: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        GateConfig(episodes=episodes)


def test_a_relative_tasks_path_is_the_recipes_and_tasks_can_be_capped(tmp_path: Path) -> None:
    lines = [f'{{"id": "t{n}", "prompt": "task {n}"}}' for n in range(5)]
    (tmp_path / "tasks.jsonl").write_text("\n".join(lines) + "\n")
    episodes = config(tasks=2, environment={**ORDERS, "tasks": "tasks.jsonl"}).episodes
    assert episodes is not None
    spec = resolve_spec(episodes, tmp_path)
    assert spec["tasks"] == str(tmp_path / "tasks.jsonl")
    assert [t.id for t in select_tasks(build_environment(spec), episodes)] == ["t0", "t1"]


# -- pairing ---------------------------------------------------------------------------


def test_episodes_interleave_candidate_and_head_per_task_and_repeat() -> None:
    jobs = episode_jobs([task(1), task(2)], {"baseline": "B", "candidate": "C"}, repeats=2)
    assert [(j.task.id, j.repeat, j.arm, j.release_id) for j in jobs] == [
        ("t1", 0, "candidate", "C"),
        ("t1", 0, "baseline", "B"),
        ("t1", 1, "candidate", "C"),
        ("t1", 1, "baseline", "B"),
        ("t2", 0, "candidate", "C"),
        ("t2", 0, "baseline", "B"),
        ("t2", 1, "candidate", "C"),
        ("t2", 1, "baseline", "B"),
    ]
    with pytest.raises(ValueError, match="repeats"):
        episode_jobs([task(1)], {"candidate": "C"}, repeats=0)


def test_an_episode_calls_the_gateway_pinned_with_purpose_eval() -> None:
    target = GatewayTarget(base_url="http://gw:8080/", scenario="shop", api_key="k")
    [job] = episode_jobs([task(1)], {"candidate": "C"}, repeats=1)
    endpoint = endpoint_for(target, job, {"max_tokens": 9})
    assert endpoint.chat_url == "http://gw:8080/v1/chat/completions"
    assert endpoint.model == "reef/shop" and endpoint.api_key == "k"
    assert endpoint.params == {"max_tokens": 9}
    assert endpoint.headers["x-reef-release"] == "C"
    assert endpoint.headers["x-reef-purpose"] == "eval"
    assert endpoint.headers["x-reef-scenario"] == "shop"
    assert "x-reef-session" not in endpoint.headers  # each episode gets its own


# -- scoring and errors ----------------------------------------------------------------


def test_episodes_are_scored_items_of_a_current_suite_but_no_regression_suite() -> None:
    assert is_current_suite("env:python") and is_episode_suite("env:python")
    assert not is_episode_suite("file:quiz")
    [result] = as_item_results([run("t1", "candidate", score=0.5)])
    assert (result.item_key, result.suite, result.score) == ("env:python/t1", "env:python", 0.5)
    assert result.output == "done" and result.record_id == "r2" and result.error is None
    assert result.details["stop"] == "finished" and result.details["turns"] == 2


def test_the_paired_bootstrap_decides_on_episode_scores() -> None:
    better = [run(f"t{n}", "candidate") for n in range(6)]
    worse = [run(f"t{n}", "baseline", score=float(n < 2)) for n in range(6)]
    rule = GateConfig(min_items=6, method="bootstrap")
    passed = decide_results(as_item_results([*better, *worse]), [], rule)
    assert passed.passed and passed.overall is not None and passed.overall.items == 6
    flipped = [
        EpisodeRun(
            r.suite,
            r.task_id,
            "baseline" if r.arm == "candidate" else "candidate",
            r.repeat,
            r.release_id,
            r.result,
        )
        for r in [*better, *worse]
    ]
    assert not decide_results(as_item_results(flipped), [], rule).passed


def test_failed_episodes_past_the_error_fraction_fail_the_evaluation() -> None:
    broken = run("t1", "candidate", score=0.0, stop="error", error="gateway answered 502")
    fine = [run(f"t{n}", "candidate") for n in range(2, 10)]
    check_errors([], 0.2, [broken, *fine])  # 1 of 9 is within 20%
    with pytest.raises(EvaluationFailedError, match="1 of 2 candidate episodes failed"):
        check_errors([], 0.2, [broken, fine[0]])
    environment = EpisodeRun("env:python", "t9", "baseline", 0, "B", None, "reset failed")
    assert environment.failed and environment.score == 0.0
    with pytest.raises(EvaluationFailedError, match="reset failed"):
        check_errors([], 0.0, [environment])
    # an episode that ran out of turns is evidence, not a failure
    check_errors([], 0.0, [run("t1", "candidate", score=0.0, stop="max_turns")])


@pytest.mark.parametrize(
    ("error", "kind"),
    [
        ("the model endpoint answered 400: messages.1: bad", "refused"),
        ("the model endpoint answered 429: slow down", "rate_limited"),
        ("the model endpoint answered 502: upstream down", "upstream_error"),
        ("the model did not answer within 30 s", "timeout"),
        (
            "could not reach http://127.0.0.1:9/v1/chat/completions: ClientConnectorError",
            "unreachable",
        ),
        ("something else went wrong", None),
    ],
)
def test_a_failed_episode_is_classified_from_its_error(error: str, kind: str | None) -> None:
    assert run("t1", "candidate", score=0.0, stop="error", error=error).error_kind == kind


def test_failed_episodes_are_transient_only_when_every_model_call_failed_transiently() -> None:
    slow = run(
        "t1", "candidate", score=0.0, stop="error", error="the model endpoint answered 503: busy"
    )
    with pytest.raises(EvaluationFailedError) as outage:
        check_errors([], 0.0, [slow])
    assert outage.value.transient and outage.value.kinds == {"upstream_error": 1}
    assert "upstream_error 1; first: item t1 (env:python): the model endpoint answered 503" in str(
        outage.value
    )
    environment = EpisodeRun("env:python", "t9", "candidate", 0, "C", None, "reset failed")
    with pytest.raises(EvaluationFailedError) as broken:
        check_errors([], 0.0, [slow, environment])
    assert not broken.value.transient
    assert broken.value.kinds == {"upstream_error": 1, "environment": 1}
    assert run("t1", "candidate", score=0.0, stop="max_turns").error_kind is None
    kinds = [r.details["error_kind"] for r in as_item_results([slow, environment])]
    assert kinds == ["upstream_error", "environment"]  # stored with the results


# -- the store -------------------------------------------------------------------------


def test_episodes_are_stored_and_read_back(store_url: str) -> None:  # noqa: F811
    store = SQLExperienceStore.from_url(store_url)
    try:
        evaluations = EvaluationStore(store.database)
        evaluation_id = evaluations.start("shop", "cand", "base", [], {}, "test")
        runs = [
            run("t2", "baseline", score=0.0, stop="max_turns", error="no final answer"),
            run("t1", "baseline"),
            run("t1", "candidate"),
            run("t2", "candidate", repeat=1),
            EpisodeRun("env:python", "t3", "candidate", 0, "cand", None, "reset failed"),
        ]
        evaluations.add_episodes(evaluation_id, runs)
        found = evaluations.episodes(evaluation_id)
        assert [(e.task_id, e.repeat, e.arm) for e in found] == [
            ("t1", 0, "candidate"),
            ("t1", 0, "baseline"),
            ("t2", 0, "baseline"),
            ("t2", 1, "candidate"),
            ("t3", 0, "candidate"),
        ]
        first = found[0]
        assert (first.score, first.stop, first.turns, first.tool_calls) == (1.0, "finished", 2, 1)
        assert first.session_id == "s-t1-candidate-0" and first.record_ids == ["r1", "r2"]
        assert first.messages[-1] == {"role": "assistant", "content": "done"}
        assert first.tool_status["ok"] == 1 and first.environment == "python"
        assert found[2].error == "no final answer" and found[2].stop == "max_turns"
        failed = found[4]
        assert (failed.stop, failed.score, failed.messages) == ("error", 0.0, [])
        assert failed.reason == "the environment failed: reset failed"
        one = evaluations.episodes(evaluation_id, "t1")
        assert [e.arm for e in one] == ["candidate", "baseline"]
        assert "messages" not in one[0].as_dict(messages=False)
        assert evaluations.episodes("nothing") == []
    finally:
        store.close()


def test_episodes_and_results_are_stored_redacted(store_url: str) -> None:  # noqa: F811
    """With ``capture.redact_patterns``' redactor, the conversation, error and reason of
    each episode and the output, error and details of each result are stored scrubbed."""
    store = SQLExperienceStore.from_url(store_url)
    try:
        evaluations = EvaluationStore(store.database, Redactor([r"sk-\w+"]))
        evaluation_id = evaluations.start("shop", "cand", "base", [], {}, "test")
        said = ({"role": "user", "content": "my key is sk-abc1"},)
        played = run("t1", "candidate", stop="max_turns", error="stuck on sk-abc2", messages=said)
        broken = EpisodeRun("env:python", "t2", "candidate", 0, "cand", None, "bad sk-abc3")
        evaluations.add_episodes(evaluation_id, [played, broken])
        answer = ItemResult(
            "s/1", "s", "candidate", 0, 0.5, "use sk-abc4", None, "sk-abc5", {"why": "sk-abc6"}
        )
        evaluations.add_results(evaluation_id, [answer])
        first, second = evaluations.episodes(evaluation_id)
        assert first.messages == [{"role": "user", "content": "my key is [REDACTED]"}]
        assert first.error == "stuck on [REDACTED]"
        assert second.error == "bad [REDACTED]" and second.reason is not None
        assert second.reason.endswith("bad [REDACTED]")
        (stored,) = evaluations.results(evaluation_id)
        assert (stored.output, stored.error) == ("use [REDACTED]", "[REDACTED]")
        assert stored.details == {"why": "[REDACTED]"}
    finally:
        store.close()
