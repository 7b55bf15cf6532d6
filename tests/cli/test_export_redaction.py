"""``reef export`` redacts with the configured ``capture.redact_patterns``, so records and
feedback stored before a pattern was added leave the store scrubbed (a real subprocess)."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq

from reef.experience import REDACTED, FeedbackDraft, RecordDraft, open_store
from tests.cli.test_commands import reef

SECRET = "ann@example.com"


def _stored_unredacted(root: Path) -> None:
    store = open_store(f"sqlite:///{root / '.reef' / 'reef.db'}")
    try:
        store.write_records(
            [
                RecordDraft(
                    id="rec-1",
                    scenario="s",
                    session_id="sess",
                    api="openai.chat",
                    request={"messages": [{"role": "user", "content": f"I am {SECRET}"}]},
                    response={"choices": [{"message": {"role": "assistant", "content": SECRET}}]},
                    status="error",
                    error=f"upstream refused {SECRET}",
                    latency_ms=1.0,
                    usage=None,
                    release_id=None,
                    prompt_hash="p",
                    content_hash="c",
                    continuation_hash=None,
                    tags={"customer": SECRET},
                )
            ]
        )
        store.add_feedback(
            FeedbackDraft(
                scenario="s",
                record_ids=("rec-1",),
                score=0.0,
                feedback=f"from {SECRET}",
                correction=f"mail {SECRET} now",
                metadata={"by": SECRET},
                principal=None,
                idempotency_key=None,
            )
        )
    finally:
        store.close()


def test_export_redacts_every_string_with_the_configured_patterns(tmp_path: Path) -> None:
    _stored_unredacted(tmp_path)
    plain = reef("export", "--scenario", "s", cwd=tmp_path)
    assert plain.returncode == 0, plain.stderr
    assert SECRET in plain.stdout  # no patterns: exported as stored
    (tmp_path / "reef.yaml").write_text(
        "capture:\n  redact_patterns: ['[\\w.+-]+@[\\w-]+\\.[\\w.]+']\n"
    )
    result = reef("export", "--scenario", "s", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert SECRET not in result.stdout
    (row,) = [json.loads(line) for line in result.stdout.splitlines()]
    assert row["request"]["messages"][0]["content"] == f"I am {REDACTED}"
    assert row["error"] == f"upstream refused {REDACTED}"
    assert row["tags"] == {"customer": REDACTED}
    (feedback,) = row["feedback"]
    assert (feedback["feedback"], feedback["correction"]) == (
        f"from {REDACTED}",
        f"mail {REDACTED} now",
    )
    assert feedback["metadata"] == {"by": REDACTED}
    out = tmp_path / "s.parquet"
    result = reef("export", "--scenario", "s", "--format", "parquet", "-o", str(out), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    table = pq.read_table(out).to_pylist()
    assert SECRET not in repr(table) and REDACTED in table[0]["error"]
