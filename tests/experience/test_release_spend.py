"""``spend_by_release`` and ``spend_by_key``: the records' own costs summed per release,
or per scenario, key and purpose, in the store (one ``GROUP BY``), unpriced records
counted, pending and older ones left out; on both backends."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from reef.experience import SQLExperienceStore, spend_by_key, spend_by_release
from tests.cli.test_costs import _draft


def test_each_release_and_key_costs_what_its_records_cost(store: SQLExperienceStore) -> None:
    now = datetime.now(UTC)
    store.write_records(
        [
            _draft(1, "support", "ci", cost=0.5, release_id="rel-a"),
            _draft(2, "support", None, cost=0.25, release_id="rel-a", purpose="eval"),
            _draft(3, "support", "ci", cost=None, release_id="rel-a"),  # unpriced
            _draft(4, "support", "ci", cost=2.0, release_id="rel-b"),
            _draft(5, "claude", "ci", cost=None),  # no release, unpriced
            _draft(6, "support", "ci", cost=9.0, release_id="rel-b", status="pending"),
            _draft(
                7,
                "support",
                "ci",
                cost=50.0,
                release_id="rel-a",
                created_at=now - timedelta(days=40),
            ),
        ]
    )
    rows = spend_by_release(store.database, now - timedelta(days=30))
    assert [(r.scenario, r.release, r.requests, r.unpriced, r.cost) for r in rows] == [
        ("support", "rel-b", 1, 0, 2.0),
        ("support", "rel-a", 3, 1, 0.75),
        ("claude", None, 1, 1, 0.0),
    ]
    assert spend_by_release(store.database, now + timedelta(days=1)) == []
    keys = spend_by_key(store.database, now - timedelta(days=30))
    assert [(r.scenario, r.key, r.purpose, r.requests, r.unpriced, r.cost) for r in keys] == [
        ("support", "ci", "serve", 3, 1, 2.5),
        ("support", None, "eval", 1, 0, 0.25),
        ("claude", "ci", "serve", 1, 1, 0.0),
    ]
    assert spend_by_key(store.database, now + timedelta(days=1)) == []
