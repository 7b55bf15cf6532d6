"""What the quickstart shows and leaves behind: a line per round on the console, the
summary table, ``learning_curve.png``, ``report.html`` (self-contained: inline CSS, the
PNG embedded) and ``summary.json`` (every figure, for tools).
"""

from __future__ import annotations

import base64
import html
import io
import json
from dataclasses import asdict, dataclass, field
from typing import Any

from rich.console import Console
from rich.table import Table

from reef.quickstart.rounds import HeldOut, RoundResult, Signals
from reef.quickstart.workspace import Workspace


@dataclass(frozen=True)
class Words:
    """A task's names in the report: its ``unit`` (tickets, episodes), its ``metric``
    (accuracy, episode success), its ``title`` and the curve's ``axis``."""

    unit: str
    metric: str
    title: str
    axis: str


TRIAGE_WORDS = Words("tickets", "accuracy", "support-ticket triage", "accuracy (exact label)")
AGENT_WORDS = Words(
    "episodes",
    "episode success",
    "an order-support agent with tools",
    "episode success (right call, right answer)",
)


@dataclass
class Run:
    """The whole quickstart run, as measured."""

    model: str
    rounds_planned: int
    requests: int
    heldout_size: int
    seed: int
    base: HeldOut | None = None
    rounds: list[RoundResult] = field(default_factory=list)
    seconds: float = 0.0
    startup_seconds: float = 0.0
    load: str = ""
    feedback: str = "explicit"
    task: str = "triage"
    cpu_seconds: float = 0.0
    dtype: str = ""  # the precision the engine reported serving in (GET /health)
    backend: str = ""  # what runs the model (GET /health): eager, openvino (backend: auto)

    @property
    def words(self) -> Words:
        """How the report names the task's units and measure."""
        return AGENT_WORDS if self.task == "agent" else TRIAGE_WORDS

    @property
    def final(self) -> HeldOut | None:
        """Held-out accuracy of what serves at the end."""
        measured = [r.heldout for r in self.rounds if r.heldout is not None]
        return measured[-1] if measured else self.base


def short(digest: str | None) -> str:
    """``sha256:1a2b3c4d`` from a full digest; ``-`` for none."""
    if not digest:
        return "-"
    algorithm, _, value = digest.partition(":")
    return f"{algorithm}:{value[:8]}" if value else digest[:15]


def plural(count: int, noun: str) -> str:
    """``1 round``, ``3 rounds``."""
    return f"{count} {noun}" + ("" if count == 1 else "s")


def _evidence_items(decision: dict[str, Any]) -> str:
    """What the gate's items were: held-out traffic, or the operator's suite."""
    suites = [str(suite.get("suite", "")) for suite in decision.get("suites") or ()]
    if not suites:  # a decision stored before current suites were listed: its evidence names them
        sources = (decision.get("evidence") or {}).get("sources") or ()
        suites = [str(source.get("suite", "")) for source in sources]
    if suites and all(name.startswith("file:") for name in suites):
        return "suite items"
    return "held-out traffic items"


def gate_line(result: RoundResult) -> str:
    """What the gate decided and why, in one line."""
    if result.job_state != "succeeded":
        return f"learning job {result.job_state}: {result.job_error or 'no result'}"
    if result.outcome != "proposed":
        return f"no candidate ({result.outcome}): the learners changed nothing"
    decision = result.gate.get("decision") or {}
    action = result.gate_action or "?"
    overall = decision.get("overall")
    evidence = ""
    if overall:
        diff = overall["difference"]
        evidence = (
            f": candidate {overall['candidate_mean']:.0%} vs serving "
            f"{overall['baseline_mean']:.0%} on {overall['items']} "
            f"{_evidence_items(decision)}, gain "
            f"{diff['mean']:+.0%} ({diff['confidence']:.0%} CI "
            f"{diff['low']:+.0%}..{diff['high']:+.0%})"
        )
    if action == "published":
        rule = decision.get("rule") or {}
        why = (
            f"the gain clears min_improvement {rule.get('min_improvement', 0):.0%} and its "
            "interval lies above zero"
        )
    else:
        why = "; ".join(decision.get("reasons") or []) or "no decision recorded"
    return f"{action}{evidence} — {why}"


