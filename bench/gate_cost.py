"""What one gate decision costs: model calls and seconds, next to the bare model calls.

    .venv/bin/python bench/gate_cost.py --model smollm2-135m,tiny-random --items 40 \
        --concurrency 4 --runs 2 --output docs/benchmarks.md

``--model`` takes one model or several, benched one after the other (``tiny-random``
alone is a quick check; its calls are so fast that the gate's own cost shows).
Everything runs in this process, on loopback: the embedded engine (``--model``, a
``BackgroundServer``) and a real gateway (uvicorn in a thread, SQLite, capture on) in
front of it, serving scenario ``triage`` with ``harness: managed``. Each run proposes a
harness-only candidate (a system prompt listing the six labels) against the head (no
harness) and times ``Gate.run`` on a file suite of ``--items`` support tickets (scorer
``contains``, holdout off, publish ``review`` so the head never moves).

The baseline, measured side by side in the same run, sends the same chat completions
straight to the engine with aiohttp, at the same concurrency and in the same order: both
arms of every item (the candidate's system prompt put into its messages here, as the
gateway renders it) and then the leak probes to the candidate, with no gateway, scoring
or storage. Runs alternate which side goes first. The gate's time is split by phase
(calls, scoring, storage, the rest) to show where it goes.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import signal
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import aiohttp
import uvicorn

sys.path.insert(0, str(Path(__file__).resolve().parent))
import engine_vs_vllm as side  # bench/engine_vs_vllm.py: machine(), load(), interrupt()
from sections import write_between

from reef.config import ReefSettings
from reef.db import open_database
from reef.evaluation.config import GateConfig
from reef.evaluation.episode_evidence import EpisodeRun
from reef.evaluation.gate import Gate, GateOutcome
from reef.evaluation.results import EvaluationStore
from reef.evaluation.runner import GatewayTarget, reply_text
from reef.evaluation.safety import leak_probe_items
from reef.evaluation.suites import load_suite
from reef.evaluation.values import Answer, Arm, Decision, EvalItem, ItemResult
from reef.experience import SQLExperienceStore
from reef.gateway import create_app
from reef.harness import Bundle, Harness, pack_bundle, render_openai
from reef.releases import ArtifactStore, ReleaseChain, open_artifact_store
from reef.upstream import build_upstream

START = "<!-- gate:start -->"
END = "<!-- gate:end -->"
SCENARIO = "triage"
LABELS = ("billing", "account", "shipping", "refund", "technical", "cancellation")
SYSTEM_PROMPT = (
    "You triage customer support tickets. Read the ticket and answer with exactly one "
    "label, in lower case, and nothing else. The labels are: " + ", ".join(LABELS) + "."
)
TEMPLATES: dict[str, tuple[str, ...]] = {
    "billing": (
        "I was charged twice for order {n}, please check my card.",
        "My invoice for {month} shows a fee I do not recognise on my {product} plan.",
    ),
    "account": (
        "I cannot log in since {month}; the password reset email never arrives.",
        "My account got locked after I tried to sign in from my {product}.",
    ),
    "shipping": (
        "Order {n} has not arrived and the tracking has not moved for a week.",
        "Can you ship my {product} to a different address?",
    ),
    "refund": (
        "The {product} arrived broken, I want my money back for order {n}.",
        "I returned order {n} in {month} and still have not been paid back.",
    ),
    "technical": (
        "The {product} app crashes every time I open the settings page.",
        "I get error {n} when I try to upload a file from my {product}.",
    ),
    "cancellation": (
        "Please cancel my {product} subscription before the next renewal.",
        "I want to close my plan at the end of {month}, how do I do that?",
    ),
}
PRODUCTS = ("headphones", "router", "tablet", "camera", "smart watch", "printer")
MONTHS = ("January", "March", "May", "July", "September", "November")
REQUEST_TIMEOUT_S = 120.0
PHASES = ("calls: items", "calls: leak probes", "scoring", "storage", "deciding", "other")


# -- the world: engine, gateway, candidate, suite ----------------------------------------


def write_suite(path: Path, count: int, seed: int) -> Path:
    """``count`` tickets, the labels in turn, each from a template with filled slots."""
    rng = random.Random(seed)
    lines = []
    for i in range(count):
        label = LABELS[i % len(LABELS)]
        text = rng.choice(TEMPLATES[label]).format(
            n=rng.randrange(10_000, 99_999), product=rng.choice(PRODUCTS), month=rng.choice(MONTHS)
        )
        lines.append(json.dumps({"id": f"t{i + 1}", "input": text, "reference": label}))
    path.write_text("\n".join(lines) + "\n")
    return path


class GatewayServer:
    """A gateway (uvicorn) on a loopback port in a daemon thread, as in
    ``tests/gateway/harness.py``."""

    def __init__(self, settings: ReefSettings) -> None:
        self.database = open_database(settings.store_url())
        self.store = SQLExperienceStore(self.database)
        upstreams = {name: build_upstream(name, cfg) for name, cfg in settings.upstreams.items()}
        app = create_app(settings, self.database, self.store, upstreams)
        config = uvicorn.Config(
            app,
            host="127.0.0.1",
            port=side.free_port(),
            log_level="warning",
            lifespan="on",
            loop="asyncio",
        )
        self.url = f"http://127.0.0.1:{config.port}"
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, name="gateway", daemon=True)

    def __enter__(self) -> GatewayServer:
        self.thread.start()
        deadline = time.monotonic() + 60
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the gateway did not start")
            time.sleep(0.01)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=20)
        self.store.close()
        self.database.close()


@contextlib.contextmanager
def running_engine(model: str, home: Path, threads: int | None) -> Iterator[tuple[str, float]]:
    """The engine's OpenAI base URL and its load time in seconds."""
    from reef.engine.models import load_model
    from reef.engine.runtime import Engine
    from reef.engine.server import BackgroundServer

    started = time.perf_counter()
    server = BackgroundServer(Engine(load_model(model, home), threads=threads)).start()
    try:
        yield server.base_url, time.perf_counter() - started
    finally:
        server.stop()


