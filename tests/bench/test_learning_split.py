"""``bench/learning.py`` holds out the same items on every run and for every recipe it
compares: the split goes by the session each request names, not by the record id the
gateway draws at random (which moved 11 of 159 label-map items between the splits from
one recipe's run to the next, and the two recipes trained on different data)."""

from __future__ import annotations

import random

import yaml

from bench import learning
from reef.learning.recipes import parse_recipe
from reef.learning.registry import LearnerRegistry
from reef.learning.selection import in_holdout


def test_every_compared_recipe_splits_by_the_traffic_session() -> None:
    for name, text in learning.RECIPES.items():
        capped = learning.with_sft_cap(text, 80).replace("MODEL", "tiny-random")
        recipe = parse_recipe(yaml.safe_load(capped), name, LearnerRegistry())
        assert recipe.selection.holdout_key == "session", name
        assert recipe.selection.holdout_fraction == 0.2


def test_the_traffic_sessions_fix_the_split_of_the_label_map() -> None:
    task = learning.TASKS["label_map"]
    items = task.make(240, random.Random(7))
    sessions = [learning.traffic_session(task, index) for index in range(len(items))]
    assert len(set(sessions)) == len(items)
    assert sessions == [learning.traffic_session(task, i) for i in range(len(items))]
    # Selection keeps the newest of equal examples: the last session of each prompt.
    last = {prompt: session for (prompt, _), session in zip(items, sessions, strict=True)}
    held = [session for session in last.values() if in_holdout(session, 0.2)]
    assert (len(last) - len(held), len(held)) == (133, 26)