def _trained(result: RoundResult) -> tuple[str, str, float] | None:
    """The round's model training, from the last learner that reports a loss curve: the
    learner's name, ``"<n> examples, <k> steps, loss <first> → <last>"`` and its seconds
    (None: no learner trained a model)."""
    trained = None
    for name, metrics in result.learners.items():
        if isinstance(metrics, dict) and "loss_curve" in metrics:
            curve = metrics["loss_curve"]
            summary = (
                f"{metrics.get('examples')} examples, {len(curve)} steps, "
                f"loss {curve[0]:.2f} → {curve[-1]:.2f}"
            )
            trained = (name.split(":")[-1], summary, float(metrics.get("seconds", 0)))
    return trained


def round_line(result: RoundResult, words: Words = TRIAGE_WORDS) -> str:
    """The console's account of one round (rich markup)."""
    color = {"published": "green", "rejected": "red"}.get(result.gate_action or "", "yellow")
    trained = _trained(result)
    training = "" if trained is None else f"{trained[0]} trained on {trained[1]}; "
    given = (
        f"{result.feedback or result.traffic} feedback ({result.corrections} corrections)"
        if result.signals is None
        else f"no feedback, {result.follow_ups} user replies"
    )
    lines = [
        f"[bold]Round {result.number}[/bold]: {result.traffic} {words.unit} served "
        f"({result.traffic_accuracy:.0%} right), {given} in {result.traffic_seconds:.0f} s; "
        f"learning + gate {result.learn_seconds:.0f} s",
        f"  {training}gate: [{color}]{html.escape(gate_line(result), quote=False)}[/{color}]",
    ]
    if result.signals is not None:
        lines.append(f"  signals: {signals_line(result.signals)}")
    if result.heldout is not None:
        lines.append(
            f"  held-out {words.metric} of the serving release (seq {result.heldout.seq}): "
            f"[bold]{result.heldout.accuracy:.0%}[/bold] "
            f"({result.heldout.correct}/{result.heldout.total})"
        )
    return "\n".join(lines)


def signals_line(signals: Signals) -> str:
    """How the conversation signals read the users, measured against the truth."""

    def share(value: float | None) -> str:
        return "-" if value is None else f"{value:.0%}"

    return (
        f"{signals.flagged} answers called wrong, precision {share(signals.precision)}, "
        f"recall {share(signals.recall)} of {signals.wrong} wrong answers; "
        f"{signals.corrections_right}/{signals.corrections} extracted corrections right"
    )


def rows(run: Run) -> list[dict[str, str]]:
    """The summary table: the first release, then each round's candidate."""
    table: list[dict[str, str]] = []
    if run.base is not None:
        table.append(
            {
                "release": f"#{run.base.seq} {run.base.release_id[-8:]} (initial)",
                "components": f"{run.model} + initial harness",
                "heldout": f"{run.base.accuracy:.0%}",
                "gate": "first release: no gate",
            }
        )
    for result in run.rounds:
        components = ", ".join(
            f"{kind} {short(digest)}" + (" (new)" if kind in result.new_components else "")
            for kind, digest in result.components.items()
            if digest
        )
        if result.published_release_id is not None and result.heldout is not None:
            release = (
                f"#{result.heldout.seq} {result.published_release_id[-8:]} (round {result.number})"
            )
            heldout = f"{result.heldout.accuracy:.0%}"
        else:
            cid = result.candidate_id[-8:] if result.candidate_id else "-"
            release = f"candidate {cid} (round {result.number}, not published)"
            heldout = "not serving"
        table.append(
            {
                "release": release,
                "components": components or "-",
                "heldout": heldout,
                "gate": gate_line(result),
            }
        )
    return table