def gateway_settings(
    work: Path, engine_url: str, model: str, scenario: str = SCENARIO
) -> ReefSettings:
    config: dict[str, Any] = {
        "home": work / "home",
        "store": {"url": f"sqlite:///{work / 'reef.db'}"},
        "upstreams": {"engine": {"type": "openai", "base_url": engine_url, "model": model}},
        "scenarios": {scenario: {"upstream": "engine", "harness": "managed"}},
    }
    return ReefSettings(**config)


def propose_candidate(
    chain: ReleaseChain, artifacts: ArtifactStore, harness: Harness, scenario: str = SCENARIO
) -> str:
    """A pending candidate: the head with ``harness`` and nothing else changed."""
    head = chain.head(scenario)
    assert head is not None
    digest = artifacts.put_bytes(pack_bundle(Bundle(harness=harness, files={})), "harness")
    manifest = head.manifest.model_copy(update={"harness": digest})
    return chain.propose(scenario, manifest, head.id, "bench", "gate cost bench").id


# -- the gate, timed by phase ------------------------------------------------------------


@dataclass
class Phases:
    """Seconds spent in each named phase (summed over calls)."""

    seconds: dict[str, float] = field(default_factory=dict)

    @contextlib.contextmanager
    def timed(self, name: str) -> Iterator[None]:
        started = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - started


