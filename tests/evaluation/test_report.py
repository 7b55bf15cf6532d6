"""The comparison report: JSON that round-trips, Markdown a person can read, a real PNG."""

from __future__ import annotations

import builtins
import json
from pathlib import Path
from typing import Any

import matplotlib.image
import pytest

from reef.core import ReefError
from reef.evaluation.report import PlotUnavailableError, compare_items, write_report
from reef.evaluation.values import Arm, Decision, Interval, ItemResult, SuiteSummary

META = {
    "scenario": "support",
    "candidate": "cand-7",
    "baseline": "rel-3",
    "suites": ["file:faq", "holdout"],
    "repeats": 2,
    "when": "2025-01-02T03:04:05Z",
}


def interval(mean: float, low: float, high: float, n: int) -> Interval:
    return Interval(mean=mean, low=low, high=high, n=n, confidence=0.95)


def decision(verdict: str = "rejected") -> Decision:
    faq = SuiteSummary("file:faq", 12, 0.60, 0.55, interval(0.05, -0.02, 0.12, 12))
    holdout = SuiteSummary("holdout", 12, 0.52, 0.50, interval(0.02, -0.04, 0.08, 12))
    overall = SuiteSummary("overall", 24, 0.56, 0.525, interval(0.035, -0.01, 0.08, 24))
    return Decision(
        verdict=verdict,  # type: ignore[arg-type]
        reasons=["the interval's lower bound -0.010 is not above 0", "24 items >= 20"],
        rule={"min_items": 20, "min_improvement": 0.01},
        overall=overall,
        suites=[faq, holdout],
    )


def results() -> list[ItemResult]:
    """24 items (12 per suite), two repeats per arm; item i's gain is (i - 10) / 20."""
    rows: list[ItemResult] = []
    for index in range(24):
        suite = "file:faq" if index < 12 else "holdout"
        key = f"{suite}/q{index}"
        baseline = 0.5
        candidate = min(1.0, max(0.0, baseline + (index - 10) / 20))
        for repeat in range(2):
            arms: tuple[tuple[Arm, float], ...] = (("candidate", candidate), ("baseline", baseline))
            for arm, score in arms:
                failed = index == 3 and arm == "candidate" and repeat == 1
                rows.append(
                    ItemResult(
                        item_key=key,
                        suite=suite,
                        arm=arm,
                        repeat=repeat,
                        score=score,
                        output=None if failed else f"{arm} says | {index} r{repeat}\nmore",
                        record_id=f"rec-{index}-{arm}-{repeat}",
                        error="gateway answered 502: boom" if failed else None,
                    )
                )
    return rows


def write(tmp_path: Path, **overrides: Any) -> dict[str, Path]:
    args: dict[str, Any] = {
        "title": "support: cand-7 vs rel-3",
        "meta": META,
        "decision": decision(),
        "results": results(),
    }
    args.update(overrides)
    return write_report(tmp_path / "report", **args)


def test_json_round_trips_and_holds_every_item(tmp_path: Path) -> None:
    paths = write(tmp_path)
    assert set(paths) == {"json", "markdown", "png"}
    assert all(path.parent == tmp_path / "report" for path in paths.values())
    document = json.loads(paths["json"].read_text(encoding="utf-8"))
    assert document["schema_version"] == 1
    assert document["title"] == "support: cand-7 vs rel-3"
    assert document["meta"] == META
    assert document["decision"] == json.loads(json.dumps(decision().as_dict()))
    assert document["results"] == [r.as_dict() for r in results()]
    items = {item["key"]: item for item in document["items"]}
    assert len(document["items"]) == len(items) == 24
    q0 = items["file:faq/q0"]
    assert q0["suite"] == "file:faq"
    assert q0["candidate_mean"] == 0.0 and q0["baseline_mean"] == 0.5
    assert q0["difference"] == -0.5
    assert q0["outputs"] == {
        "candidate": "candidate says | 0 r0\nmore",
        "baseline": "baseline says | 0 r0\nmore",
    }
    assert q0["errors"] == []
    assert items["file:faq/q3"]["errors"] == [
        {"arm": "candidate", "repeat": 1, "error": "gateway answered 502: boom"}
    ]