def summary_table(run: Run) -> Table:
    """The console's summary table."""
    table = Table(title="Reef quickstart: releases", show_lines=True)
    table.add_column("release")
    table.add_column("components")
    table.add_column(f"held-out {run.words.metric}", justify="right")
    table.add_column("gate evidence")
    for row in rows(run):
        table.add_row(row["release"], row["components"], row["heldout"], row["gate"])
    return table


def headline(run: Run) -> str:
    """Before/after in one line."""
    if run.base is None or run.final is None:
        return "no held-out measurement"
    graded = "" if run.feedback == "explicit" else ", no feedback posted (signals only)"
    cpu = f" ({run.cpu_seconds / 60:.1f} CPU min)" if run.cpu_seconds else ""
    return (
        f"held-out {run.words.metric} {run.base.accuracy:.0%} → {run.final.accuracy:.0%} "
        f"({run.final.accuracy - run.base.accuracy:+.0%}) in {run.seconds / 60:.1f} min{cpu}, "
        f"{plural(len(run.rounds), 'round')} on {run.model}{graded}"
    )


def draw_curve(run: Run) -> bytes:
    """``learning_curve.png``: held-out accuracy of the serving release after each
    round, live-traffic accuracy during it, and each gate decision."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(8, 4.5), dpi=100, layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    points = [(0, run.base)] + [(r.number, r.heldout) for r in run.rounds]
    measured = [(x, h.accuracy) for x, h in points if h is not None]
    axes.plot(
        [x for x, _ in measured],
        [y for _, y in measured],
        marker="o",
        color="#1565c0",
        label=f"held-out {run.words.metric} of the serving release",
    )
    live = [(r.number - 0.5, r.traffic_accuracy) for r in run.rounds if r.traffic]
    if live:
        axes.plot(
            [x for x, _ in live],
            [y for _, y in live],
            marker="s",
            linestyle=":",
            color="#757575",
            label=f"live {run.words.unit} right (during the round)",
        )
    for result in run.rounds:
        if result.heldout is None:
            continue
        action = result.gate_action or "no candidate"
        color = {"published": "#2e7d32", "rejected": "#c62828"}.get(action, "#f9a825")
        axes.annotate(
            action,
            (result.number, result.heldout.accuracy),
            textcoords="offset points",
            xytext=(0, 10),
            ha="center",
            color=color,
            fontsize=9,
        )
    axes.set_xlim(-0.3, len(run.rounds) + 0.3)
    axes.set_xticks(range(len(run.rounds) + 1))
    axes.set_xticklabels(["base"] + [f"round {r.number}" for r in run.rounds])
    axes.set_ylim(-0.02, 1.08)
    axes.set_ylabel(run.words.axis)
    axes.set_title(f"Reef quickstart: {run.words.title} on {run.model}")
    axes.grid(alpha=0.3)
    axes.legend(loc="upper left", fontsize=8)
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png")
    return buffer.getvalue()


_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,sans-serif;margin:2rem auto;max-width:70rem;
color:#212121;padding:0 1rem}
h1{font-size:1.6rem}h2{font-size:1.2rem;margin-top:2rem}
table{border-collapse:collapse;width:100%;font-size:.9rem}
th,td{border:1px solid #ddd;padding:.4rem .6rem;text-align:left;vertical-align:top}
th{background:#f5f5f5}.published{color:#2e7d32}.rejected{color:#c62828}
.headline{font-size:1.2rem;background:#e3f2fd;padding:.8rem 1rem;border-radius:.4rem}
pre{background:#fafafa;border:1px solid #eee;padding:.8rem;overflow-x:auto;font-size:.8rem}
img{max-width:100%}code{background:#f5f5f5;padding:0 .2rem}
"""