class TimedEvaluationStore(EvaluationStore):
    """An ``EvaluationStore`` that adds its write time to ``phases["storage"]``."""

    def __init__(self, store_engine: Any, phases: Phases) -> None:
        super().__init__(store_engine)
        self.phases = phases

    def start(self, *args: Any, **kwargs: Any) -> str:
        with self.phases.timed("storage"):
            return super().start(*args, **kwargs)

    def add_results(self, evaluation_id: str, results: Sequence[ItemResult]) -> None:
        with self.phases.timed("storage"):
            super().add_results(evaluation_id, results)

    def add_episodes(self, evaluation_id: str, runs: Sequence[EpisodeRun]) -> None:
        with self.phases.timed("storage"):
            super().add_episodes(evaluation_id, runs)

    def finish(self, *args: Any, **kwargs: Any) -> Any:
        with self.phases.timed("storage"):
            return super().finish(*args, **kwargs)


@dataclass
class TimedGate(Gate):
    """The real gate; calls, scoring and deciding are timed, answers kept for checks."""

    phases: Phases = field(default_factory=Phases)
    answers: list[Answer] = field(default_factory=list)
    item_calls_done_at: float | None = None

    def _answers(self, items: list[EvalItem], probes: list[EvalItem], *rest: Any) -> list[Answer]:
        item_calls = len(items) * self.config.repeats * 2
        started = time.perf_counter()

        gate = self

        class ItemCallsDone:
            """Notes when the last item call (before the leak probes) answered."""

            def report(self, fraction: float, message: str) -> None:
                done = int(message.split(": ", 1)[1].split("/", 1)[0])
                if done == item_calls:
                    gate.item_calls_done_at = time.perf_counter()

        self.progress = ItemCallsDone()
        self.answers = super()._answers(items, probes, *rest)
        ended = time.perf_counter()
        split = self.item_calls_done_at or ended
        self.phases.seconds["calls: items"] = split - started
        self.phases.seconds["calls: leak probes"] = ended - split
        return self.answers

    def _score(
        self, items: list[EvalItem], probes: list[EvalItem], answers: list[Answer]
    ) -> list[ItemResult]:
        with self.phases.timed("scoring"):
            return super()._score(items, probes, answers)

    def _decide(self, results: list[ItemResult], planted: list[str]) -> Decision:
        with self.phases.timed("deciding"):
            return super()._decide(results, planted)


@dataclass
class GateRun:
    seconds: float
    outcome: GateOutcome
    phases: dict[str, float]
    answers: list[Answer]


def run_gate(
    args: argparse.Namespace,
    gateway: GatewayServer,
    chain: ReleaseChain,
    artifacts: ArtifactStore,
    suite: Path,
    harness: Harness,
) -> GateRun:
    candidate_id = propose_candidate(chain, artifacts, harness)
    phases = Phases()
    config = GateConfig(
        suites=[suite.name],
        holdout=False,
        scorer={"type": "contains"},
        min_items=min(10, args.items),
        max_tokens=args.max_tokens,
        concurrency=args.concurrency,
    )
    gate = TimedGate(
        config=config,
        publish="review",
        chain=chain,
        artifacts=artifacts,
        evaluations=TimedEvaluationStore(gateway.database, phases),
        target=GatewayTarget(
            base_url=gateway.url,
            scenario=SCENARIO,
            timeout_seconds=config.timeout_seconds,
            retries=config.retries,
            concurrency=config.concurrency,
        ),
        suite_dir=suite.parent,
        phases=phases,
    )
    started = time.perf_counter()
    outcome = gate.run(candidate_id)
    seconds = time.perf_counter() - started
    phases.seconds["other"] = seconds - sum(phases.seconds.values())
    return GateRun(
        seconds, outcome, {name: phases.seconds.get(name, 0.0) for name in PHASES}, gate.answers
    )


# -- the baseline: the same calls, straight to the engine --------------------------------


@dataclass(frozen=True)
class DirectCall:
    key: tuple[str, Arm]  # (item key, arm), as the gate's answers are keyed
    body: dict[str, Any]


@dataclass
class DirectRun:
    seconds: float
    items_seconds: float
    replies: dict[tuple[str, Arm], str | None]
    latencies_ms: list[float]
    errors: int


