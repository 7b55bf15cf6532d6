"""A copy of a SQLite store taken before its schema is upgraded.

SQLite's online backup API (``sqlite3.Connection.backup``) copies a consistent snapshot
page by page while other connections keep the store open; the migration's connection
already holds the write lock (``BEGIN IMMEDIATE``, nothing written yet), so the copy is
exactly the store the migration starts from. The copy is written beside the store as
``<store>.before-<revision>`` (``reef.db.before-0005``): written under a temporary name
first, then renamed, so a copy that exists is whole.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sqlite3
from pathlib import Path

log = logging.getLogger(__name__)


def backup_path(store: Path, revision: str) -> Path:
    """Where the copy of ``store`` taken at ``revision`` goes: beside it."""
    return store.with_name(f"{store.name}.before-{revision}")


def backup_sqlite_store(store: Path, revision: str) -> Path:
    """Copy ``store`` (at schema ``revision``) to ``backup_path``; return that path.
    An earlier copy at the same revision is replaced (the store is still at that
    revision, so the new copy is the newer state of it)."""
    target = backup_path(store, revision)
    partial = target.with_name(target.name + ".partial")
    source = sqlite3.connect(store)
    try:
        destination = sqlite3.connect(partial)
        try:
            source.backup(destination)
        finally:
            destination.close()
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            partial.unlink()
        raise
    finally:
        source.close()
    os.replace(partial, target)
    log.info("copied the store to %s before upgrading it from revision %s", target, revision)
    return target
