"""THE CAS race: 8 publishers (threads, then processes) move one head at once.

Exactly one wins, the other 7 get ``ReleaseConflictError`` and write nothing, and the
chain stays linear: seq 1..n without gaps, each parent the previous release. The same
holds for 8 concurrent rollbacks and 8 concurrent adoptions of a configured model.
Both backends.
"""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from reef.releases import (
    Candidate,
    ModelComponent,
    Release,
    ReleaseChain,
    ReleaseConflictError,
    ReleaseManifest,
)
from tests.releases.conftest import ManifestFactory

RACERS = 8
WORKER = Path(__file__).with_name("race_worker.py")
ROOT = Path(__file__).resolve().parents[2]


def assert_linear(chain: ReleaseChain, scenario: str) -> list[Release]:
    chain_ = list(reversed(chain.releases(scenario, limit=1000)))
    assert [r.seq for r in chain_] == list(range(1, len(chain_) + 1))
    assert chain_[0].parent_id is None
    for previous, release in itertools.pairwise(chain_):
        assert release.parent_id == previous.id
    head = chain.head(scenario)
    assert head is not None and head.id == chain_[-1].id
    assert chain.heads_snapshot()[scenario] == (head.id, head.seq)
    return chain_


def passed_candidates(
    chain: ReleaseChain, head: Release, manifest: ManifestFactory, count: int
) -> list[Candidate]:
    found = []
    for n in range(count):
        c = chain.propose(head.scenario, manifest(adapter=n + 100), head.id, f"w{n}", "race")
        chain.set_candidate_state(c.id, "evaluating")
        found.append(chain.set_candidate_state(c.id, "passed"))
    return found


def check_outcome(
    chain: ReleaseChain, before: list[Release], outcomes: list[dict[str, Any]]
) -> Release:
    """One winner, seven conflicts naming the winner; the winner is the new head."""
    assert not [o for o in outcomes if "error" in o], outcomes
    winners = [o["won"] for o in outcomes if "won" in o]
    assert len(winners) == 1, outcomes
    assert [o["conflict"] for o in outcomes if "conflict" in o] == [winners[0]] * (RACERS - 1)
    after = assert_linear(chain, before[0].scenario)
    assert after[:-1] == before and after[-1].id == winners[0]
    return after[-1]


def race_threads(action: Callable[[int], Release]) -> list[dict[str, Any]]:
    barrier = threading.Barrier(RACERS)
    outcomes: list[dict[str, Any]] = [{} for _ in range(RACERS)]

    def racer(n: int) -> None:
        barrier.wait()
        try:
            outcomes[n] = {"won": action(n).id}
        except ReleaseConflictError as error:
            outcomes[n] = {"conflict": error.current}
        except Exception as error:
            outcomes[n] = {"error": repr(error)}

    threads = [threading.Thread(target=racer, args=(n,)) for n in range(RACERS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return outcomes


def test_racing_threads(store_url: str, manifest: ManifestFactory) -> None:
    # One chain per racer: separate engines and pools, as separate workers would have.
    chains = [ReleaseChain.from_url(store_url, migrate=False) for _ in range(RACERS)]
    chain = chains[0]
    try:
        root = chain.create("s", manifest(), "config", "init")
        head = chain.publish(
            passed_candidates(chain, root, manifest, 1)[0].id, root.id, "w", "warm-up"
        )
        racers = passed_candidates(chain, head, manifest, RACERS)
        before = assert_linear(chain, "s")
        outcomes = race_threads(lambda n: chains[n].publish(racers[n].id, head.id, f"w{n}", "race"))
        new_head = check_outcome(chain, before, outcomes)
        states = sorted(chain.get_candidate(c.id).state for c in racers)
        assert states == ["passed"] * (RACERS - 1) + ["published"]

        before = assert_linear(chain, "s")
        outcomes = race_threads(
            lambda n: chains[n].rollback("s", [root, head][n % 2].id, new_head.id, f"a{n}", "r")
        )
        check_outcome(chain, before, outcomes)
    finally:
        for each in chains:
            each.close()


def test_racing_adoptions_of_a_configured_model(store_url: str, manifest: ManifestFactory) -> None:
    # An operator's adopt-config racing others (or a publish): the head moves once.
    chains = [ReleaseChain.from_url(store_url, migrate=False) for _ in range(RACERS)]
    chain = chains[0]
    try:
        root = chain.create("s", manifest(), "config", "init")
        before = assert_linear(chain, "s")
        outcomes = race_threads(
            lambda n: chains[n].adopt(
                "s", ReleaseManifest(model=ModelComponent(base=f"m-{n}")), root.id, f"a{n}", "r"
            )
        )
        adopted = check_outcome(chain, before, outcomes)
        assert adopted.operation == "adopt" and adopted.manifest.model.base.startswith("m-")
    finally:
        for each in chains:
            each.close()


def test_concurrent_creators_make_exactly_one_release(
    store_url: str, manifest: ManifestFactory
) -> None:
    chains = [ReleaseChain.from_url(store_url, migrate=False) for _ in range(RACERS)]
    try:
        outcomes = race_threads(lambda n: chains[n].create("new", manifest(adapter=n), "c", "r"))
        assert len({o["won"] for o in outcomes}) == 1, outcomes
        assert len(assert_linear(chains[0], "new")) == 1
    finally:
        for each in chains:
            each.close()


@pytest.fixture
def workers(store_url: str) -> Iterator[list[subprocess.Popen[str]]]:
    """Eight worker processes connected to the store, each having printed ``ready``."""
    procs = [
        subprocess.Popen(
            [sys.executable, str(WORKER), store_url],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            cwd=ROOT,
        )
        for _ in range(RACERS)
    ]
    try:
        for proc in procs:
            assert proc.stdout is not None
            assert proc.stdout.readline().strip() == "ready"
        yield procs
    finally:
        for proc in procs:
            if proc.stdin is not None:
                proc.stdin.close()
        for proc in procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            if proc.stdout is not None:
                proc.stdout.close()


def race_processes(
    procs: list[subprocess.Popen[str]], commands: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    # Every racer is armed (its command read and parsed) before the one "go": imports,
    # connection setup and parsing are not part of the race.
    for proc, command in zip(procs, commands, strict=True):
        assert proc.stdin is not None
        proc.stdin.write(json.dumps(command) + "\n")
        proc.stdin.flush()
    for proc in procs:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "armed"
    for proc in procs:
        assert proc.stdin is not None
        proc.stdin.write("go\n")
        proc.stdin.flush()
    outcomes = []
    for proc in procs:
        assert proc.stdout is not None
        outcomes.append(json.loads(proc.stdout.readline()))
    return outcomes


def test_racing_processes(
    chain: ReleaseChain, manifest: ManifestFactory, workers: list[subprocess.Popen[str]]
) -> None:
    root = chain.create("s", manifest(), "config", "init")
    racers = passed_candidates(chain, root, manifest, RACERS)
    before = assert_linear(chain, "s")
    outcomes = race_processes(
        workers,
        [
            {"op": "publish", "candidate": c.id, "expected": root.id, "actor": f"p{n}"}
            for n, c in enumerate(racers)
        ],
    )
    new_head = check_outcome(chain, before, outcomes)

    before = assert_linear(chain, "s")
    outcomes = race_processes(
        workers,
        [
            {"op": "rollback", "scenario": "s", "to": root.id, "expected": new_head.id}
            | {"actor": f"p{n}"}
            for n in range(RACERS)
        ],
    )
    rolled = check_outcome(chain, before, outcomes)
    assert (rolled.operation, rolled.rolled_back_to) == ("rollback", root.id)
