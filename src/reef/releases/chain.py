"""``ReleaseChain``: candidates, the append-only release chain and its CAS-moved heads.

Every scenario has one chain of releases numbered ``seq`` 1, 2, 3, … without gaps, each
naming its parent (the head it replaced). The head moves only by compare-and-swap,
``UPDATE heads SET release_id=:new, seq=:seq WHERE scenario=:s AND release_id=:expected``,
in the same transaction as the insert of the new release: a writer whose expected head is
stale changes nothing and gets ``ReleaseConflictError``. No statement here updates a
``releases`` row, and only ``forget_scenario`` deletes one: the lone ``create`` release of
a scenario that holds nothing else (no record, candidate, job, evaluation or response).

Concurrency: on SQLite every write transaction starts with ``BEGIN IMMEDIATE`` (the
engine must come from ``reef.db``, whose begin hook honours the option), so
writers run one at a time. On PostgreSQL (READ COMMITTED) the head row is updated before
the release is inserted: a second writer blocks on the row lock, re-checks the
``WHERE`` after the first commits and finds 0 rows. ``UNIQUE (scenario, seq)`` backs this.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Connection

from reef.core import loads, new_id
from reef.core.errors import InvalidInputError
from reef.db import Database, open_database
from reef.db import schema as t
from reef.releases.artifacts import digest_hex
from reef.releases.chainrows import (
    candidate_from_row,
    evidence_text,
    manifest_digests,
    release_from_row,
    release_row,
)
from reef.releases.chainsql import (
    append_release,
    candidate_row,
    check_expected_head,
    checked_state,
    live_canary_id,
    lock_head,
    move_candidate,
    notify_head_moved,
    release_in,
)
from reef.releases.errors import (
    InvalidTransitionError,
    ReleaseNotFoundError,
    ScenarioInUseError,
    ScenarioNotFoundError,
)
from reef.releases.manifest import ReleaseManifest
from reef.releases.values import (
    CANARY_EVIDENCE_KEY,
    CANDIDATE_TRANSITIONS,
    Candidate,
    CandidateState,
    Operation,
    Release,
    ScenarioSummary,
)

MAX_PAGE = 1000

ScenarioHoldings = Callable[[Connection, str], dict[str, int]]
"""What another store holds of a scenario, counted on the deleting transaction's
connection: ``{"record": 3, "stored response": 0}`` (``forget_scenario``)."""

# What start_canary itself writes into evidence["canary"]; settings may not override them.
_CANARY_FIELDS = frozenset({"fraction", "started_at", "actor", "reason"})


class _AlreadyCreated(Exception):
    """Another creator inserted the scenario's head first (internal)."""