def render_html(run: Run, png: bytes, files: dict[str, str]) -> str:
    """``report.html``: self-contained (inline CSS, the PNG as a data URI)."""
    esc = html.escape
    words = run.words
    release_rows = "".join(
        "<tr>"
        + "".join(f"<td>{esc(row[key])}</td>" for key in ("release", "components", "heldout"))
        + f'<td class="{_gate_class(row["gate"])}">{esc(row["gate"])}</td></tr>'
        for row in rows(run)
    )
    round_rows = "".join(_round_row(result) for result in run.rounds)
    config = "".join(f"<h3>{esc(name)}</h3><pre>{esc(text)}</pre>" for name, text in files.items())
    image = base64.b64encode(png).decode()
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Reef quickstart report</title>
<style>{_CSS}</style></head><body>
<h1>Reef quickstart: {esc(words.title)}</h1>
<p class="headline">{esc(headline(run))}</p>
<p>Model <code>{esc(run.model)}</code> on the embedded engine ({esc(run.backend or "?")},
{esc(run.dtype or "?")});
{plural(run.rounds_planned, "round")} of {run.requests} {words.unit}; held-out set of
{run.heldout_size} {words.unit}; seed {run.seed}; total
{run.seconds:.0f} s (start-up {run.startup_seconds:.0f} s), {run.cpu_seconds / 60:.1f} CPU
minutes (the quickstart, the engine and the training processes); load average at the
start: {esc(run.load)}.</p>
<img src="data:image/png;base64,{image}" alt="learning curve">
<h2>Releases</h2>
<table><tr><th>release</th><th>components</th><th>held-out {words.metric}</th>
<th>gate evidence</th></tr>{release_rows}</table>
<h2>Rounds</h2>
<table><tr><th>round</th><th>traffic (right)</th><th>feedback (corrections)</th><th>training</th>
<th>gate</th><th>learning + gate</th><th>held-out after</th></tr>{round_rows}</table>
<h2>What is measured</h2>
{_measured(run)}
<h2>Configuration</h2>{config}
</body></html>
"""


def _measured(run: Run) -> str:
    """The report's account of what its figures mean, per task."""
    if run.task == "agent":
        return _AGENT_MEASURED.format(heldout=run.heldout_size)
    return f"""<ul>
<li><b>Held-out accuracy</b>: {run.heldout_size} tickets written from phrasings reserved for
this set (<code>heldout.jsonl</code>): never sent as traffic, never part of the gate's
evidence. Each is asked through the gateway pinned to the serving release
(<code>x-reef-release</code>) with <code>x-reef-purpose: eval</code>, so it is recorded but
never trained on; the base release is measured the same way. An answer counts when,
normalized like the <code>normalized_exact</code> scorer, it is exactly the label.</li>
<li><b>Gate evidence</b>: the candidate and the serving release answer the scenario's
held-out <i>traffic</i> (a quarter of the sessions, by hash, never trained on), paired;
the candidate is published only when the mean gain is at least the recipe's
<code>min_improvement</code> and the lower bound of its bootstrap interval is above zero.</li>
<li><b>Training data</b>: the other three quarters of the traffic with the application's
feedback: its corrections, and its replies graded right.</li>
</ul>"""