def direct_calls(
    items: list[EvalItem], probes: list[EvalItem], harness: Harness, model: str, max_tokens: int
) -> tuple[list[DirectCall], list[DirectCall]]:
    """The gate's calls in the gate's order (item, candidate before baseline), rendered
    as the gateway renders them: the candidate arm with its harness, the head with none."""

    def body(item: EvalItem) -> dict[str, Any]:
        return {
            "model": model,
            "messages": item.messages,
            "max_tokens": max_tokens,
            "temperature": 0.0,
            **item.params,
        }

    calls = []
    for item in items:
        calls.append(DirectCall((item.key, "candidate"), render_openai(harness, body(item))))
        calls.append(DirectCall((item.key, "baseline"), body(item)))
    probe_calls = [
        DirectCall((p.key, "candidate"), render_openai(harness, body(p))) for p in probes
    ]
    return calls, probe_calls


async def send_all(
    session: aiohttp.ClientSession, url: str, calls: list[DirectCall], concurrency: int
) -> tuple[dict[tuple[str, Arm], str | None], list[float], int]:
    """Send ``calls`` with ``concurrency`` workers taking them in order."""
    replies: dict[tuple[str, Arm], str | None] = {}
    latencies: list[float] = []
    errors = 0
    pending = iter(calls)

    async def work() -> None:
        nonlocal errors
        for call in pending:
            started = time.perf_counter()
            async with session.post(url, json=call.body) as response:
                data = await response.json() if response.status == 200 else None
            latencies.append((time.perf_counter() - started) * 1000)
            replies[call.key] = None if data is None else reply_text(data)
            errors += data is None

    await asyncio.gather(*(work() for _ in range(min(concurrency, len(calls)))))
    return replies, latencies, errors


async def run_direct_async(
    engine_url: str, calls: list[DirectCall], probe_calls: list[DirectCall], concurrency: int
) -> DirectRun:
    url = engine_url.rstrip("/") + "/chat/completions"
    connector = aiohttp.TCPConnector(limit=concurrency)
    timeout = aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        started = time.perf_counter()
        replies, latencies, errors = await send_all(session, url, calls, concurrency)
        items_seconds = time.perf_counter() - started
        more, more_latencies, more_errors = await send_all(session, url, probe_calls, concurrency)
        seconds = time.perf_counter() - started
    return DirectRun(
        seconds, items_seconds, {**replies, **more}, latencies + more_latencies,
        errors + more_errors,
    )  # fmt: skip


async def warm_up(
    engine_url: str, gateway_url: str, calls: list[DirectCall], concurrency: int
) -> None:
    """The first ``2 * concurrency`` calls straight to the engine, then the same calls
    (their head-arm bodies) through the gateway: first-call costs stay out of the runs."""
    first = calls[: 2 * concurrency]
    through = [
        DirectCall(c.key, {**c.body, "model": f"reef/{SCENARIO}"})
        for c in first
        if c.key[1] == "baseline"
    ]
    headers = {"x-reef-scenario": SCENARIO, "x-reef-purpose": "eval"}
    timeout = aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S)
    async with aiohttp.ClientSession(timeout=timeout, headers=headers) as session:
        await send_all(session, engine_url.rstrip("/") + "/chat/completions", first, concurrency)
        await send_all(session, gateway_url + "/v1/chat/completions", through, concurrency)


# -- runs and report ---------------------------------------------------------------------


@dataclass
class Run:
    first: str
    load_before: str
    load_after: str
    gate: GateRun
    direct: DirectRun
    same_replies: int

    @property
    def ratio(self) -> float:
        return self.gate.seconds / self.direct.seconds

    @property
    def calls(self) -> int:
        return int(self.gate.outcome.cost.get("model_calls", 0))


@dataclass(frozen=True)
class Workload:
    """One decision's inputs, the same for every model: the suite file, the candidate's
    harness, the suite's items and the leak probes the gate adds for that harness."""

    suite: Path
    harness: Harness
    items: list[EvalItem]
    probes: list[EvalItem]

    @property
    def calls(self) -> int:
        return 2 * len(self.items) + len(self.probes)


