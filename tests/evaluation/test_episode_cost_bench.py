"""``bench/episode_cost.py`` at tiny sizes on the tiny random model, so that CI runs the
episode-cost bench: a real ``Gate.run`` with ``gate.episodes`` through a real gateway
next to the same episodes played straight against the embedded engine. Its figures are
in docs/benchmarks.md; nothing here checks a time."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
TASKS, REPEATS = 2, 1
EPISODES = TASKS * REPEATS * 2  # both sides


def table_rows(section: str) -> list[list[str]]:
    """The cells of the runs' table rows."""
    return [
        [cell.strip() for cell in line.strip("|").split("|")]
        for line in section.splitlines()
        if line.startswith("| `tiny-random` |")
    ]


def test_the_episode_cost_bench_runs_both_sides_on_the_same_episodes(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    output = tmp_path / "benchmarks.md"
    done = subprocess.run(
        [
            sys.executable, str(REPO / "bench" / "episode_cost.py"), "--model", "tiny-random",
            "--tasks", str(TASKS), "--repeats", str(REPEATS), "--concurrency", "2",
            "--runs", "2", "--max-tokens", "8", "--max-turns", "2",
            "--home", str(tmp_path / "home"), "--output", str(output),
        ],
        cwd=REPO, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    section = output.read_text(encoding="utf-8")
    assert "<!-- episodes:start -->" in section and "<!-- episodes:end -->" in section
    assert "## Evaluation gate: paired episodes" in section
    assert "Command: `python bench/episode_cost.py --model tiny-random" in section
    rows = table_rows(section)
    assert [row[1:3] for row in rows] == [["1", "gate"], ["2", "straight"]]  # sides alternate
    for row in rows:
        assert row[6] == str(EPISODES)  # the gate played every episode
        gate_calls, straight_calls = (int(n) for n in row[7].split(" / "))
        # one call per turn, at least one and at most --max-turns per episode, both sides
        for calls in (gate_calls, straight_calls):
            assert EPISODES <= calls <= 2 * EPISODES
        assert row[10].endswith(f"/{EPISODES}")
        assert row[11].startswith(("passed", "rejected", "awaiting review"))
    assert "The gate's wall time (median over runs; share): episodes" in section
    assert "environment (reset, tool steps, score)" in section
