"""The gate's holdout items: every held-out record with feedback, sampled without regard
to how the head did, each with the reference a grader gave."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from reef.core import new_id
from reef.evaluation import Provenance
from reef.experience import FeedbackDraft
from reef.learning.holdout import holdout_items
from reef.learning.recipes import parse_recipe
from reef.releases import ModelComponent, ReleaseManifest, RoutingComponent, TeacherEndpoint
from tests.learning.test_worker import SCENARIO, _draft, open_world


def test_holdout_items_are_an_unbiased_sample_with_references(tmp_path: Path) -> None:
    world = open_world(f"sqlite:///{tmp_path / 'reef.db'}", tmp_path)
    drafts = [_draft(f"ticket {n} {new_id()}") for n in range(200)]
    ids = world.store.write_records(drafts)
    for n, record_id in enumerate(ids):
        right = n % 2 == 0
        world.store.add_feedback(
            FeedbackDraft(
                scenario=SCENARIO,
                record_ids=(record_id,),
                score=1.0 if right else 0.0,
                feedback=None,
                correction=None if right else "billing",
                metadata={},
                principal=None,
                idempotency_key=None,
            )
        )
    recipe = parse_recipe(
        {
            "learners": [{"type": "fewshot"}],
            "selection": {"holdout_fraction": 0.5, "min_score": 0.5},
            "gate": {"holdout_limit": 30},
        }
    )
    items = holdout_items(world.store, world.chain, SCENARIO, recipe)
    assert len(items) == 30 and {item.suite for item in items} == {"holdout"}
    corrected = [item for item in items if item.reference == "billing"]
    served = [item for item in items if item.reference != "billing"]
    # both kinds, not the head's misses first (the selection's training priority), and
    # the recipe's min_score (a training filter) does not hide the head's misses
    assert corrected and served
    assert all(str(item.reference).startswith("re: ticket") for item in served)
    again = holdout_items(world.store, world.chain, SCENARIO, recipe)
    assert [item.id for item in again] == [item.id for item in items]


def test_a_teachers_answers_are_references_without_feedback(tmp_path: Path) -> None:
    world = open_world(f"sqlite:///{tmp_path / 'reef.db'}", tmp_path)
    teacher = TeacherEndpoint(upstream="frontier", model="big-1")
    routed = world.chain.create(
        "distilled",
        ReleaseManifest(
            model=ModelComponent(base="tiny"),
            routing=RoutingComponent(student_share=0.0, teacher=teacher),
        ),
        "test",
        "the teacher serves everything",
    )
    drafts = [replace(_draft(f"ticket {n} {new_id()}"), release_id=routed.id) for n in range(40)]
    drafts.append(_draft("before distillation"))  # the head's own model answered it
    shared = world.chain.create(
        "shared",
        routed.manifest.model_copy(
            update={"routing": RoutingComponent(student_share=0.5, teacher=teacher)}
        ),
        "test",
        "half the traffic to the student",
    )
    for arm in ("student", "teacher"):  # the gateway tags who answered a routed request
        tags = {"reef.served_by": arm}
        drafts.append(replace(_draft(f"{arm} {new_id()}"), release_id=shared.id, tags=tags))
    ids = world.store.write_records(drafts)
    wrong, fixed = ids[0], ids[1]
    for record_id, score, correction in ((wrong, 0.0, None), (fixed, 0.0, "billing")):
        world.store.add_feedback(
            FeedbackDraft(
                scenario=SCENARIO,
                record_ids=(record_id,),
                score=score,
                feedback=None,
                correction=correction,
                metadata={},
                principal=None,
                idempotency_key=None,
            )
        )
    gate = {"holdout_limit": 100, "holdout_teacher_references": True}
    recipe = parse_recipe(
        {"learners": [{"type": "fewshot"}], "selection": {"holdout_fraction": 1.0}, "gate": gate}
    )
    items = {item.id: item for item in holdout_items(world.store, world.chain, SCENARIO, recipe)}
    assert wrong not in items and ids[-3] not in items
    assert items[fixed].reference == "billing"
    assert ids[-2] not in items and items[ids[-1]].reference.startswith("re: teacher")
    assert len(items) == 40
    taught = [item for key, item in items.items() if key != fixed]
    assert all(str(item.reference).startswith("re: ") for item in taught)
    assert {item.provenance for item in taught} == {
        Provenance("holdout", "operator", ("teacher:frontier/big-1",))
    }
    # Off (the default): only the corrected record has a reference.
    off = {"holdout_teacher_references": False}
    recipe = recipe.model_copy(update={"gate": recipe.gate.model_copy(update=off)})
    found = holdout_items(world.store, world.chain, SCENARIO, recipe)
    assert [item.id for item in found] == [fixed]
