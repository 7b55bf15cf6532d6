"""Opening the database for commands, and building the worker on it.

``reef serve``, ``reef worker``, ``reef migrate`` and ``reef learn`` create the store
(``open_database`` migrates); listing and inspecting commands use
``open_existing_database``, which answers ``StoreNotFoundError`` (exit 3) naming where it
looked instead of leaving an empty ``.reef/`` in whatever directory they were run from.
Each command opens one ``Database`` and builds the stores it needs on it.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from reef.core.errors import InvalidInputError, NotFoundError

if TYPE_CHECKING:
    from reef.config import ReefSettings
    from reef.db import Database
    from reef.experience import ExperienceStore
    from reef.learning import Worker

_PICK = (
    "run `reef serve` or `reef migrate` to create one, or point at one with --config "
    "(store.url or home in reef.yaml) or REEF_STORE__URL"
)


class StoreNotFoundError(NotFoundError):
    """A command that only reads found no store where the configuration points."""


def open_existing_database(settings: ReefSettings) -> Database:
    """The configured database, migrated, if it exists. Raises ``StoreNotFoundError`` for
    a SQLite file that does not exist or a PostgreSQL database without Reef's schema,
    and what ``open_database`` raises otherwise."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    from reef.db import open_database

    url = settings.store_url()
    try:
        parsed = make_url(url)
    except ArgumentError:
        return open_database(url)  # raises InvalidInputError naming the URL
    if parsed.get_backend_name() == "sqlite":
        if parsed.database in (None, "", ":memory:"):
            return open_database(url)  # raises InvalidInputError: SQLite needs a file
        path = Path(parsed.database).expanduser().absolute()
        if not path.exists():
            raise StoreNotFoundError(f"no Reef store at {path}; {_PICK}")
        return open_database(url)
    database = open_database(url, migrate=False)
    try:
        if not database.has_schema():
            raise StoreNotFoundError(
                f"no Reef store in {parsed.render_as_string(hide_password=True)} "
                f"(the database has no Reef tables); {_PICK}"
            )
        database.migrate()
    except BaseException:
        database.close()
        raise
    return database


class UnknownScenarioError(InvalidInputError):
    """A command named a scenario that is neither configured nor in the store: most often
    a misspelling, which would otherwise read as an empty table."""

    def __init__(self, scenario: str, known: list[str]) -> None:
        listed = ", ".join(repr(name) for name in known) if known else "none yet"
        super().__init__(
            f"unknown scenario {scenario!r}; known scenarios (configured or in the store): {listed}"
        )
        self.scenario = scenario
        self.known = known


def known_scenarios(settings: ReefSettings, database: Database | None) -> list[str]:
    """The configured scenarios and those the store knows (from traffic or a release),
    sorted; only the configured ones without a ``database``."""
    from reef.releases import ReleaseChain

    names = set(settings.scenarios)
    if database is not None:
        names |= {summary.name for summary in ReleaseChain(database).scenarios()}
    return sorted(names)


def check_scenario(settings: ReefSettings, database: Database | None, scenario: str) -> str:
    """``scenario`` when it is configured or in the store; ``UnknownScenarioError``
    (exit 2) naming the known ones otherwise."""
    if scenario in settings.scenarios:
        return scenario
    known = known_scenarios(settings, database)
    if scenario not in known:
        raise UnknownScenarioError(scenario, known)
    return scenario


def _missing_sqlite_file(url: str) -> Path | None:
    """The SQLite file ``url`` names, when it does not exist yet."""
    from sqlalchemy.engine import make_url

    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite" or parsed.database in (None, "", ":memory:"):
        return None
    path = Path(parsed.database).expanduser().absolute()
    return None if path.exists() else path


def describe_pending(settings: ReefSettings) -> str:
    """What ``reef migrate`` would do to the configured store, in words; changes
    nothing (a SQLite file that does not exist is not created). Raises
    ``StoreNewerThanReefError`` for a store a later Reef wrote."""
    from reef.db import Database, head_revision, known_revisions

    url = settings.store_url()
    missing = _missing_sqlite_file(url)
    if missing is not None:
        return f"no store at {missing}: `reef migrate` would create it with " + ", ".join(
            known_revisions()
        )
    database = Database.open(url)
    try:
        pending = database.pending_revisions()
    finally:
        database.close()
    if not pending:
        return f"store is at the latest schema ({head_revision()}); nothing to apply"
    return "would apply " + ", ".join(pending)


def migrate_store(settings: ReefSettings) -> str:
    """Create or upgrade the configured store; what was done, in words."""
    from reef.db import Database, head_revision

    database = Database.open(settings.store_url())
    try:
        applied = database.migrate()
    finally:
        database.close()
    done = f"applied {', '.join(applied)}; " if applied else ""
    return f"{done}store is at the latest schema ({head_revision()})"


def build_worker(
    settings: ReefSettings, database: Database, store: ExperienceStore, **options: Any
) -> Worker:
    """A learning worker on ``database``: ``store`` for experience, and the release chain,
    job queue and evaluations built here on the same database, what the worker and its
    gate write redacted with ``capture.redact_patterns``, gate results sent over OTLP when
    ``otel.enabled``; ``options`` go to ``Worker``."""
    from reef.evaluation import EvaluationStore
    from reef.experience import Redactor
    from reef.jobs import JobQueue
    from reef.learning import Worker
    from reef.releases import ReleaseChain, open_artifact_store
    from reef.telemetry import open_live_export

    redactor = Redactor(settings.capture.redact_patterns)
    options.setdefault("live_export", open_live_export(settings.otel))
    return Worker(
        settings,
        store,
        ReleaseChain(database),
        open_artifact_store(settings.artifacts_url()),
        queue=JobQueue(database),
        evaluations=EvaluationStore(database, redactor),
        redactor=redactor,
        **options,
    )
