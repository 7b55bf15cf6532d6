"""The ``reef`` command as a user runs it (a real subprocess)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq

from reef.experience import RecordDraft, open_store


def reef(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "reef", *args], cwd=cwd, capture_output=True, text=True, timeout=60
    )


def test_config_show_masks_secrets(tmp_path: Path) -> None:
    (tmp_path / "reef.yaml").write_text(
        "auth:\n  keys:\n    - {id: app, key: sk-hidden}\n"
        "upstreams:\n  u: {type: openai, base_url: 'http://h/v1', api_key: up-hidden}\n"
    )
    result = reef("config", "show", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    shown = json.loads(result.stdout)
    assert shown["upstreams"]["u"]["api_key"] == "**********"
    assert "sk-hidden" not in result.stdout and "up-hidden" not in result.stdout


def test_config_errors_exit_2_with_the_message(tmp_path: Path) -> None:
    (tmp_path / "reef.yaml").write_text("server: {prot: 1}\n")
    result = reef("config", "show", cwd=tmp_path)
    assert result.returncode == 2
    assert "unknown key 'server.prot'" in result.stderr
    assert "Traceback" not in result.stderr


def _draft(i: int) -> RecordDraft:
    return RecordDraft(
        id=f"rec-{i}",
        scenario="s",
        session_id="sess",
        api="openai.chat",
        request={"messages": [{"role": "user", "content": f"q{i}"}]},
        response={"choices": [{"message": {"role": "assistant", "content": f"a{i}"}}]},
        status="ok",
        error=None,
        latency_ms=1.0,
        usage=None,
        release_id=None,
        prompt_hash=f"p{i}",
        content_hash=f"c{i}",
        continuation_hash=None,
    )


def test_export_jsonl_and_parquet(tmp_path: Path) -> None:
    store = open_store(f"sqlite:///{tmp_path / '.reef' / 'reef.db'}")
    store.write_records([_draft(i) for i in range(3)])
    store.close()
    result = reef("export", "--scenario", "s", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    rows = [json.loads(line) for line in result.stdout.splitlines()]
    assert [row["id"] for row in rows] == ["rec-0", "rec-1", "rec-2"]
    assert "exported 3 records" in result.stderr
    out = tmp_path / "s.parquet"
    result = reef("export", "--scenario", "s", "--format", "parquet", "-o", str(out), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert pq.read_table(out).num_rows == 3
    bad = reef("export", "--scenario", "s", "--format", "csv", cwd=tmp_path)
    assert bad.returncode == 2 and "jsonl, reef, parquet, openai-finetune or otel" in bad.stderr
