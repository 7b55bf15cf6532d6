"""One file imported into a store as ``reef import`` does it, for the import tests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from reef.experience import ImportOptions, ImportSummary, SQLExperienceStore, import_file


def run_import(
    store: SQLExperienceStore, path: Path, folder: Path, fmt: str = "auto", **options: Any
) -> ImportSummary:
    """``path`` imported into scenario ``s`` of ``store`` (checkpoints under ``folder``);
    its summary."""
    summary = ImportSummary()
    settings: dict[str, Any] = {"scenario": "s", "checkpoint_dir": folder / "imports"}
    import_file(store, path, ImportOptions(**{**settings, "fmt": fmt, **options}), summary)
    return summary