def make_workload(args: argparse.Namespace, work: Path) -> Workload:
    suite = write_suite(work / "triage.jsonl", args.items, args.seed)
    harness = Harness(schema_version=1, system_prompt=SYSTEM_PROMPT)
    probes = leak_probe_items(harness, None, GateConfig().safety.leak_min_chars)
    return Workload(suite, harness, load_suite(suite), probes)


@dataclass
class ModelResult:
    model: str
    load_s: float
    runs: list[Run]


def measure(
    args: argparse.Namespace,
    model: str,
    engine_url: str,
    runs: int,
    workload: Workload,
    work: Path,
    log: Callable[[str], None],
) -> list[Run]:
    """``runs`` decisions on ``model`` (served at ``engine_url``), each next to its
    direct baseline."""
    calls, probe_calls = direct_calls(
        workload.items, workload.probes, workload.harness, model, args.max_tokens
    )
    settings = gateway_settings(work, engine_url, model)
    done: list[Run] = []
    with GatewayServer(settings) as gateway:
        chain = ReleaseChain(gateway.database)
        artifacts = open_artifact_store(settings.artifacts_url())

        def direct() -> DirectRun:
            return asyncio.run(run_direct_async(engine_url, calls, probe_calls, args.concurrency))

        log(f"{model}: warm-up (not counted)")
        asyncio.run(warm_up(engine_url, gateway.url, calls, args.concurrency))
        for index in range(runs):
            first = "gate" if index % 2 == 0 else "direct"
            load_before = side.load()
            direct_first = direct() if first == "direct" else None
            gate_run = run_gate(args, gateway, chain, artifacts, workload.suite, workload.harness)
            direct_run = direct_first or direct()
            gated = {(a.item_key, a.arm): a.text for a in gate_run.answers}
            same = sum(gated.get(key) == text for key, text in direct_run.replies.items())
            run = Run(first, load_before, side.load(), gate_run, direct_run, same)
            done.append(run)
            log(
                f"{model} run {index + 1}: gate {gate_run.seconds:.2f} s, direct "
                f"{direct_run.seconds:.2f} s, ratio {run.ratio:.2f}, {run.calls} calls, "
                f"{gate_run.outcome.action}"
            )
    return done


def spread(values: Sequence[float], digits: int = 2) -> str:
    """``median (min..max)``, or the value alone for one run."""
    middle = f"{statistics.median(values):.{digits}f}"
    if len(values) < 2:
        return middle
    return f"{middle} ({min(values):.{digits}f}..{max(values):.{digits}f})"


def load_note(loads_before: Sequence[str], cores: int) -> str:
    """A warning when the 1-minute load before a run (``side.load()`` strings) exceeds
    what this bench adds (one busy engine thread, one busy event loop): other jobs
    shared the cores."""
    before = max(float(load.split()[0]) for load in loads_before)
    if before <= cores:
        return ""
    return (
        f" (**other jobs were using the CPU**: up to {before:.1f} before a run on "
        f"{cores} cores; both sides share it, the ratio less than the seconds)"
    )


def verdict(outcome: GateOutcome) -> str:
    decision = outcome.decision
    if decision is None or decision.overall is None:
        return outcome.action
    overall = decision.overall
    return (
        f"{decision.verdict} (candidate {overall.candidate_mean:.2f} vs head "
        f"{overall.baseline_mean:.2f})"
    )


