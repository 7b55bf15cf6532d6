"""``bench/shadow_overhead.py`` at tiny sizes, so that CI runs the shadow bench: real
gateways on loopback, one with an evaluating candidate whose live requests are all
shadowed. Its figures are in docs/benchmarks.md; nothing here checks a time."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
REQUESTS = 20
IN_FLIGHT = 2  # --shadow-concurrency: calls that may straddle a round's edges


def test_the_shadow_bench_shadows_every_sampled_request(tmp_path: Path) -> None:
    output = tmp_path / "benchmarks.md"
    done = subprocess.run(
        [
            sys.executable, str(REPO / "bench" / "shadow_overhead.py"),
            "--requests", str(REQUESTS), "--warmup", "5", "--runs", "1", "--concurrency", "1",
            "--fractions", "1", "--shadow-concurrency", str(IN_FLIGHT), "--output", str(output),
        ],
        cwd=REPO, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    section = output.read_text(encoding="utf-8")
    assert "<!-- shadow_overhead:start -->" in section
    assert "<!-- shadow_overhead:end -->" in section
    assert "| 1 | reef-shadow-off |" in section and "| 1 | reef-shadow-1 |" in section
    found = re.search(
        r"c=1, reef-shadow-1: .*sent/dropped/failed per round: (\d+)/(\d+)/(\d+);", section
    )
    assert found is not None, section
    sent, dropped, failed = (int(n) for n in found.groups())
    assert sent > 0 and failed == 0
    # At fraction 1 every live request is sampled: sent or dropped (give or take the
    # calls still in flight when the round's counters were read).
    assert abs(sent + dropped - REQUESTS) <= IN_FLIGHT
