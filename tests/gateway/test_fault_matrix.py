"""``bench/faults.py`` on a reduced matrix, so that CI runs the fault bench: a real
``reef serve`` in front of the misbehaving fake upstream, the official SDKs as clients,
and a SIGKILL under concurrent streams. The full matrix is in docs/benchmarks.md."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
FAULTS = "429,cut,malformed-sse,content-type"  # retried, cut, malformed, refused at once


def test_a_reduced_fault_matrix_is_all_right(tmp_path: Path) -> None:
    output = tmp_path / "benchmarks.md"
    done = subprocess.run(
        [
            sys.executable, str(REPO / "bench" / "faults.py"), "--faults", FAULTS,
            "--crash-streams", "40", "--kill-after", "40", "--output", str(output),
        ],
        cwd=REPO, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    assert "24 of 24 cells right" in done.stdout  # 4 faults, 3 client kinds, stream or not
    section = output.read_text(encoding="utf-8")
    assert "<!-- faults:start -->" in section and "<!-- faults:end -->" in section
    assert "Cells right: **24 of 24**" in section
    for dialect in ("openai", "anthropic", "translated"):
        assert f"| wrong content type (text/html) | {dialect} | yes | 502 `" in section
    assert "200 + error event 502" in section  # a cut stream ends in its error event
    # every receipt a client saw names a stored record, the kill's cut streams included
    assert "Receipts a client saw that name no stored record: 0: **ok**" in section
    assert "after the next start's settling:" in section