def median_latency(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def summary(result: ModelResult, workload: Workload) -> list[str]:
    """The bullets under the table for one model."""
    runs, n = result.runs, len(workload.items)
    gate_s = [run.gate.seconds for run in runs]
    item_ratio = [run.gate.phases["calls: items"] / run.direct.items_seconds for run in runs]
    via_gate = [median_latency([a.latency_ms for a in run.gate.answers]) for run in runs]
    direct = [median_latency(run.direct.latencies_ms) for run in runs]
    besides_calls = [
        sum(v for k, v in run.gate.phases.items() if not k.startswith("calls")) for run in runs
    ]
    phases = "; ".join(
        f"{name} {statistics.median([r.gate.phases[name] for r in runs]):.3f} s "
        f"({statistics.median([r.gate.phases[name] / r.gate.seconds for r in runs]):.0%})"
        for name in PHASES
    )
    return [
        f"- `{result.model}`: {spread([float(run.calls) for run in runs], 0)} model calls "
        f"per decision in {spread(gate_s)} s ({spread([s / n for s in gate_s], 3)} s per "
        f"item); direct, the same calls take {spread([r.direct.seconds for r in runs])} s: "
        f"gate/direct **{spread([run.ratio for run in runs])}x** ({spread(item_ratio)}x "
        f"for the item calls alone). Median call latency {spread(via_gate, 0)} ms through "
        f"the gateway, {spread(direct, 0)} ms direct; the gate's work besides calls "
        f"{spread([s * 1000 for s in besides_calls], 0)} ms per decision.",
        f"  Where the time goes (median over runs; share of the decision): {phases}.",
    ]


def probe_cap(workload: Workload, max_tokens: int) -> str:
    """The leak probes' reply cap when it is not the gate's ``max_tokens``."""
    caps = {probe.params.get("max_tokens", max_tokens) for probe in workload.probes}
    if not caps or caps == {max_tokens}:
        return ""
    return f" (replies capped at {', '.join(str(cap) for cap in sorted(caps))} tokens)"


def machine_bullet(info: dict[str, Any], loads: Sequence[tuple[str, str]]) -> str:
    """The machine (``side.machine()``) and the load average before → after each run."""
    return (
        f"- Machine: {info['cores']} cores, {info['cpu']}, Python {info['python']}, "
        f"Linux {info['kernel']}, {info['date_utc']}; load average (1, 5, 15 min) "
        "before → after each run: "
        + "; ".join(f"{before} → {after}" for before, after in loads)
        + f"{load_note([before for before, _ in loads], info['cores'])}."
    )


def models_bullet(threads: int, loaded: Sequence[tuple[str, float]]) -> str:
    """The models benched (name, load seconds) and where everything ran."""
    return (
        f"- Models (float32) in the embedded engine, {threads} torch thread(s): "
        + ", ".join(f"`{model}` (loaded in {seconds:.0f} s)" for model, seconds in loaded)
        + ". The engine, the gateway (uvicorn, SQLite, capture on) and both clients share "
        "this one process, on loopback; one model at a time."
    )


def markdown(report: dict[str, Any], results: list[ModelResult], workload: Workload) -> str:
    info, n, probes = report["machine"], len(workload.items), len(workload.probes)
    all_runs = [run for result in results for run in result.runs]
    lines = [
        "## Evaluation gate",
        "",
        f"Command: `{report['command']}`",
        "",
        machine_bullet(info, [(run.load_before, run.load_after) for run in all_runs]),
        models_bullet(report["threads"], [(r.model, r.load_s) for r in results]),
        f"- Decision: scenario `{SCENARIO}` (`harness: managed`); a harness-only candidate "
        "(a system prompt naming the six labels) against the head (no harness); a file "
        f"suite of {n} support tickets → one of six labels, scorer `contains`, "
        f"`max_tokens: {report['max_tokens']}`, `concurrency: {report['concurrency']}`, "
        f"holdout off, `publish: review`. The candidate adds harness text, so the gate "
        f"also sends {probes} leak probes{probe_cap(workload, report['max_tokens'])}: "
        f"{workload.calls} model calls per decision.",
        f"- Direct: the same {workload.calls} chat completions (the candidate's system "
        "prompt rendered into its messages), same order and concurrency, sent straight "
        "to the engine with aiohttp; no gateway, scoring or storage. Sides alternate "
        "first; a few unmeasured warm-up calls (direct and through the gateway) first.",
        "",
        "| model | run | first | gate s | direct s | gate/direct | model calls | "
        "s per item | calls/s | same replies | verdict |",
        "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for result in results:
        for index, run in enumerate(result.runs, 1):
            lines.append(
                f"| `{result.model}` | {index} | {run.first} | {run.gate.seconds:.2f} | "
                f"{run.direct.seconds:.2f} | {run.ratio:.2f} | {run.calls} | "
                f"{run.gate.seconds / n:.3f} | {run.calls / run.gate.seconds:.1f} | "
                f"{run.same_replies}/{workload.calls} | {verdict(run.gate.outcome)} |"
            )
    lines.append("")
    for result in results:
        lines += summary(result, workload)
    lines += [
        "",
        "How to read it: *gate s* is `Gate.run` from the pending candidate to its "
        "verdict, *direct s* the bare model calls; *same replies* counts calls whose "
        "reply was identical on both sides (greedy decoding); the gate's work besides "
        "calls is scoring, storing the evaluation, deciding and the rest of `Gate.run` "
        "(candidate states, reading the harness and the suite). The gate sends the same "
        "calls plus one gateway hop each (recorded, pinned, harness rendered), so a ratio "
        "below 1 is noise: other jobs' load moving between the two sides.",
    ]
    return "\n".join(lines)


def write_section(path: Path, section: str) -> None:
    """Replace this bench's section of ``path`` (appended when absent)."""
    write_between(path, START, END, section)


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument(
        "--model",
        default="smollm2-135m",
        help="comma-separated: smollm2-135m, tiny-random (benched one after the other)",
    )
    parser.add_argument("--home", type=Path, default=Path(".reef"), help="model cache home")
    parser.add_argument("--items", type=int, default=40, help="suite items (each: 2 calls)")
    parser.add_argument("--concurrency", type=int, default=4, help="calls in flight")
    parser.add_argument("--max-tokens", type=int, default=8, help="reply cap per call")
    parser.add_argument(
        "--runs", type=int, default=None, help="per model; default 3 for tiny-random, else 1"
    )
    parser.add_argument("--threads", type=int, default=None, help="engine torch threads")
    parser.add_argument("--seed", type=int, default=0, help="suite generation")
    parser.add_argument("--output", type=Path, default=None, help="markdown to rewrite")
    args = parser.parse_args(argv)
    args.models = [name.strip() for name in args.model.split(",") if name.strip()]
    if not args.models:
        parser.error("--model names no model")
    if min(args.items, args.concurrency, args.max_tokens, args.runs or 1) < 1:
        parser.error("--items, --concurrency, --max-tokens and --runs must be at least 1")
    args.home = args.home.resolve()
    return args


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, side.interrupt)

    def log(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    from reef.engine.scheduler import default_threads

    report: dict[str, Any] = {
        "machine": side.machine(),
        "command": "python bench/" + " ".join([Path(sys.argv[0]).name, *argv]),
        "threads": args.threads or default_threads(),
        "concurrency": args.concurrency,
        "max_tokens": args.max_tokens,
    }
    results: list[ModelResult] = []
    with tempfile.TemporaryDirectory(prefix="reef-gate-cost-") as scratch_dir:
        scratch = Path(scratch_dir)
        workload = make_workload(args, scratch)
        for model in args.models:
            runs = args.runs or (3 if model == "tiny-random" else 1)
            log(f"loading {model} (load average {side.load()})")
            work = scratch / model
            work.mkdir()
            with running_engine(model, args.home, args.threads) as (engine_url, load_s):
                done = measure(args, model, engine_url, runs, workload, work, log)
            results.append(ModelResult(model, load_s, done))
    text = markdown(report, results, workload)
    print(text)
    if args.output is not None:
        write_section(args.output, text)
        print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main(sys.argv[1:]))
    sys.exit(130)
