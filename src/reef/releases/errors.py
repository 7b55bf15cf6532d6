"""Errors of the release chain, each refining one ``reef.core.errors`` category."""

from __future__ import annotations

from reef.core.errors import ConflictError, NotFoundError


class ReleaseNotFoundError(NotFoundError):
    """No release with this id (in this scenario, where one was named)."""

    def __init__(self, release_id: str, scenario: str | None = None) -> None:
        where = f" in scenario {scenario!r}" if scenario is not None else ""
        super().__init__(f"release {release_id!r} not found{where}")
        self.release_id = release_id
        self.scenario = scenario


class ScenarioNotFoundError(NotFoundError):
    """The store knows no scenario of this name (no release, no record)."""

    def __init__(self, scenario: str) -> None:
        super().__init__(f"scenario {scenario!r} not found in the store")
        self.scenario = scenario


class ScenarioInUseError(ConflictError):
    """A scenario holds something that deleting it would drop (records, candidates, jobs,
    evaluations, stored responses, learned releases): it is kept."""

    def __init__(self, scenario: str, holds: list[str]) -> None:
        super().__init__(
            f"scenario {scenario!r} holds {', '.join(holds)}: deleting it would drop them, so "
            "it is kept (the dashboard folds away scenarios the configuration does not name "
            "that never learned)"
        )
        self.scenario = scenario
        self.holds = holds


class CandidateNotFoundError(NotFoundError):
    """No candidate with this id."""

    def __init__(self, candidate_id: str) -> None:
        super().__init__(f"candidate {candidate_id!r} not found")
        self.candidate_id = candidate_id


class ScenarioHasNoReleaseError(NotFoundError):
    """The scenario has no head yet: ``ReleaseChain.create`` must run first."""

    def __init__(self, scenario: str) -> None:
        super().__init__(f"scenario {scenario!r} has no release yet; create it first")
        self.scenario = scenario


class ReleaseConflictError(ConflictError):
    """The head is not the one the caller expected: someone else moved it first.

    ``current`` names the head at the time of the failed attempt (None: no head). Nothing
    was written; re-read the head and decide again.
    """

    def __init__(self, scenario: str, expected: str, current: str | None) -> None:
        now = f"is {current!r}" if current is not None else "does not exist"
        super().__init__(
            f"head of scenario {scenario!r} moved: expected {expected!r}, the head {now}"
        )
        self.scenario = scenario
        self.expected = expected
        self.current = current


class InvalidTransitionError(ConflictError):
    """A candidate cannot go from its stored state to the requested one."""

    def __init__(self, candidate_id: str, current: str, wanted: str, why: str = "") -> None:
        detail = f": {why}" if why else ""
        super().__init__(
            f"candidate {candidate_id!r} cannot go from {current!r} to {wanted!r}{detail}"
        )
        self.candidate_id = candidate_id
        self.current = current
        self.wanted = wanted