_AGENT_MEASURED = """<ul>
<li><b>Episodes</b>: a customer request to the order-support agent, offered three tools
(<code>lookup_order</code>, <code>check_stock</code>, <code>open_return</code>). The
application's own loop (the official OpenAI SDK) sends the request with the tools, runs
every call the model makes against the shop and sends its result back, at most three
model calls, all in one session (<code>x-reef-session</code>).</li>
<li><b>The application grades outcomes</b>: an episode succeeds when the first turn makes
exactly the right call (tool and arguments) and the next turn answers in text naming the
fact the tool returned (the order's status, the units in stock, the return's id). It posts
that outcome on the session (score 1 or 0) and, for a failure, a correction on the turn
that went wrong: the right call (<code>{{"tool_calls": [...]}}</code>) or the right
sentence. The recipe's <code>credit: outcome</code> gives each turn the outcome's
score. When the first turn missed the call, the app still serves the customer: it makes
the right call itself and asks the model for the answer (a session of its own), and
grades that answer too (score 1, or 0 with the right sentence). Held-out episodes never
fall back.</li>
<li><b>Held-out episode success</b>: {heldout} requests written from phrasings reserved
for this set, about orders no other request names (<code>heldout.jsonl</code>): never
sent as traffic, never part of the gate's evidence. Every turn is pinned to the serving
release (<code>x-reef-release</code>) with <code>x-reef-purpose: eval</code>, so it is
recorded but never trained on; the base release is measured the same way.</li>
<li><b>Gate evidence</b>: the operator's suite (<code>suite.jsonl</code>): other
requests in held-out phrasings, each asked as its first turn (scored by
<code>tool_call</code>) and as its answer after the right call's result (scored by
<code>contains</code>), paired; the candidate is published only when the mean gain is at
least the recipe's <code>min_improvement</code> and the lower bound of its bootstrap
interval is above zero.</li>
<li><b>Training data</b>: every traffic episode's turns with the outcome's credit (the
corrections, and the turns of successful episodes) and the graded fallback answers.</li>
</ul>"""


def _gate_class(text: str) -> str:
    return (
        "published"
        if text.startswith("published")
        else ("rejected" if text.startswith("rejected") else "")
    )


def _round_row(result: RoundResult) -> str:
    esc = html.escape
    trained = _trained(result)
    training = "-" if trained is None else f"{trained[0]}: {trained[1]}, {trained[2]:.0f} s"
    after = (
        f"{result.heldout.accuracy:.0%} (release #{result.heldout.seq})"
        if result.heldout is not None
        else "-"
    )
    gate = gate_line(result)
    given = (
        f"{result.feedback or result.traffic} ({result.corrections})"
        if result.signals is None
        else f"none posted; signals: {signals_line(result.signals)}"
    )
    return (
        f"<tr><td>{result.number}</td><td>{result.traffic} ({result.traffic_accuracy:.0%})</td>"
        f"<td>{esc(given)}</td><td>{esc(training)}</td>"
        f'<td class="{_gate_class(gate)}">{esc(gate)}</td>'
        f"<td>{result.learn_seconds:.0f} s</td><td>{esc(after)}</td></tr>"
    )


def write_reports(run: Run, workspace: Workspace) -> None:
    """``learning_curve.png``, ``report.html`` and ``summary.json`` in the workspace."""
    png = draw_curve(run)
    workspace.curve_png.write_bytes(png)
    files = {
        name: (workspace.root / name).read_text(encoding="utf-8")
        for name in ("reef.yaml", "recipe.yaml", "harness/harness.yaml")
    }
    workspace.report_html.write_text(render_html(run, png, files), encoding="utf-8")
    workspace.summary_json.write_text(json.dumps(_summary(run), indent=2) + "\n")


def _summary(run: Run) -> dict[str, Any]:
    data = asdict(run)
    data["headline"] = headline(run)
    for result, row in zip(run.rounds, data["rounds"], strict=True):
        if result.signals is not None:
            row["signals"].update(precision=result.signals.precision, recall=result.signals.recall)
    data["final"] = None if run.final is None else asdict(run.final)
    for held in [data["base"], data["final"], *(r["heldout"] for r in data["rounds"])]:
        if held:
            held["accuracy"] = held["correct"] / held["total"] if held["total"] else 0.0
    return data


def print_summary(console: Console, run: Run, workspace: Workspace, port: int) -> None:
    """The summary table, the headline, where the files are and how to serve them
    (``port``: the one the folder's reef.yaml names)."""
    console.print()
    console.print(summary_table(run))
    console.print(f"[bold]{headline(run)}[/bold]")
    console.print(
        f"report: {workspace.report_html}\nlearning curve: {workspace.curve_png}\n"
        f"serve what it learned: cd {workspace.root} && reef serve "
        f"(gateway on http://127.0.0.1:{port}/v1, as its reef.yaml says)"
    )
