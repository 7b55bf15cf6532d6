"""Importing history into the store (``reef import``): one reader per source format
behind ``ImportReader`` (``base``), registered by name in ``readers.READERS``; the
streaming, deduplicating, resumable loop in ``runner``; resume points in ``checkpoint``.

Extend: a new format is an ``ImportReader`` subclass added to ``READERS`` (and its
field mapping to docs/import-export.md)."""

from reef.experience.importing.base import (
    IMPORT_ORIGIN_PREFIX,
    ORIGIN_TAG,
    SOURCE_TAG,
    ImportedFeedback,
    ImportedRecord,
    ImportItem,
    ImportLineError,
    ImportReader,
)
from reef.experience.importing.readers import IMPORT_FORMATS, READERS, demo_trust
from reef.experience.importing.runner import (
    BATCH_LINES,
    ImportOptions,
    ImportSummary,
    LineImport,
    UnknownImportFormatError,
    closes_object,
    import_file,
    opens_object,
    reader_named,
    resolve_format,
    sniff_reader,
)

__all__ = [
    "BATCH_LINES",
    "IMPORT_FORMATS",
    "IMPORT_ORIGIN_PREFIX",
    "ORIGIN_TAG",
    "READERS",
    "SOURCE_TAG",
    "ImportItem",
    "ImportLineError",
    "ImportOptions",
    "ImportReader",
    "ImportSummary",
    "ImportedFeedback",
    "ImportedRecord",
    "LineImport",
    "UnknownImportFormatError",
    "closes_object",
    "demo_trust",
    "import_file",
    "opens_object",
    "reader_named",
    "resolve_format",
    "sniff_reader",
]
