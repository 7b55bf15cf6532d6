"""The learning job queue: claims with leases, on SQLite and PostgreSQL."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone

import pytest

from reef.core.errors import InvalidInputError
from reef.experience import SQLExperienceStore
from reef.jobs import (
    Job,
    JobCancelledError,
    JobNotFoundError,
    JobQueue,
    LeaseLostError,
)
from tests.experience.conftest import DraftFactory, make_draft  # noqa: F401 - fixture
from tests.fakes.clock import FakeClock
from tests.releases.conftest import pg_databases, pg_url, store_url  # noqa: F401 - fixtures


@pytest.fixture
def store(store_url: str) -> Iterator[SQLExperienceStore]:  # noqa: F811
    store = SQLExperienceStore.from_url(store_url)
    yield store
    store.close()


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def queue(store: SQLExperienceStore, clock: FakeClock) -> JobQueue:
    return JobQueue(store.database, clock=clock)


def test_enqueue_claim_complete(queue: JobQueue) -> None:
    job = queue.enqueue("support", "learn", {"trigger": "manual"})
    assert (job.state, job.attempt, job.input) == ("queued", 0, {"trigger": "manual"})
    claimed = queue.claim("w1", lease_seconds=30)
    assert claimed is not None and claimed.id == job.id
    assert (claimed.state, claimed.lease_owner, claimed.attempt) == ("running", "w1", 1)
    assert queue.claim("w2", lease_seconds=30) is None
    queue.progress(job.id, "w1", 0.5, "halfway", {"loss": 1.5})
    queue.log(job.id, "w1", "a line")
    shown = queue.get(job.id)
    assert (shown.progress, shown.message, shown.metrics) == (0.5, "halfway", {"loss": 1.5})
    assert shown.logs == ["halfway", "a line"]
    done = queue.complete(job.id, "w1", {"outcome": "proposed"})
    assert (done.state, done.result, done.lease_owner, done.progress) == (
        "succeeded",
        {"outcome": "proposed"},
        None,
        1.0,
    )
    assert done.as_dict()["state"] == "succeeded"


def test_never_two_active_jobs_per_scenario(queue: JobQueue) -> None:
    first = queue.enqueue("support", "learn", {})
    assert queue.enqueue("support", "learn", {"again": True}).id == first.id
    other = queue.enqueue("billing", "learn", {})
    assert other.id != first.id
    claimed = queue.claim("w1", 30)
    assert claimed is not None and claimed.id == first.id
    assert queue.enqueue("support", "learn", {}).id == first.id  # running counts too
    queue.complete(first.id, "w1", {})
    assert queue.enqueue("support", "learn", {}).id != first.id


def test_claim_skips_a_scenario_that_is_running(queue: JobQueue) -> None:
    first = queue.enqueue("support", "learn", {})
    second = queue.enqueue("support", "learn", {}, dedupe_running=False)
    assert queue.claim("w1", 30) is not None
    assert queue.claim("w2", 30) is None  # same scenario: waits for the first
    queue.complete(first.id, "w1", {})
    claimed = queue.claim("w2", 30)
    assert claimed is not None and claimed.id == second.id


def test_expired_lease_is_claimed_again_with_attempt_two(queue: JobQueue, clock: FakeClock) -> None:
    job = queue.enqueue("support", "learn", {})
    assert queue.claim("dead", lease_seconds=10) is not None
    clock.advance(10)
    assert queue.claim("w2", lease_seconds=30) is None  # expires after, not at, its end
    clock.advance(0.001)
    again = queue.claim("w2", lease_seconds=30)
    assert again is not None and (again.id, again.attempt, again.lease_owner) == (
        job.id,
        2,
        "w2",
    )
    with pytest.raises(LeaseLostError, match="'w2' holds it now"):
        queue.heartbeat(job.id, "dead", 30)
    with pytest.raises(LeaseLostError):
        queue.complete(job.id, "dead", {})
    assert queue.heartbeat(job.id, "w2", 30).lease_owner == "w2"


def test_heartbeat_extends_the_lease(queue: JobQueue, clock: FakeClock) -> None:
    job = queue.enqueue("support", "learn", {})
    claimed = queue.claim("w1", lease_seconds=1)
    assert claimed is not None and claimed.lease_until == clock() + timedelta(seconds=1)
    clock.advance(0.5)
    extended = queue.heartbeat(job.id, "w1", lease_seconds=1)
    assert extended.lease_until == clock() + timedelta(seconds=1)
    clock.advance(0.9)  # past the first lease, within the extended one
    assert queue.claim("w2", lease_seconds=1) is None
    clock.advance(0.2)
    taken = queue.claim("w2", lease_seconds=1)
    assert taken is not None and taken.lease_owner == "w2"


def test_leases_compare_in_utc_whatever_the_clocks_timezone(
    store: SQLExperienceStore, clock: FakeClock
) -> None:
    # A lease written through a clock five hours east of UTC and read through a UTC one:
    # both backends store and compare the instant, not the wall-clock digits.
    east = JobQueue(store.database, clock=lambda: clock().astimezone(timezone(timedelta(hours=5))))
    utc = JobQueue(store.database, clock=clock)
    job = east.enqueue("support", "learn", {})
    claimed = east.claim("east", lease_seconds=60)
    assert claimed is not None and claimed.lease_until == clock() + timedelta(seconds=60)
    clock.advance(59)
    assert utc.claim("utc", lease_seconds=60) is None
    clock.advance(2)
    again = utc.claim("utc", lease_seconds=60)
    assert again is not None and (again.id, again.attempt) == (job.id, 2)


def test_a_naive_clock_is_refused(store: SQLExperienceStore) -> None:
    naive = JobQueue(store.database, clock=lambda: datetime(2026, 1, 1))
    naive.enqueue("support", "learn", {})
    with pytest.raises(InvalidInputError, match="timezone-aware"):
        naive.claim("w1", lease_seconds=30)


def test_attempts_are_capped(store: SQLExperienceStore, clock: FakeClock) -> None:
    queue = JobQueue(store.database, max_attempts=2, clock=clock)
    job = queue.enqueue("support", "learn", {})
    for owner in ("w1", "w2"):
        assert queue.claim(owner, lease_seconds=30) is not None
        clock.advance(31)
    assert queue.claim("w3", 30) is None
    failed = queue.get(job.id)
    assert failed.state == "failed" and "giving up" in (failed.error or "")


def test_fail_with_and_without_retry(queue: JobQueue) -> None:
    job = queue.enqueue("support", "learn", {})
    queue.claim("w1", 30)
    retried = queue.fail(job.id, "w1", "flaky", retry=True)
    assert (retried.state, retried.error, retried.lease_owner) == ("queued", "flaky", None)
    queue.claim("w1", 30)
    failed = queue.fail(job.id, "w1", "broken recipe", retry=False)
    assert failed.state == "failed"


def test_cancel(queue: JobQueue) -> None:
    queued = queue.enqueue("a", "learn", {})
    assert queue.cancel(queued.id).state == "cancelled"
    running = queue.enqueue("b", "learn", {})
    queue.claim("w1", 30)
    assert queue.cancel(running.id).state == "cancelled"
    with pytest.raises(JobCancelledError):
        queue.heartbeat(running.id, "w1", 30)
    with pytest.raises(JobNotFoundError):
        queue.cancel("nope")


def test_list_filters(queue: JobQueue) -> None:
    a = queue.enqueue("a", "learn", {})
    b = queue.enqueue("b", "learn", {})
    assert [j.id for j in queue.list()] == [b.id, a.id]
    assert [j.id for j in queue.list(scenario="a")] == [a.id]
    assert queue.list(state="running") == []
    assert queue.last_job("b") == queue.get(b.id)
    with pytest.raises(InvalidInputError):
        queue.list(state="bogus")


def test_consumed_ids(queue: JobQueue) -> None:
    job = queue.enqueue("support", "learn", {})
    queue.claim("w1", 30)
    queue.record_consumed(job.id, ["r1", "r2", "r1"])
    queue.record_consumed(job.id, ["r2"])  # idempotent
    assert queue.consumed_by(job.id) == {"r1", "r2"}
    assert queue.consumed_ids("support") == set()  # not succeeded yet
    queue.complete(job.id, "w1", {})
    assert queue.consumed_ids("support") == {"r1", "r2"}
    assert queue.consumed_ids("support", candidates=set()) == set()  # no candidate
    assert queue.consumed_ids("other") == set()


def test_consumed_ids_of_jobs_whose_candidate_is_named(queue: JobQueue) -> None:
    for records, candidate in ((["r1"], "c1"), (["r2"], "c2")):
        queue.enqueue("support", "learn", {})
        job = queue.claim("w1", 30)
        assert job is not None
        queue.set_candidate(job.id, "w1", candidate)
        queue.record_consumed(job.id, records)
        queue.complete(job.id, "w1", {})
    assert queue.consumed_ids("support") == {"r1", "r2"}
    assert queue.consumed_ids("support", candidates={"c1"}) == {"r1"}
    assert queue.consumed_ids("support", candidates=["c1", "c2"]) == {"r1", "r2"}


def test_eight_concurrent_claimers_get_distinct_jobs(store_url: str) -> None:  # noqa: F811
    stores = [SQLExperienceStore.from_url(store_url) for _ in range(8)]
    try:
        setup = JobQueue(stores[0].database)
        ids = {setup.enqueue(f"s{n}", "learn", {}).id for n in range(12)}
        barrier = threading.Barrier(8)
        got: list[Job] = []
        errors: list[BaseException] = []
        lock = threading.Lock()

        def claimer(queue: JobQueue, owner: str) -> None:
            try:
                barrier.wait()
                while (job := queue.claim(owner, 30)) is not None:
                    with lock:
                        got.append(job)
            except BaseException as error:
                errors.append(error)

        threads = [
            threading.Thread(target=claimer, args=(JobQueue(s.database), f"w{n}"))
            for n, s in enumerate(stores)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert errors == []
        assert sorted(j.id for j in got) == sorted(ids)  # each exactly once
        assert all(j.attempt == 1 for j in got)
    finally:
        for s in stores:
            s.close()
