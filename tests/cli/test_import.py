"""``reef import`` as a real subprocess: the summary, --dry-run, usage errors (exit 2),
and an import killed with SIGKILL mid-file, rerun, that ends with exactly the rows of a
clean import."""

from __future__ import annotations

import io
import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

from rich.console import Console

from reef.cli.importing import _import_one
from reef.experience import ImportOptions, ImportSummary, SQLExperienceStore
from tests.cli.test_commands import reef
from tests.polling import eventually

DATA = Path(__file__).resolve().parents[1] / "data" / "import"


def stored(root: Path) -> tuple[int, int, int]:
    """Records, feedback rows and distinct idempotency keys of scenario ``s``."""
    store = SQLExperienceStore.from_url(f"sqlite:///{root / '.reef' / 'reef.db'}")
    try:
        records = list(store.iter_export("s"))
    finally:
        store.close()
    keys = {r.idempotency_key for r in records}
    return len(records), sum(len(r.feedback) for r in records), len(keys)


def sessions(root: Path) -> list[tuple[str | None, str, int]]:
    """Each record of scenario ``s`` as its idempotency key, session and turn, in key
    order (record ids and session ids are minted per store; the grouping is compared)."""
    store = SQLExperienceStore.from_url(f"sqlite:///{root / '.reef' / 'reef.db'}")
    try:
        records = list(store.iter_export("s"))
    finally:
        store.close()
    first_key = {}
    for record in sorted(records, key=lambda r: str(r.idempotency_key)):
        first_key.setdefault(record.session_id, str(record.idempotency_key))
    return sorted((r.idempotency_key, first_key[r.session_id], r.turn) for r in records)


def test_import_prints_a_summary_and_a_rerun_adds_nothing(tmp_path: Path) -> None:
    files = [str(DATA / "openai-chat.jsonl"), str(DATA / "openai-finetune.jsonl")]
    first = reef("import", *files, "--scenario", "s", "--json", cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    summary = json.loads(first.stdout)
    assert (summary["records"], summary["feedback"], summary["skipped"]) == (8, 4, 0)
    assert summary["formats"] == dict(zip(files, ["openai-chat", "openai-finetune"], strict=True))
    again = reef("import", *files, "--scenario", "s", cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    assert (
        "0 records, 0 feedback" in again.stderr
        and "8 records and 4 feedback already" in again.stderr
    )
    assert stored(tmp_path) == (8, 4, 8)


def test_dry_run_writes_nothing(tmp_path: Path) -> None:
    result = reef(
        "import", str(DATA / "openai-finetune.jsonl"), "--scenario", "s", "--dry-run", cwd=tmp_path
    )
    assert result.returncode == 0, result.stderr
    assert "would import into 's': 4 records, 4 feedback" in result.stderr
    assert not (tmp_path / ".reef").exists()


def test_usage_errors_exit_2_with_what_to_fix(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text('{"messages": [{"role": "user", "content": "hi"}]}\n')
    unknown = reef("import", str(path), "--scenario", "s", "--format", "csv", cwd=tmp_path)
    assert unknown.returncode == 2
    assert "unknown import format 'csv'" in unknown.stderr
    assert "reef, otel, openai-chat, openai-finetune" in unknown.stderr
    strict = reef("import", str(path), "--scenario", "s", "--strict", cwd=tmp_path)
    assert strict.returncode == 2
    assert "bad.jsonl:1: no assistant message" in strict.stderr
    badly_named = reef("import", str(path), "--scenario", "no spaces", cwd=tmp_path)
    assert badly_named.returncode == 2
    assert "invalid scenario name 'no spaces'" in badly_named.stderr
    lenient = reef("import", str(path), "--scenario", "s", cwd=tmp_path)
    assert lenient.returncode == 0, lenient.stderr
    assert "skipped" in lenient.stderr and "bad.jsonl:1: no assistant message" in lenient.stderr


def _checkpoint_line(root: Path) -> int:
    for path in (root / ".reef" / "imports").glob("*.json"):
        try:
            return int(json.loads(path.read_text())["line"])
        except (ValueError, KeyError):
            return 0  # caught between write and rename: not yet
    return 0


def test_an_import_killed_midway_and_rerun_loses_and_doubles_nothing(tmp_path: Path) -> None:
    count = 10000
    path = tmp_path / "big.jsonl"
    # Conversations of two turns, the second 5000 lines after the first: a second turn
    # read after the rerun finds the session of a first turn committed before the kill.
    with path.open("w") as out:
        for turns in (1, 2):
            for i in range(count // 2):
                conversation = [
                    {"role": "user", "content": f"question {i}?"},
                    {"role": "assistant", "content": f"answer {i}"},
                    {"role": "user", "content": f"and then {i}?"},
                    {"role": "assistant", "content": f"then {i}"},
                ]
                out.write(json.dumps({"messages": conversation[: 2 * turns]}) + "\n")
    command = [sys.executable, "-m", "reef", "import", str(path), "--scenario", "s"]
    running = subprocess.Popen(
        command, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        eventually(
            lambda: running.poll() is None and _checkpoint_line(tmp_path) >= 1000,
            "the import's checkpoint to move while it runs",
            timeout_seconds=60,
        )
    finally:
        os.kill(running.pid, signal.SIGKILL)
        running.wait(timeout=30)
    assert running.returncode == -signal.SIGKILL
    partial, _, _ = stored(tmp_path)
    assert 0 < partial < count
    rerun = reef("import", str(path), "--scenario", "s", cwd=tmp_path)
    assert rerun.returncode == 0, rerun.stderr
    assert "resumed after line" in rerun.stderr
    assert stored(tmp_path) == (count, count, count)
    assert not list((tmp_path / ".reef" / "imports").glob("*.json"))  # done: forgotten
    # the same file imported cleanly, uninterrupted, elsewhere: the same rows
    clean_root = tmp_path / "clean"
    clean_root.mkdir()
    clean = reef("import", str(path), "--scenario", "s", cwd=clean_root)
    assert clean.returncode == 0, clean.stderr
    assert stored(clean_root) == stored(tmp_path)
    assert sessions(clean_root) == sessions(tmp_path)
    assert len({first for _, first, _ in sessions(tmp_path)}) == count // 2


def test_the_progress_bar_shows_bytes_read_and_records_per_second(tmp_path: Path) -> None:
    path = tmp_path / "three-batches.jsonl"
    with path.open("w") as out:
        for i in range(2500):  # three batches, so the bar moves before the end
            turn = [{"role": "user", "content": f"q{i}"}, {"role": "assistant", "content": "a"}]
            out.write(json.dumps({"messages": turn}) + "\n")
    screen = io.StringIO()
    console = Console(file=screen, force_terminal=True, width=160, color_system=None)
    store = SQLExperienceStore.from_url(f"sqlite:///{tmp_path / 'reef.db'}", migrate=True)
    try:
        options = ImportOptions(scenario="s", checkpoint_dir=tmp_path / "imports")
        summary = ImportSummary()
        _import_one(store, path, options, summary, console)
    finally:
        store.close()
    assert summary.records == 2500
    frames = screen.getvalue()
    assert path.name in frames
    size = f"{path.stat().st_size / 1000:.1f}"
    assert f"{size}/{size} kB" in frames  # bytes read, to the end of the file
    assert re.search(r"\b[1-9][\d,]* records/s", frames), frames
