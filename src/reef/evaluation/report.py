"""A comparison report for people: JSON for tools, Markdown to read, a PNG to glance at.

``write_report`` puts ``report.json``, ``report.md`` and ``differences.png`` in one
directory. The PNG needs matplotlib (the ``report`` extra); it is drawn on its own
``Figure`` with the Agg canvas, so no pyplot global state is touched.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from reef.core.errors import MissingExtraError, optional_dependency
from reef.evaluation.values import ARMS, Arm, Decision, ItemResult, SuiteSummary

if TYPE_CHECKING:
    from matplotlib.figure import Figure

SCHEMA_VERSION = 1
PNG_NAME = "differences.png"
_META_ORDER = ("scenario", "candidate", "baseline", "suites", "repeats", "when")
_LISTED = 10
_OUTPUT_CHARS = 120


class PlotUnavailableError(MissingExtraError):
    """matplotlib is not installed, so the report's PNG cannot be drawn."""


@dataclass(frozen=True)
class ItemComparison:
    """Both arms on one item: each arm's mean score over its repeats (None when it has
    none), the difference candidate - baseline (None unless both arms answered), each
    arm's output on its first repeat and every error."""

    key: str
    suite: str
    candidate_mean: float | None
    baseline_mean: float | None
    outputs: dict[Arm, str | None]
    errors: tuple[dict[str, Any], ...] = ()

    @property
    def difference(self) -> float | None:
        """candidate - baseline of the means, None unless both arms answered."""
        if self.candidate_mean is None or self.baseline_mean is None:
            return None
        return self.candidate_mean - self.baseline_mean

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form (an entry of the report's ``items``)."""
        return {
            "key": self.key,
            "suite": self.suite,
            "candidate_mean": self.candidate_mean,
            "baseline_mean": self.baseline_mean,
            "difference": self.difference,
            "outputs": {arm: self.outputs.get(arm) for arm in ARMS},
            "errors": list(self.errors),
        }


def compare_items(results: Sequence[ItemResult]) -> list[ItemComparison]:
    """Per-item comparisons, items in the order they first appear in ``results``."""
    grouped: dict[str, list[ItemResult]] = {}
    for result in results:
        grouped.setdefault(result.item_key, []).append(result)
    return [_compare(rows) for rows in grouped.values()]


def _compare(rows: list[ItemResult]) -> ItemComparison:
    means: dict[Arm, float] = {}
    outputs: dict[Arm, str | None] = {}
    for arm in ARMS:
        mine = sorted((r for r in rows if r.arm == arm), key=lambda r: r.repeat)
        if mine:
            means[arm] = sum(r.score for r in mine) / len(mine)
            outputs[arm] = mine[0].output
    errors = tuple(
        {"arm": r.arm, "repeat": r.repeat, "error": r.error} for r in rows if r.error is not None
    )
    return ItemComparison(
        key=rows[0].item_key,
        suite=rows[0].suite,
        candidate_mean=means.get("candidate"),
        baseline_mean=means.get("baseline"),
        outputs=outputs,
        errors=errors,
    )


def write_report(
    directory: Path,
    *,
    title: str,
    meta: Mapping[str, Any],
    decision: Decision,
    results: Sequence[ItemResult],
) -> dict[str, Path]:
    """Write ``report.json``, ``report.md`` and ``differences.png`` into ``directory``
    (created if missing; files there are replaced) and return their paths as
    ``{"json": …, "markdown": …, "png": …}``.

    ``meta`` describes the run (``scenario``, ``candidate``, ``baseline``, ``suites``,
    ``repeats``, ``when``; other keys are shown too). Raises ``PlotUnavailableError``,
    before writing anything, when matplotlib is not installed.
    """
    _require_matplotlib()
    directory.mkdir(parents=True, exist_ok=True)
    items = compare_items(results)
    paths = {
        "json": directory / "report.json",
        "markdown": directory / "report.md",
        "png": directory / PNG_NAME,
    }
    document = {
        "schema_version": SCHEMA_VERSION,
        "title": title,
        "meta": dict(meta),
        "decision": decision.as_dict(),
        "items": [item.as_dict() for item in items],
        "results": [result.as_dict() for result in results],
    }
    text = json.dumps(document, indent=2, ensure_ascii=False, default=str)
    paths["json"].write_text(text + "\n", encoding="utf-8")
    paths["markdown"].write_text(render_markdown(title, meta, decision, items), encoding="utf-8")
    figure = draw_differences(title, decision, items)
    figure.savefig(paths["png"], format="png")
    return paths


# -- markdown ---------------------------------------------------------------------------


def render_markdown(
    title: str, meta: Mapping[str, Any], decision: Decision, items: Sequence[ItemComparison]
) -> str:
    """The Markdown report: meta, verdict and reasons, suites, biggest losses and gains."""
    lines = [f"# {_cell(title)}", "", "| | |", "|---|---|"]
    keys = [k for k in _META_ORDER if k in meta] + [k for k in meta if k not in _META_ORDER]
    lines += [f"| {_cell(key)} | {_cell(_meta_value(meta[key]))} |" for key in keys]
    lines += ["", f"## Verdict: **{decision.verdict.upper()}**", ""]
    lines += [f"- {_line(reason)}" for reason in decision.reasons]
    if decision.safety:
        lines += ["", "Safety findings:", ""] + [f"- {_line(s)}" for s in decision.safety]
    lines += ["", "## Suites", "", *_suite_table(decision)]
    lines += _evidence_lines(decision.evidence)
    paired = sorted(
        ((d, item) for item in items if (d := item.difference) is not None), key=lambda p: p[0]
    )
    losses = [item for d, item in paired if d < 0]
    gains = [item for d, item in sorted(paired, key=lambda p: -p[0]) if d > 0]
    lines += ["", f"## Largest losses ({min(len(losses), _LISTED)} of {len(losses)})", ""]
    lines += _item_table(losses[:_LISTED])
    lines += ["", f"## Largest gains ({min(len(gains), _LISTED)} of {len(gains)})", ""]
    lines += _item_table(gains[:_LISTED])
    lines += ["", "## Per-item differences", "", f"![per-item differences]({PNG_NAME})", ""]
    return "\n".join(lines)


def candidate_summary(
    candidate_id: str, state: str, evidence: Mapping[str, Any] | None
) -> list[str]:
    """Plain-text lines for a terminal: the gate's verdict and reasons, where its
    evidence came from (sources, leave-one-author-out) and the learning job's screening
    counts (``reef eval show``)."""
    evidence = evidence or {}
    gate = evidence.get("gate") or {}
    decision = gate.get("decision") or {}
    lines = [f"candidate {candidate_id}: {state}"]
    if decision:
        lines.append(f"verdict: {decision.get('verdict')} (evaluation {gate.get('evaluation_id')})")
        lines += [f"  - {reason}" for reason in decision.get("reasons") or []]
        lines += [f"missing: {what}" for what in decision.get("missing") or []]
        lines += _plain_growth(gate, decision)
        lines += _plain_evidence(decision)
    else:
        lines.append("verdict: not evaluated by the gate")
    selection = evidence.get("selection") or {}
    counts = {k: v for k, v in selection.items() if k.startswith(("screened:", "quarantined"))}
    if counts:
        lines.append(
            "screening: " + ", ".join(f"{key} {value}" for key, value in sorted(counts.items()))
        )
    elif selection:
        lines.append("screening: nothing flagged")
    return lines


def _plain_growth(gate: Mapping[str, Any], decision: Mapping[str, Any]) -> list[str]:
    """The evidence as it grew, one line per look (items per suite, voids), then the
    void items by kind and each protected slice."""
    lines = []
    for look in gate.get("history") or []:
        suites = ", ".join(f"{suite} {n}" for suite, n in (look.get("suites") or {}).items())
        lines.append(
            f"look {look.get('at')}: {look.get('verdict')}, {look.get('items')} paired items"
            f" ({suites or 'none'}), {look.get('void', 0)} void, gain {_score(look.get('gain'))}"
        )
    voids = decision.get("voids") or {}
    if voids.get("void"):
        kinds = ", ".join(f"{kind} {n}" for kind, n in (voids.get("by_kind") or {}).items())
        lines.append(f"void: {voids['void']} of {voids.get('items')} items ({kinds})")
    for row in decision.get("slices") or []:
        change = f", change {row['change']:+.3f}" if "change" in row else ""
        lines.append(
            f"protected slice {row['tag']}: {row['status']}, {row['items']} items{change} "
            f"(max_regression {row['max_regression']:.3f})"
        )
    return lines


def _plain_evidence(decision: Mapping[str, Any]) -> list[str]:
    found = decision.get("evidence") or {}
    lines = []
    for row in found.get("sources") or []:
        by_trust = ", ".join(f"{level} {n}" for level, n in row["by_trust"].items())
        authors = ", ".join(f"{name} {n}" for name, n in list(row["authors"].items())[:8])
        lines.append(
            f"evidence {row['suite']} ({row['source']}): {row['items']} items, {by_trust}"
            + (f"; authors {authors}" if authors else "")
        )
    if found.get("sources"):
        lines.append(f"trusted at or above: {found.get('min_trust')}")
    for check in found.get("leave_one_out") or []:
        lines.append(
            f"without {check['author']} ({check['items_removed']} items): {check['verdict']}, "
            f"gain {_score(check['gain'])} on {check['items_left']} items"
        )
    return lines


def _evidence_lines(evidence: Mapping[str, Any]) -> list[str]:
    """Where the evidence came from and the leave-one-author-out checks."""
    sources = evidence.get("sources") or []
    if not sources:
        return []
    lines = [
        "",
        f"## Evidence (trusted at or above {_cell(str(evidence.get('min_trust')))})",
        "",
        "| suite | source | items | by trust | authors |",
        "|---|---|---|---|---|",
    ]
    for row in sources:
        by_trust = ", ".join(f"{level} {n}" for level, n in row["by_trust"].items())
        authors = ", ".join(f"{name} {n}" for name, n in list(row["authors"].items())[:8])
        lines.append(
            f"| {_cell(row['suite'])} | {_cell(row['source'])} | {row['items']} | "
            f"{_cell(by_trust)} | {_cell(authors or '-')} |"
        )
    checks = evidence.get("leave_one_out") or []
    if checks:
        lines += ["", "Leave-one-author-out:", ""]
        lines += [
            f"- without {_cell(check['author'])} ({check['items_removed']} items): "
            f"{check['verdict']}, gain {_score(check['gain'])} on {check['items_left']} items"
            for check in checks
        ]
    return lines


def _suite_table(decision: Decision) -> list[str]:
    rows = ([decision.overall] if decision.overall is not None else []) + decision.suites
    if not rows:
        return ["_no paired items_"]
    lines = [
        "| suite | items | candidate | baseline | gain | interval |",
        "|---|---:|---:|---:|---:|---|",
    ]
    for summary in rows:
        name = "**overall**" if summary is decision.overall else _cell(summary.suite)
        lines.append(_suite_row(name, summary))
    return lines


def _suite_row(name: str, summary: SuiteSummary) -> str:
    gain = summary.difference
    interval = f"{gain.confidence:.0%} [{gain.low:+.3f}, {gain.high:+.3f}]"
    return (
        f"| {name} | {summary.items} | {summary.candidate_mean:.3f} | "
        f"{summary.baseline_mean:.3f} | {gain.mean:+.3f} | {interval} |"
    )


def _item_table(items: Sequence[ItemComparison]) -> list[str]:
    if not items:
        return ["_none_"]
    lines = [
        "| item | candidate | baseline | gain | candidate output | baseline output |",
        "|---|---:|---:|---:|---|---|",
    ]
    for item in items:
        lines.append(
            f"| {_cell(item.key)} | {_score(item.candidate_mean)} | "
            f"{_score(item.baseline_mean)} | {item.difference or 0.0:+.3f} | "
            f"{_cell(_shorten(item.outputs.get('candidate')))} | "
            f"{_cell(_shorten(item.outputs.get('baseline')))} |"
        )
    return lines


def _meta_value(value: Any) -> str:
    if isinstance(value, list | tuple):
        return ", ".join(str(v) for v in value)
    if isinstance(value, dict):
        return json.dumps(value, ensure_ascii=False, default=str)
    return str(value)


def _score(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def _shorten(text: str | None) -> str:
    if text is None:
        return "(no answer)"
    flat = " ".join(text.split())
    return flat if len(flat) <= _OUTPUT_CHARS else flat[: _OUTPUT_CHARS - 1] + "…"


def _line(text: str) -> str:
    """One line of Markdown prose: no line breaks, no raw HTML."""
    return " ".join(text.split()).replace("<", "&lt;")


def _cell(text: str) -> str:
    """A table cell: one line, ``|`` escaped, no raw HTML."""
    return _line(text).replace("|", "\\|")


# -- the plot --------------------------------------------------------------------------


def _require_matplotlib() -> None:
    with optional_dependency("report", "the evaluation report's plot", PlotUnavailableError):
        import matplotlib  # noqa: F401


def draw_differences(title: str, decision: Decision, items: Sequence[ItemComparison]) -> Figure:
    """Per-item differences sorted, green above zero and red below, with the mean gain
    and its interval shaded. Raises ``PlotUnavailableError`` without matplotlib."""
    _require_matplotlib()
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(10, 5), dpi=100, layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    diffs = sorted(d for item in items if (d := item.difference) is not None)
    colors = ["#2e7d32" if d > 0 else "#c62828" if d < 0 else "#9e9e9e" for d in diffs]
    if diffs:
        axes.bar(range(len(diffs)), diffs, width=1.0 if len(diffs) > 50 else 0.8, color=colors)
    else:
        axes.text(0.5, 0.5, "no paired items", ha="center", va="center")
    axes.axhline(0.0, color="black", linewidth=0.8)
    if decision.overall is not None:
        gain = decision.overall.difference
        label = f"mean gain {gain.mean:+.3f}, {gain.confidence:.0%} interval"
        axes.axhspan(gain.low, gain.high, color="#1565c0", alpha=0.15, label=label, zorder=0)
        axes.axhline(gain.mean, color="#1565c0", linestyle="--", linewidth=1.2)
        axes.legend(loc="upper left")
    axes.set_xlabel(f"items, sorted by difference ({len(diffs)})")
    axes.set_ylabel("candidate - baseline (mean over repeats)")
    axes.set_title(f"{title}: {decision.verdict}", color=_verdict_color(decision))
    return figure


def _verdict_color(decision: Decision) -> str:
    if decision.undecided:
        return "#ef6c00"
    return "#2e7d32" if decision.passed else "#c62828"
