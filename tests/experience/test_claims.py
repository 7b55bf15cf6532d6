"""Idempotency claims on SQLite and PostgreSQL: one claimant per key, however many
claim at once; a claim of a dead owner (its lease ran out) is taken over; only its
owner releases a claim."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta

import pytest

from reef.db import open_database
from reef.experience import Claim, IdempotencyClaims

LEASE = timedelta(seconds=30)
T0 = datetime(2026, 12, 5, 10, 0, 0, tzinfo=UTC)


class Clock:
    """A clock the test moves (no sleeps)."""

    def __init__(self, now: datetime = T0) -> None:
        self.now = now

    def __call__(self) -> datetime:
        return self.now


@pytest.fixture
def claims(store_url: str) -> Iterator[IdempotencyClaims]:
    database = open_database(store_url)
    yield IdempotencyClaims(database, Clock())
    database.close()


def _clock(claims: IdempotencyClaims) -> Clock:
    assert isinstance(claims.clock, Clock)
    return claims.clock


def test_the_first_claimant_holds_the_key_and_others_see_its_claim(
    claims: IdempotencyClaims,
) -> None:
    mine = claims.claim("support", "k1", "hash-a", "gw-1/rec-1", LEASE)
    assert mine == Claim("support", "k1", "hash-a", "gw-1/rec-1", T0, T0 + LEASE)
    # the same request from another gateway, and another request: both see the claim
    assert claims.claim("support", "k1", "hash-a", "gw-2/rec-2", LEASE) == mine
    assert claims.claim("support", "k1", "hash-b", "gw-2/rec-3", LEASE) == mine
    assert claims.held("support", "k1") == mine
    # keys are per scenario
    other = claims.claim("billing", "k1", "hash-b", "gw-2/rec-4", LEASE)
    assert other.owner == "gw-2/rec-4"


def test_many_claimants_at_once_leave_exactly_one_owner(claims: IdempotencyClaims) -> None:
    owners = [f"gw-{n}/rec-{n}" for n in range(16)]
    with ThreadPoolExecutor(16) as pool:
        got = list(
            pool.map(lambda owner: claims.claim("support", "race", "h", owner, LEASE), owners)
        )
    winners = {claim.owner for claim in got}
    assert len(winners) == 1
    (winner,) = winners
    assert winner in owners
    assert claims.held("support", "race") == got[0]


def test_only_the_owner_releases_and_the_key_is_then_free(claims: IdempotencyClaims) -> None:
    claims.claim("support", "k2", "h", "gw-1/rec-1", LEASE)
    assert not claims.release("support", "k2", "gw-2/rec-2")
    assert claims.held("support", "k2") is not None
    assert claims.release("support", "k2", "gw-1/rec-1")
    assert claims.held("support", "k2") is None
    assert not claims.release("support", "k2", "gw-1/rec-1")  # released once
    assert claims.claim("support", "k2", "h", "gw-2/rec-3", LEASE).owner == "gw-2/rec-3"


def test_a_claim_whose_lease_ran_out_is_taken_over(claims: IdempotencyClaims) -> None:
    clock = _clock(claims)
    dead = claims.claim("support", "k3", "h", "gw-dead/rec-1", LEASE)
    clock.now = T0 + LEASE - timedelta(microseconds=1)  # still live: waited for
    assert claims.claim("support", "k3", "h", "gw-2/rec-2", LEASE) == dead
    clock.now = T0 + LEASE  # its owner would have given up by now
    taken = claims.claim("support", "k3", "h", "gw-2/rec-2", LEASE)
    assert taken == Claim("support", "k3", "h", "gw-2/rec-2", clock.now, clock.now + LEASE)
    # the dead owner, back, can neither release nor take the new owner's claim
    assert not claims.release("support", "k3", "gw-dead/rec-1")
    assert claims.claim("support", "k3", "h", "gw-dead/rec-1", LEASE) == taken
    assert claims.held("support", "k3") == taken


def test_an_expired_claim_is_taken_over_by_one_of_many(claims: IdempotencyClaims) -> None:
    clock = _clock(claims)
    claims.claim("support", "k4", "h", "gw-dead/rec-1", LEASE)
    clock.now = T0 + 2 * LEASE
    owners = [f"gw-{n}/rec-{n}" for n in range(12)]
    with ThreadPoolExecutor(12) as pool:
        got = list(pool.map(lambda owner: claims.claim("support", "k4", "h", owner, LEASE), owners))
    assert len({claim.owner for claim in got}) == 1
    assert got[0].owner in owners and got[0].expires_at == clock.now + LEASE


def test_a_claim_taken_over_for_another_request_names_it(claims: IdempotencyClaims) -> None:
    clock = _clock(claims)
    claims.claim("support", "k5", "hash-a", "gw-dead/rec-1", LEASE)
    clock.now = T0 + LEASE + timedelta(seconds=1)
    taken = claims.claim("support", "k5", "hash-b", "gw-2/rec-2", LEASE)
    assert taken.request_hash == "hash-b" and taken.owner == "gw-2/rec-2"