class ReleaseChain:
    """The release chain of every scenario in one store.

    ``database`` is the one the composition root built, already migrated; the chain does
    not close it. ``from_url`` opens and owns one. Database failures raise
    ``StoreUnavailableError``.
    """

    def __init__(self, database: Database) -> None:
        self.database = database
        self.dialect = database.dialect
        self._owns_database = False
        insert = postgresql.insert if self.dialect == "postgresql" else sqlite.insert
        # RETURNING says whether the row went in: rowcount is -1 here on psycopg.
        self._insert_head = insert(t.heads).on_conflict_do_nothing().returning(t.heads.c.scenario)
        self._insert_scenario = insert(t.scenarios).on_conflict_do_nothing()

    @classmethod
    def from_url(cls, url: str, migrate: bool = True) -> ReleaseChain:
        """A chain on its own database for ``sqlite:///…`` or ``postgresql://…``; ``close()``
        disposes it. Raises ``InvalidInputError`` for other URLs."""
        chain = cls(open_database(url, migrate))
        chain._owns_database = True
        return chain

    def close(self) -> None:
        """Close the database if ``from_url`` opened it."""
        if self._owns_database:
            self.database.close()

    def _read(self) -> AbstractContextManager[Connection]:
        return self.database.read()

    def _write(self) -> AbstractContextManager[Connection]:
        return self.database.write()

    # -- releases ----------------------------------------------------------------------

    def create(
        self,
        scenario: str,
        manifest: ReleaseManifest,
        actor: str,
        reason: str,
        evidence: dict[str, Any] | None = None,
    ) -> Release:
        """The scenario's first release (``create``, seq 1), which becomes its head.

        Idempotent: when the scenario already has a head, that head is returned unchanged
        (whatever ``manifest`` says). Of concurrent creators exactly one inserts a row.
        """
        existing = self.head(scenario)
        if existing is not None:
            return existing
        release = Release(
            id=new_id(),
            scenario=scenario,
            seq=1,
            parent_id=None,
            operation="create",
            manifest=manifest,
            evidence=evidence,
            created_by=actor,
            reason=reason,
            created_at=datetime.now(UTC),
            candidate_id=None,
            rolled_back_to=None,
        )
        row = release_row(release)
        try:
            with self._write() as conn:
                conn.execute(
                    self._insert_scenario,
                    {"name": scenario, "created_at": release.created_at, "config_json": None},
                )
                # The head row first: on PostgreSQL a concurrent creator waits on its key,
                # then inserts nothing.
                inserted = conn.execute(
                    self._insert_head, {"scenario": scenario, "release_id": release.id, "seq": 1}
                ).first()
                if inserted is None:
                    raise _AlreadyCreated
                conn.execute(t.releases.insert(), row)
                notify_head_moved(conn, scenario)
        except _AlreadyCreated:
            winner = self.head(scenario)
            assert winner is not None, "a head row exists without its release"
            return winner
        return release

    def head(self, scenario: str) -> Release | None:
        """The scenario's current head, or None before ``create``."""
        statement = (
            select(t.releases)
            .join(t.heads, t.heads.c.release_id == t.releases.c.id)
            .where(t.heads.c.scenario == scenario)
        )
        with self._read() as conn:
            row = conn.execute(statement).mappings().first()
        return None if row is None else release_from_row(row)

    def get_release(self, release_id: str) -> Release:
        """The release with this id; raises ``ReleaseNotFoundError``."""
        with self._read() as conn:
            row = (
                conn.execute(select(t.releases).where(t.releases.c.id == release_id))
                .mappings()
                .first()
            )
        if row is None:
            raise ReleaseNotFoundError(release_id)
        return release_from_row(row)

    def releases(
        self, scenario: str, limit: int = 50, before_seq: int | None = None
    ) -> list[Release]:
        """The scenario's releases newest first (highest seq first), at most ``limit``
        (1..1000), only those with ``seq < before_seq`` when given (keyset paging)."""
        if not 1 <= limit <= MAX_PAGE:
            raise InvalidInputError(f"limit must be between 1 and {MAX_PAGE}, got {limit}")
        r = t.releases.c
        statement = select(t.releases).where(r.scenario == scenario)
        if before_seq is not None:
            statement = statement.where(r.seq < before_seq)
        statement = statement.order_by(r.seq.desc()).limit(limit)
        with self._read() as conn:
            rows = conn.execute(statement).mappings().all()
        return [release_from_row(row) for row in rows]

    def scenarios(self) -> list[ScenarioSummary]:
        """Every scenario the store knows (from traffic or a release), sorted by name."""
        with self._read() as conn:
            names = set(conn.scalars(select(t.scenarios.c.name)))
            heads = {row.scenario: row for row in conn.execute(select(t.heads))}
            by_scenario = select(t.releases.c.scenario, func.count()).group_by(
                t.releases.c.scenario
            )
            counts: dict[str, int] = {name: n for name, n in conn.execute(by_scenario)}
        summaries = []
        for name in sorted(names | heads.keys()):
            head = heads.get(name)
            summaries.append(
                ScenarioSummary(
                    name=name,
                    head_release_id=None if head is None else head.release_id,
                    head_seq=None if head is None else head.seq,
                    releases=counts.get(name, 0),
                )
            )
        return summaries

    def forget_scenario(self, scenario: str, others: Sequence[ScenarioHoldings]) -> None:
        """Delete ``scenario`` when it holds nothing: no candidate, no release but the
        ``create`` one its first request made (what a misspelled name served with capture
        off leaves), and nothing in the other stores, each of which answers for its own
        tables (``others``: the experience store's records and stored responses, the
        job queue's jobs, the evaluations), asked on this transaction. Checked and
        deleted in one transaction. Raises ``ScenarioNotFoundError`` when the store does
        not know it and ``ScenarioInUseError`` naming what it holds otherwise."""
        with self._write() as conn:
            named = conn.scalar(select(func.count()).where(t.scenarios.c.name == scenario))
            releases = conn.scalar(select(func.count()).where(t.releases.c.scenario == scenario))
            if not named and not releases:
                raise ScenarioNotFoundError(scenario)
            held: dict[str, int] = {}
            for holdings in others:
                for what, count in holdings(conn, scenario).items():
                    held[what] = held.get(what, 0) + count
            candidates = select(func.count()).where(t.candidates.c.scenario == scenario)
            held["candidate"] = conn.scalar(candidates) or 0
            holds = [f"{n} {what}{'' if n == 1 else 's'}" for what, n in held.items() if n]
            if (releases or 0) > 1:
                holds.append(f"{releases} releases (it has learned or been rolled back)")
            if holds:
                raise ScenarioInUseError(scenario, holds)
            conn.execute(t.heads.delete().where(t.heads.c.scenario == scenario))
            conn.execute(t.releases.delete().where(t.releases.c.scenario == scenario))
            conn.execute(t.scenarios.delete().where(t.scenarios.c.name == scenario))

    def heads_snapshot(self) -> dict[str, tuple[str, int]]:
        """Every head as ``{scenario: (release_id, seq)}``, in one cheap query; the
        gateway polls this to notice new heads."""
        with self._read() as conn:
            rows = conn.execute(select(t.heads.c.scenario, t.heads.c.release_id, t.heads.c.seq))
            return {scenario: (release_id, seq) for scenario, release_id, seq in rows}

    # -- candidates --------------------------------------------------------------------

    def propose(
        self,
        scenario: str,
        manifest: ReleaseManifest,
        parent_release_id: str | None,
        actor: str,
        reason: str,
        evidence: dict[str, Any] | None = None,
    ) -> Candidate:
        """A new ``pending`` candidate. ``parent_release_id`` is the release it was built
        from (usually the head then); raises ``ReleaseNotFoundError`` when it is not a
        release of ``scenario``."""
        now = datetime.now(UTC)
        candidate = Candidate(
            id=new_id(),
            scenario=scenario,
            parent_release_id=parent_release_id,
            manifest=manifest,
            state="pending",
            evidence=evidence,
            created_by=actor,
            reason=reason,
            created_at=now,
            updated_at=now,
        )
        row = {
            "id": candidate.id,
            "scenario": scenario,
            "parent_release_id": parent_release_id,
            "manifest_json": manifest.model_dump_json(),
            "state": "pending",
            "eval_json": evidence_text(evidence),
            "created_by": actor,
            "reason": reason,
            "created_at": now,
            "updated_at": now,
        }
        with self._write() as conn:
            if parent_release_id is not None:
                release_in(conn, scenario, parent_release_id)
            conn.execute(t.candidates.insert(), row)
        return candidate

    def get_candidate(self, candidate_id: str) -> Candidate:
        """The candidate with this id; raises ``CandidateNotFoundError``."""
        with self._read() as conn:
            return candidate_from_row(candidate_row(conn, candidate_id))

    def candidates(
        self, scenario: str, state: CandidateState | None = None, limit: int = 100
    ) -> list[Candidate]:
        """The scenario's candidates newest first, optionally only those in ``state``."""
        if not 1 <= limit <= MAX_PAGE:
            raise InvalidInputError(f"limit must be between 1 and {MAX_PAGE}, got {limit}")
        c = t.candidates.c
        statement = select(t.candidates).where(c.scenario == scenario)
        if state is not None:
            statement = statement.where(c.state == checked_state(state))
        statement = statement.order_by(c.created_at.desc(), c.id.desc()).limit(limit)
        with self._read() as conn:
            rows = conn.execute(statement).mappings().all()
        return [candidate_from_row(row) for row in rows]

    def published_candidate_ids(self, scenario: str) -> set[str]:
        """The ids of the scenario's candidates that were published (all of them, not a
        page: what the learner's selection leaves out the training data of)."""
        c = t.candidates.c
        statement = select(c.id).where(c.scenario == scenario, c.state == "published")
        with self._read() as conn:
            return set(conn.scalars(statement))

    def set_candidate_state(
        self, candidate_id: str, state: CandidateState, evidence: dict[str, Any] | None = None
    ) -> Candidate:
        """Move a candidate along its lifecycle: pending → evaluating → passed | rejected;
        pending | evaluating | passed | canary → abandoned. ``evidence``, when given,
        replaces the stored evidence.

        ``published`` is entered only through ``publish``/``promote`` (with the release in
        the same transaction), ``canary`` only through ``start_canary``. Raises
        ``InvalidTransitionError`` for any other move, including one that lost a race with
        a concurrent change.
        """
        state = checked_state(state)
        eval_json = evidence_text(evidence)
        with self._write() as conn:
            current = candidate_row(conn, candidate_id)["state"]
            if state == "published":
                raise InvalidTransitionError(
                    candidate_id, current, state, "publish() or promote() publishes candidates"
                )
            if state == "canary":
                raise InvalidTransitionError(
                    candidate_id, current, state, "start_canary() starts canaries"
                )
            if state not in CANDIDATE_TRANSITIONS[current]:
                raise InvalidTransitionError(candidate_id, current, state)
            values: dict[str, Any] = {"state": state, "updated_at": datetime.now(UTC)}
            if evidence is not None:
                values["eval_json"] = eval_json
            move_candidate(conn, candidate_id, current, values)
            return candidate_from_row(candidate_row(conn, candidate_id))

    # -- canaries ----------------------------------------------------------------------

    def start_canary(
        self,
        candidate_id: str,
        fraction: float,
        actor: str,
        reason: str,
        settings: dict[str, Any] | None = None,
    ) -> Candidate:
        """Move a ``passed`` candidate to ``canary``: gateways then serve it ``fraction`` of
        its scenario's live traffic, the head the rest, until it is published or abandoned.

        Stores ``evidence["canary"] = {"fraction", "started_at" (ISO 8601), "actor",
        "reason", **settings}`` beside the candidate's other evidence. At most one canary
        per scenario. Raises ``InvalidInputError`` when ``fraction`` is not strictly
        between 0 and 1 or ``settings`` names one of those four keys or is not JSON;
        ``InvalidTransitionError`` when the candidate is not ``passed`` or its scenario
        already has a live canary (named in the message); ``ScenarioHasNoReleaseError``
        when the scenario has no head to compare with.
        """
        if isinstance(fraction, bool) or not isinstance(fraction, int | float):
            raise InvalidInputError(f"canary fraction must be a number, got {fraction!r}")
        if not 0.0 < fraction < 1.0:
            raise InvalidInputError(f"canary fraction must be in (0, 1), got {fraction!r}")
        extra = dict(settings or {})
        if clash := sorted(_CANARY_FIELDS & extra.keys()):
            raise InvalidInputError(f"canary settings may not set {', '.join(clash)}")
        with self._write() as conn:
            candidate = candidate_from_row(candidate_row(conn, candidate_id))
            if candidate.state != "passed":
                raise InvalidTransitionError(
                    candidate_id, candidate.state, "canary", "only passed candidates start one"
                )
            lock_head(conn, candidate.scenario)  # one canary start per scenario at a time
            live = live_canary_id(conn, candidate.scenario)
            if live is not None:
                raise InvalidTransitionError(
                    candidate_id,
                    candidate.state,
                    "canary",
                    f"scenario {candidate.scenario!r} already has the live canary {live!r}",
                )
            now = datetime.now(UTC)
            canary = {
                "fraction": float(fraction),
                "started_at": now.isoformat(),
                "actor": actor,
                "reason": reason,
                **extra,
            }
            evidence = {**(candidate.evidence or {}), CANARY_EVIDENCE_KEY: canary}
            values = {"state": "canary", "eval_json": evidence_text(evidence), "updated_at": now}
            move_candidate(conn, candidate_id, "passed", values)
            return candidate_from_row(candidate_row(conn, candidate_id))

    def canaries(self) -> dict[str, Candidate]:
        """The live canary of every scenario that has one, ``{scenario: candidate}``, in
        one cheap query (by the ``(scenario, state)`` index from each head); gateways poll
        it beside ``heads_snapshot``."""
        c = t.candidates.c
        # Written as IN (heads) so that SQLite, lacking statistics, still probes the index
        # once per head instead of scanning every candidate ever proposed.
        statement = select(t.candidates).where(
            c.state == "canary", c.scenario.in_(select(t.heads.c.scenario))
        )
        with self._read() as conn:
            rows = conn.execute(statement).mappings().all()
        return {row["scenario"]: candidate_from_row(row) for row in rows}

    # -- moving the head ---------------------------------------------------------------

    def publish(  # noqa: PLR0913
        self,
        candidate_id: str,
        expected_head: str,
        actor: str,
        reason: str,
        evidence: dict[str, Any] | None = None,
        operation: Operation = "learn",
        require_passed: bool = True,
    ) -> Release:
        """Append the candidate as the scenario's new head, if the head is still
        ``expected_head``; the candidate becomes ``published``.

        The candidate must be ``passed`` or ``canary`` (promoting a canary), or also
        ``pending`` when ``require_passed=False`` (a manual publish); else
        ``InvalidTransitionError``. Its parent need not be the
        expected head: the gate judged it against the head the caller names, and the new
        release's parent is that head. ``evidence`` defaults to the candidate's.
        Raises ``ReleaseConflictError`` (nothing written) when the head moved.
        """
        if operation not in ("learn", "promote"):
            raise InvalidInputError(
                f"publish operation must be learn or promote, not {operation!r}"
            )
        allowed = ("passed", "canary") if require_passed else ("passed", "canary", "pending")
        with self._write() as conn:
            candidate = candidate_from_row(candidate_row(conn, candidate_id))
            if candidate.state not in allowed:
                why = "only passed or canary candidates are published" + (
                    "" if require_passed else " (or pending ones, manually)"
                )
                raise InvalidTransitionError(candidate_id, candidate.state, "published", why)
            expected_seq = check_expected_head(conn, candidate.scenario, expected_head)
            release = append_release(
                conn,
                Release(
                    id=new_id(),
                    scenario=candidate.scenario,
                    seq=expected_seq + 1,
                    parent_id=expected_head,
                    operation=operation,
                    manifest=candidate.manifest,
                    evidence=candidate.evidence if evidence is None else evidence,
                    created_by=actor,
                    reason=reason,
                    created_at=datetime.now(UTC),
                    candidate_id=candidate_id,
                    rolled_back_to=None,
                ),
            )
            values = {"state": "published", "updated_at": release.created_at}
            move_candidate(conn, candidate_id, candidate.state, values)
            return release

    def promote(
        self,
        candidate_id: str,
        expected_head: str,
        actor: str,
        reason: str,
        evidence: dict[str, Any] | None = None,
    ) -> Release:
        """Review mode: publish a ``passed`` (or ``canary``) candidate a person approved
        (operation ``promote``). Raises as ``publish``."""
        return self.publish(
            candidate_id, expected_head, actor, reason, evidence, operation="promote"
        )

    def rollback(
        self,
        scenario: str,
        to_release_id: str,
        expected_head: str,
        actor: str,
        reason: str,
        evidence: dict[str, Any] | None = None,
    ) -> Release:
        """Append a ``rollback`` release whose manifest equals ``to_release_id``'s, if the
        head is still ``expected_head``. History is kept: nothing is removed.

        Raises ``ReleaseNotFoundError`` when ``to_release_id`` is not a release of
        ``scenario``, ``InvalidInputError`` when it is not older than the expected head,
        ``ReleaseConflictError`` (nothing written) when the head moved.
        """
        with self._write() as conn:
            target = release_in(conn, scenario, to_release_id)
            expected_seq = check_expected_head(conn, scenario, expected_head)
            if target.seq >= expected_seq:
                raise InvalidInputError(
                    f"rollback target {to_release_id!r} (seq {target.seq}) is not older "
                    f"than the head {expected_head!r} (seq {expected_seq})"
                )
            return append_release(
                conn,
                Release(
                    id=new_id(),
                    scenario=scenario,
                    seq=expected_seq + 1,
                    parent_id=expected_head,
                    operation="rollback",
                    manifest=target.manifest,
                    evidence=evidence,
                    created_by=actor,
                    reason=reason,
                    created_at=datetime.now(UTC),
                    candidate_id=None,
                    rolled_back_to=target.id,
                ),
            )

    def adopt(
        self,
        scenario: str,
        manifest: ReleaseManifest,
        expected_head: str,
        actor: str,
        reason: str,
        evidence: dict[str, Any] | None = None,
    ) -> Release:
        """Append an ``adopt`` release serving ``manifest`` (the configuration's model
        adopted by an operator), if the head is still ``expected_head``.

        The caller builds ``manifest`` from the head it read (``reef.gateway.serving.drift``
        keeps its harness, drops weights trained on another base). Raises
        ``ReleaseConflictError`` (nothing written) when the head moved.
        """
        with self._write() as conn:
            expected_seq = check_expected_head(conn, scenario, expected_head)
            return append_release(
                conn,
                Release(
                    id=new_id(),
                    scenario=scenario,
                    seq=expected_seq + 1,
                    parent_id=expected_head,
                    operation="adopt",
                    manifest=manifest,
                    evidence=evidence,
                    created_by=actor,
                    reason=reason,
                    created_at=datetime.now(UTC),
                    candidate_id=None,
                    rolled_back_to=None,
                ),
            )

    def harness_owners(self, digest: str) -> list[dict[str, str]]:
        """Every release and candidate whose manifest names ``digest`` as its harness
        (``[{"kind", "id", "scenario"}]``). Raises ``InvalidDigestError`` for a malformed
        digest and ``StoreUnavailableError``."""
        digest_hex(digest)  # a well-formed digest holds only [a-z0-9:], safe inside LIKE
        pattern = f"%{digest}%"
        owners: list[dict[str, str]] = []
        with self._read() as conn:
            for kind, table in (("release", t.releases), ("candidate", t.candidates)):
                statement = select(table.c.id, table.c.scenario, table.c.manifest_json).where(
                    table.c.manifest_json.like(pattern)
                )
                for row in conn.execute(statement).mappings():
                    # LIKE narrows; the parsed manifest decides (it may be an adapter's)
                    manifest = ReleaseManifest.from_json(loads(row["manifest_json"]))
                    if manifest.harness == digest:
                        owner = {"kind": kind, "id": row["id"], "scenario": row["scenario"]}
                        owners.append(owner)
        return owners

    def reachable_artifacts(self) -> set[str]:
        """Every checkpoint, adapter and harness digest named by a release (any, ever) or by a
        candidate that is not rejected or abandoned (a live canary included): what
        ``reef gc`` must keep."""
        digests: set[str] = set()
        with self._read() as conn:
            for manifest_json in conn.scalars(select(t.releases.c.manifest_json)):
                digests |= manifest_digests(manifest_json)
            live = select(t.candidates.c.manifest_json).where(
                t.candidates.c.state.not_in(("rejected", "abandoned"))
            )
            for manifest_json in conn.scalars(live):
                digests |= manifest_digests(manifest_json)
        return digests
