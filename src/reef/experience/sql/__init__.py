"""The experience store's SQL: ``SQLExperienceStore`` on a ``reef.db.Database``.

``store`` is the store itself; ``queries`` the statements that are not one-liners;
``rows`` the conversions between rows and ``records`` values; ``sqlite_records`` the
plain-sqlite3 fast path that writes records on SQLite (the gateway's hot path);
``curve`` the questions other parts ask of its tables (the traffic behind each release,
what a scenario holds). The tables themselves are ``reef.db.schema``.
"""

from reef.experience.sql.curve import experience_holdings
from reef.experience.sql.store import SQLExperienceStore

__all__ = ["SQLExperienceStore", "experience_holdings"]
