"""``open_store``: the experience store for a URL."""

from __future__ import annotations

from reef.experience.sql import SQLExperienceStore


def open_store(url: str, migrate: bool = True) -> SQLExperienceStore:
    """The store behind ``url`` (``sqlite:///path`` or ``postgresql://…``) on a database
    of its own, migrated; ``close()`` closes both. For one store alone (tests, scripts):
    a process with several stores builds one ``reef.db.Database`` and hands it to each.

    Raises ``InvalidInputError`` for other schemes and ``StoreUnavailableError`` when the
    database cannot be reached. Other backends will come through the ``reef.stores``
    entry-point group.
    """
    return SQLExperienceStore.from_url(url, migrate=migrate)
