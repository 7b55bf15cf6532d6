"""``open_store``: the experience store for a URL."""

from __future__ import annotations

from reef.experience.sql import SQLExperienceStore


def open_store(url: str, migrate: bool = True) -> SQLExperienceStore:
    """The store behind ``url`` (``sqlite:///path`` or ``postgresql://…``), migrated.

    Raises ``InvalidInputError`` for other schemes and ``StoreUnavailableError`` when the
    database cannot be reached. Other backends will come through the ``reef.stores``
    entry-point group.
    """
    store = SQLExperienceStore(url)
    if migrate:
        try:
            store.migrate()
        except BaseException:
            store.close()
            raise
    return store