def test_markdown_names_the_verdict_reasons_and_suites(tmp_path: Path) -> None:
    text = write(tmp_path)["markdown"].read_text(encoding="utf-8")
    assert text.startswith("# support: cand-7 vs rel-3\n")
    for row in (
        "| scenario | support |",
        "| candidate | cand-7 |",
        "| baseline | rel-3 |",
        "| suites | file:faq, holdout |",
        "| repeats | 2 |",
    ):
        assert row in text
    assert "## Verdict: **REJECTED**" in text
    assert "- the interval's lower bound -0.010 is not above 0" in text
    assert "| **overall** | 24 | 0.560 | 0.525 | +0.035 | 95% [-0.010, +0.080] |" in text
    assert "| file:faq | 12 | 0.600 | 0.550 | +0.050 | 95% [-0.020, +0.120] |" in text
    assert "| holdout | 12 | 0.520 | 0.500 | +0.020 | 95% [-0.040, +0.080] |" in text
    assert "![per-item differences](differences.png)" in text


def test_markdown_lists_ten_largest_losses_and_gains_escaped(tmp_path: Path) -> None:
    text = write(tmp_path)["markdown"].read_text(encoding="utf-8")
    losses = text.split("## Largest losses (10 of 10)")[1].split("## Largest gains")[0]
    gains = text.split("## Largest gains (10 of 13)")[1].split("## Per-item")[0]
    assert losses.index("| file:faq/q0 |") < losses.index("| file:faq/q1 |")
    assert "| file:faq/q9 |" in losses and "q10 |" not in losses
    # q20..q23 gain +0.5 (capped), then q19 down to q14
    assert "| holdout/q23 |" in gains and "| holdout/q14 |" in gains
    assert "| holdout/q13 |" not in gains
    # the output is one line with its | escaped, so the table stays a table
    assert "candidate says \\| 0 r0 more" in losses
    rows = [line for line in (losses + gains).splitlines() if line.startswith("| ")]
    assert len(rows) == 22  # two headers, twenty items
    assert all(row.count(" | ") == 5 for row in rows)


def test_png_is_a_real_picture(tmp_path: Path) -> None:
    png = write(tmp_path)["png"]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    pixels = matplotlib.image.imread(png)
    height, width = pixels.shape[:2]
    assert width > 100 and height > 100


def test_report_without_pairs_or_overall_still_writes(tmp_path: Path) -> None:
    empty = Decision(
        verdict="rejected", reasons=["no paired items"], rule={}, overall=None, suites=[]
    )
    only_candidate = [r for r in results() if r.arm == "candidate"]
    paths = write(tmp_path, decision=empty, results=only_candidate)
    document = json.loads(paths["json"].read_text(encoding="utf-8"))
    assert all(item["difference"] is None for item in document["items"])
    assert all(item["baseline_mean"] is None for item in document["items"])
    text = paths["markdown"].read_text(encoding="utf-8")
    assert "_no paired items_" in text and "## Largest losses (0 of 0)" in text
    assert paths["png"].read_bytes()[:4] == b"\x89PNG"


def test_passed_verdict_and_odd_meta(tmp_path: Path) -> None:
    meta = {**META, "when": None, "rule": {"min_items": 20}, "path": tmp_path}
    paths = write(tmp_path, decision=decision("passed"), meta=meta)
    text = paths["markdown"].read_text(encoding="utf-8")
    assert "## Verdict: **PASSED**" in text
    assert '| rule | {"min_items": 20} |' in text
    assert json.loads(paths["json"].read_text(encoding="utf-8"))["meta"]["path"] == str(tmp_path)


def test_compare_items_uses_the_first_repeat_output() -> None:
    rows = [r for r in results() if r.item_key == "file:faq/q5"]
    [item] = compare_items(list(reversed(rows)))
    assert item.outputs == {
        "candidate": "candidate says | 5 r0\nmore",
        "baseline": "baseline says | 5 r0\nmore",
    }
    assert item.difference == pytest.approx(-0.25)


def test_missing_matplotlib_says_how_to_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_import = builtins.__import__

    def no_matplotlib(name: str, *args: Any, **kwargs: Any) -> Any:
        if name == "matplotlib" or name.startswith("matplotlib."):
            raise ImportError(f"No module named {name!r}")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_matplotlib)
    with pytest.raises(PlotUnavailableError) as info:
        write(tmp_path)
    assert isinstance(info.value, ReefError)
    assert "pip install 'reef-agent[report]'" in info.value.message
    assert not (tmp_path / "report").exists()  # nothing half-written
