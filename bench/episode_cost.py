"""What the gate's paired episodes cost: model calls and seconds, next to the same
episodes played straight against the engine.

    .venv/bin/python bench/episode_cost.py --model smollm2-135m --tasks 6 --repeats 1 \
        --concurrency 2 --runs 2 --output docs/benchmarks.md

``--model`` takes one model or several, benched one after the other (``tiny-random``
alone is a quick check: it writes junk, fast, so the gate's own cost shows). Everything
runs in this process, on loopback, as in ``bench/gate_cost.py`` (whose helpers this
reuses): the embedded engine (``--model``, a ``BackgroundServer``) and a real gateway
(uvicorn in a thread, SQLite, capture on) in front of it, serving scenario ``shop`` with
``harness: managed``. Each run proposes a harness-only candidate (an order-support
system prompt) against the head (no harness) and times ``Gate.run`` with
``gate.episodes`` alone: the ``python`` environment with toolset ``orders``,
``--tasks`` order-support tasks (returns, order status, stock), ``--repeats`` episodes
per task and side, ``--concurrency`` episodes in flight, ``--max-turns`` turns at most;
no file suite, leak probes off, holdout off, publish ``review`` (the head never moves).

The baseline, measured side by side in the same run, plays the same episodes (the same
jobs in the gate's order, ``episode_jobs``) with ``play_episode`` straight against the
engine's ``/v1``, at the same concurrency, each worker with an environment of its own:
the candidate's system prompt is put into its tasks' messages, as the gateway renders
it into every request of its episodes; no gateway, no storage, no decision.
Runs alternate which side goes first. On both sides the environment's ``reset``,
``step`` and ``score`` are timed, so an episode's seconds split into the model calls
(the rest of the episode) and the environment; the gate's wall time splits into playing
the episodes, storage and the rest.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import signal
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from unittest import mock

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent))
import engine_vs_vllm as side  # bench/engine_vs_vllm.py: machine(), load(), interrupt()
import gate_cost  # bench/gate_cost.py: the engine, the gateway, the candidate, phases
from gate_cost import Phases, spread
from sections import write_between

import reef.environments.many as many_episodes  # its build_environment gets timed
import reef.evaluation.episode_evidence as gate_episodes
from reef.environments import (
    ChatEndpoint,
    Environment,
    EpisodeError,
    EpisodeResult,
    Task,
    build_environment,
    final_answer,
    play_episode,
    play_episodes,
)
from reef.evaluation.config import EpisodesConfig, GateConfig
from reef.evaluation.episode_evidence import EpisodeJob, EpisodeRun, endpoint_for, episode_jobs
from reef.evaluation.gate import Gate, GateOutcome
from reef.evaluation.runner import GatewayTarget
from reef.harness import Harness, render_openai
from reef.releases import ArtifactStore, ReleaseChain, open_artifact_store

START = "<!-- episodes:start -->"
END = "<!-- episodes:end -->"
SCENARIO = "shop"
SYSTEM_PROMPT = (
    "You are the order-support agent of a shop. Use the tools: look the order up, check "
    "the stock or open a return, then tell the customer the result in one sentence."
)
ITEMS = ("kettle", "toaster", "blender", "lamp", "fan", "radio", "heater", "mixer")
STATUSES = ("delivered", "shipped", "processing")
WHERE = "bench.episodes.environment"
GATE_PHASES = ("episodes", "storage", "other")


# -- the tasks ---------------------------------------------------------------------------


def task_line(index: int) -> dict[str, Any]:
    """Task ``index`` of the orders toolset: a return, an order's status or a stock
    count, in turn, each with a shop of its own (``setup``) and what scores it."""
    item, order = ITEMS[index % len(ITEMS)], f"B{100 + index}"
    status = STATUSES[index % len(STATUSES)]
    setup = {
        "orders": {order: {"status": status, "item": item, "days_since_delivery": 3}},
        "stock": {item: index % 5},
    }
    kind = index % 3
    if kind == 0:
        setup["orders"][order]["status"] = "delivered"
        prompt = f"My {item} from order {order} is broken, please take it back."
        expected: dict[str, Any] = {"return_opened": order, "answer_contains": [f"R-{order}"]}
    elif kind == 1:
        prompt = f"Where is my order {order}?"
        expected = {"no_return": True, "answer_contains": [status]}
    else:
        prompt = f"Do you have any {item} in stock? How many?"
        expected = {"no_return": True, "answer_contains": [str(index % 5)]}
    return {"id": f"t{index + 1}", "prompt": prompt, "expected": expected, "setup": setup}


def write_tasks(path: Path, count: int) -> Path:
    path.write_text("\n".join(json.dumps(task_line(i)) for i in range(count)) + "\n")
    return path


# -- the environment, timed --------------------------------------------------------------


class TimedEnvironment:
    """An environment whose ``reset``, ``step`` and ``score`` add their seconds to
    ``phases["environment"]``; everything else is the wrapped one's."""

    def __init__(self, inner: Environment, phases: Phases) -> None:
        self.inner = inner
        self.phases = phases

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def reset(self, task: Task) -> Any:
        with self.phases.timed("environment"):
            return await self.inner.reset(task)

    async def step(self, calls: Sequence[Any], deadline: float) -> Any:
        with self.phases.timed("environment"):
            return await self.inner.step(calls, deadline)

    async def score(self, task: Task, messages: Sequence[dict[str, Any]]) -> Any:
        with self.phases.timed("environment"):
            return await self.inner.score(task, messages)


def timed_builder(phases: Phases) -> Callable[..., Any]:
    """``build_environment`` whose environments are ``TimedEnvironment``s."""

    def build(spec: Mapping[str, Any], registry: Any = None, where: str = WHERE) -> Any:
        return TimedEnvironment(build_environment(spec, registry, where=where), phases)

    return build


@dataclass(frozen=True)
class Played:
    """One episode as either side played it (``result`` None: the environment failed)."""

    arm: str
    result: EpisodeResult | None

    @property
    def turns(self) -> int:
        return 0 if self.result is None else self.result.turns

    @property
    def answer(self) -> str | None:
        return None if self.result is None else final_answer(self.result.messages)


@dataclass
class Side:
    """One side's run: wall seconds, the episodes in the jobs' order, phase seconds
    (``environment``: summed over episodes; the gate's wall phases too)."""

    seconds: float
    played: list[Played]
    phases: dict[str, float]
    outcome: GateOutcome | None = None

    @property
    def calls(self) -> int:
        return sum(p.turns for p in self.played)

    @property
    def episode_seconds(self) -> float:
        return sum(p.result.seconds for p in self.played if p.result is not None)

    @property
    def model_seconds(self) -> float:
        """Episode time outside the environment: the model calls (and the loop's own
        bookkeeping), summed over episodes."""
        return self.episode_seconds - self.phases.get("environment", 0.0)

    @property
    def tool_calls(self) -> int:
        return sum(p.result.tool_calls for p in self.played if p.result is not None)

    def stops(self) -> Counter[str]:
        return Counter("env failed" if p.result is None else p.result.stop for p in self.played)

    def mean_score(self, arm: str) -> float:
        scores = [
            0.0 if p.result is None else p.result.score.value for p in self.played if p.arm == arm
        ]
        return statistics.mean(scores) if scores else float("nan")


# -- the gate: gate.episodes alone -------------------------------------------------------


@dataclass
class EpisodeGate(Gate):
    """The real gate; its episodes' wall time timed and the runs kept for checks."""

    phases: Phases = field(default_factory=Phases)
    runs: list[EpisodeRun] = field(default_factory=list)

    def _episodes(self, *args: Any) -> list[EpisodeRun]:
        with self.phases.timed("episodes"):
            self.runs = super()._episodes(*args)
        return self.runs


@dataclass(frozen=True)
class World:
    """What both sides play: the tasks, the environment spec (limits applied), the
    jobs in the gate's order with their release ids, and the candidate's harness."""

    args: argparse.Namespace
    tasks_file: Path
    episodes: EpisodesConfig
    spec: dict[str, Any]
    harness: Harness

    def tasks(self) -> list[Task]:
        return gate_episodes.select_tasks(build_environment(self.spec, where=WHERE), self.episodes)

    def gate_config(self) -> GateConfig:
        return GateConfig(
            holdout=False,
            min_items=self.args.tasks,
            max_tokens=self.args.max_tokens,
            concurrency=self.args.concurrency,
            safety={"leak_probes": False},
            episodes=self.episodes,
        )

    def params(self) -> dict[str, Any]:
        config = self.gate_config()
        return {"max_tokens": config.max_tokens, "temperature": config.temperature}


def make_world(args: argparse.Namespace, work: Path) -> World:
    tasks_file = write_tasks(work / "tasks.jsonl", args.tasks)
    episodes = EpisodesConfig(
        environment={"type": "python", "toolset": "orders", "tasks": str(tasks_file)},
        tasks=args.tasks,
        repeats=args.repeats,
        max_turns=args.max_turns,
    )
    harness = Harness(schema_version=1, system_prompt=SYSTEM_PROMPT)
    return World(args, tasks_file, episodes, episodes.spec(), harness)


def run_gate(
    world: World, gateway: gate_cost.GatewayServer, chain: ReleaseChain, artifacts: ArtifactStore
) -> Side:
    candidate_id = gate_cost.propose_candidate(chain, artifacts, world.harness, SCENARIO)
    phases = Phases()
    config = world.gate_config()
    gate = EpisodeGate(
        config=config,
        publish="review",
        chain=chain,
        artifacts=artifacts,
        evaluations=gate_cost.TimedEvaluationStore(gateway.database, phases),
        target=GatewayTarget(
            base_url=gateway.url,
            scenario=SCENARIO,
            timeout_seconds=config.timeout_seconds,
            retries=config.retries,
            concurrency=config.concurrency,
        ),
        suite_dir=world.tasks_file.parent,
        phases=phases,
    )
    with mock.patch.object(many_episodes, "build_environment", timed_builder(phases)):
        started = time.perf_counter()
        outcome = gate.run(candidate_id)
        seconds = time.perf_counter() - started
    walls = {name: phases.seconds.get(name, 0.0) for name in GATE_PHASES[:-1]}
    walls["other"] = seconds - sum(walls.values())
    played = [Played(run.arm, run.result) for run in gate.runs]
    return Side(
        seconds, played, {**walls, "environment": phases.seconds.get("environment", 0.0)}, outcome
    )


# -- the baseline: the same episodes, straight to the engine -----------------------------


@dataclass(frozen=True)
class StraightJob:
    """One of the gate's jobs as the engine sees it: the task with the side's harness
    rendered into its first messages."""

    job: EpisodeJob
    task: Task


def straight_job(job: EpisodeJob, harness: Harness | None) -> StraightJob:
    """``job`` with ``harness``'s system prompt put first, as the gateway renders it
    into every request of the side's episodes."""
    if harness is None:
        return StraightJob(job, job.task)
    messages = render_openai(harness, {"messages": list(job.task.messages)})["messages"]
    return StraightJob(job, Task(job.task.id, tuple(messages), job.task.expected, job.task.setup))


@dataclass(frozen=True)
class Straight:
    """The engine's OpenAI base URL (with ``/v1``), its model name, the request
    params and the episodes' concurrency."""

    engine_url: str
    model: str
    params: dict[str, Any]
    concurrency: int

    def endpoint(self) -> ChatEndpoint:
        return ChatEndpoint(base_url=self.engine_url, model=self.model, params=self.params)


async def play_straight(
    straight: Straight, spec: Mapping[str, Any], jobs: Sequence[StraightJob]
) -> Side:
    """Play ``jobs`` against the engine as the gate plays its own (``play_episodes``:
    started in order, each episode in flight in an environment of its own)."""
    phases = Phases()
    started = time.perf_counter()
    with mock.patch.object(many_episodes, "build_environment", timed_builder(phases)):
        outcomes = await play_episodes(
            spec, [(one.task, straight.endpoint()) for one in jobs], straight.concurrency, WHERE
        )
    seconds = time.perf_counter() - started
    played = [
        Played(one.job.arm, None if isinstance(outcome, EpisodeError) else outcome)
        for one, outcome in zip(jobs, outcomes, strict=True)
    ]
    return Side(seconds, played, dict(phases.seconds))


def straight_jobs(world: World, head_id: str) -> list[StraightJob]:
    """The gate's jobs in the gate's order, the candidate's with its harness."""
    jobs = episode_jobs(
        world.tasks(), {"candidate": "candidate", "baseline": head_id}, world.args.repeats
    )
    harness = {"candidate": world.harness, "baseline": None}
    return [straight_job(job, harness[job.arm]) for job in jobs]


async def warm_up(
    straight: Straight, world: World, jobs: Sequence[StraightJob], target: GatewayTarget
) -> None:
    """The first episode of each side straight to the engine and the head's through
    the gateway (pinned): first-call costs stay out of the runs."""
    environment = build_environment(world.spec, where=WHERE)
    firsts = {one.job.arm: one for one in reversed(jobs)}
    try:
        async with aiohttp.ClientSession() as http:
            for one in firsts.values():
                await play_episode(environment, one.task, straight.endpoint(), http)
            head = firsts["baseline"].job
            await play_episode(
                environment, head.task, endpoint_for(target, head, straight.params), http
            )
    finally:
        await environment.close()


# -- runs and report ---------------------------------------------------------------------


@dataclass
class Run:
    first: str
    load_before: str
    load_after: str
    gate: Side
    straight: Side

    @property
    def ratio(self) -> float:
        return self.gate.seconds / self.straight.seconds

    def same(self) -> int:
        """Episodes whose turns and final answer are the same on both sides."""
        return sum(
            g.turns == s.turns and g.answer == s.answer
            for g, s in zip(self.gate.played, self.straight.played, strict=False)
        )


@dataclass
class ModelResult:
    model: str
    load_s: float
    runs: list[Run]


def measure(
    world: World,
    model: str,
    engine_url: str,
    runs: int,
    work: Path,
    log: Callable[[str], None],
) -> list[Run]:
    """``runs`` gated episode evaluations on ``model``, each next to its straight
    baseline."""
    args = world.args
    settings = gate_cost.gateway_settings(work, engine_url, model, SCENARIO)
    straight = Straight(engine_url, model, world.params(), args.concurrency)
    done: list[Run] = []
    with gate_cost.GatewayServer(settings) as gateway:
        chain = ReleaseChain(gateway.database)
        artifacts = open_artifact_store(settings.artifacts_url())
        head = chain.head(SCENARIO)
        assert head is not None
        jobs = straight_jobs(world, head.id)
        target = GatewayTarget(base_url=gateway.url, scenario=SCENARIO)
        log(f"{model}: warm-up (not counted)")
        asyncio.run(warm_up(straight, world, jobs, target))

        def direct() -> Side:
            return asyncio.run(play_straight(straight, world.spec, jobs))

        for index in range(runs):
            first = "gate" if index % 2 == 0 else "straight"
            load_before = side.load()
            straight_first = direct() if first == "straight" else None
            gate_side = run_gate(world, gateway, chain, artifacts)
            straight_side = straight_first or direct()
            run = Run(first, load_before, side.load(), gate_side, straight_side)
            done.append(run)
            log(
                f"{model} run {index + 1}: gate {gate_side.seconds:.2f} s, straight "
                f"{straight_side.seconds:.2f} s, ratio {run.ratio:.2f}, {gate_side.calls} vs "
                f"{straight_side.calls} calls, same episodes {run.same()}/{len(jobs)}"
            )
    return done


def per_call_ms(side_run: Side) -> float:
    return side_run.seconds * 1000 / side_run.calls if side_run.calls else float("nan")


def verdict(outcome: GateOutcome | None) -> str:
    if outcome is None or outcome.decision is None or outcome.decision.overall is None:
        return "-" if outcome is None else outcome.action
    overall = outcome.decision.overall
    return (
        f"{outcome.decision.verdict} (candidate {overall.candidate_mean:.2f} vs head "
        f"{overall.baseline_mean:.2f})"
    )


def stops_text(sides: Sequence[Side]) -> str:
    total: Counter[str] = Counter()
    for one in sides:
        total.update(one.stops())
    return ", ".join(f"{stop} {count}" for stop, count in sorted(total.items()))


def summary(result: ModelResult, episodes: int) -> list[str]:
    """The bullets under the table for one model."""
    runs = result.runs
    gates, straights = [r.gate for r in runs], [r.straight for r in runs]

    def median(values: Sequence[float]) -> float:
        return statistics.median(values)

    def model_share(sides: Sequence[Side]) -> str:
        model_s = [s.model_seconds for s in sides]
        env_s = [s.phases.get("environment", 0.0) for s in sides]
        per_call = [s.model_seconds * 1000 / s.calls if s.calls else float("nan") for s in sides]
        return (
            f"model calls {spread(model_s)} s ({spread(per_call, 0)} ms each), "
            f"environment (reset, tool steps, score) {spread(env_s)} s"
        )

    walls = "; ".join(
        f"{name} {median([g.phases[name] for g in gates]):.3f} s "
        f"({median([g.phases[name] / g.seconds for g in gates]):.0%})"
        for name in GATE_PHASES
    )
    turns = [s.calls / episodes for s in [*gates, *straights]]
    return [
        f"- `{result.model}`: {episodes} episodes per run, "
        f"{spread([float(g.calls) for g in gates], 0)} model calls through the gate "
        f"({spread([float(s.calls) for s in straights], 0)} straight), "
        f"{spread(turns)} turns per episode; the gate's episode evaluation takes "
        f"{spread([g.seconds for g in gates])} s, the same episodes straight "
        f"{spread([s.seconds for s in straights])} s: gate/straight "
        f"**{spread([r.ratio for r in runs])}x**; per model call "
        f"{spread([per_call_ms(g) for g in gates], 0)} ms vs "
        f"{spread([per_call_ms(s) for s in straights], 0)} ms of wall time.",
        f"  The gate's wall time (median over runs; share): {walls}.",
        f"  Inside the episodes (seconds summed over episodes): through the gate "
        f"{model_share(gates)}; straight {model_share(straights)}.",
        f"  How episodes ended (all runs, both sides): {stops_text([*gates, *straights])}, "
        f"with {sum(one.tool_calls for one in [*gates, *straights])} tool calls in all; "
        f"mean score candidate {median([g.mean_score('candidate') for g in gates]):.2f}, "
        f"head {median([g.mean_score('baseline') for g in gates]):.2f} through the gate.",
    ]


def markdown(report: dict[str, Any], results: list[ModelResult], world: World) -> str:
    info, args = report["machine"], world.args
    episodes = args.tasks * args.repeats * 2
    all_runs = [run for result in results for run in result.runs]
    lines = [
        "## Evaluation gate: paired episodes",
        "",
        f"Command: `{report['command']}`",
        "",
        gate_cost.machine_bullet(info, [(r.load_before, r.load_after) for r in all_runs]),
        gate_cost.models_bullet(report["threads"], [(r.model, r.load_s) for r in results]),
        f"- Evaluation: scenario `{SCENARIO}` (`harness: managed`); a harness-only candidate "
        "(an order-support system prompt) against the head (no harness); `gate.episodes` "
        f"alone: environment `python`, toolset `orders`, {args.tasks} tasks (returns, order "
        f"status, stock, in turn), `repeats: {args.repeats}`, `max_turns: {args.max_turns}`, "
        f"`max_tokens: {args.max_tokens}`, `temperature: 0`, `concurrency: "
        f"{args.concurrency}`; no file suite, leak probes off, holdout off, `publish: "
        f"review`: {episodes} episodes per run.",
        f"- Straight: the same {episodes} episodes (the gate's jobs, in its order, the "
        "candidate's system prompt in its tasks' messages) played with `play_episode` "
        "against the engine's `/v1` at the same concurrency, each worker with an "
        "environment of its own; no gateway, storage or decision. Sides alternate first; "
        "one unmeasured warm-up episode each way first.",
        "",
        "| model | run | first | gate s | straight s | gate/straight | episodes | "
        "model calls (gate / straight) | turns per episode | ms per call (gate / "
        "straight) | same episodes | verdict |",
        "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for result in results:
        for index, run in enumerate(result.runs, 1):
            gate, straight = run.gate, run.straight
            lines.append(
                f"| `{result.model}` | {index} | {run.first} | {gate.seconds:.2f} | "
                f"{straight.seconds:.2f} | {run.ratio:.2f} | {len(gate.played)} | "
                f"{gate.calls} / {straight.calls} | {gate.calls / episodes:.2f} | "
                f"{per_call_ms(gate):.0f} / {per_call_ms(straight):.0f} | "
                f"{run.same()}/{episodes} | {verdict(gate.outcome)} |"
            )
    lines.append("")
    for result in results:
        lines += summary(result, episodes)
    lines += [
        "",
        "How to read it: *gate s* is `Gate.run` from the pending candidate to its verdict "
        "with `gate.episodes` as its only evidence, *straight s* the same episodes with no "
        "gateway; *model calls* are the episodes' turns (one chat completion each); *ms "
        "per call* is wall time over model calls (tool steps included); *same episodes* "
        "counts episodes with the same turns and final answer on both sides (greedy "
        "decoding). The gate's *episodes* phase is its `collect_episodes` (the episodes "
        "through the gateway, each request recorded, pinned and its harness rendered); "
        "*storage* is the evaluation, its results and its episodes written to SQLite; "
        "*other* is the rest of `Gate.run` (candidate states, the harnesses, listing the "
        "tasks, the decision). Inside an episode, the environment's share is its reset "
        "(a tool worker process started per episode), its tool steps and its score; the "
        "rest is the model calls.",
    ]
    return "\n".join(lines)


@contextlib.contextmanager
def scratch_dir() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="reef-episode-cost-") as path:
        yield Path(path)


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument(
        "--model",
        default="smollm2-135m",
        help="comma-separated: smollm2-135m, tiny-random (benched one after the other)",
    )
    parser.add_argument("--home", type=Path, default=Path(".reef"), help="model cache home")
    parser.add_argument("--tasks", type=int, default=6, help="orders tasks (each: 2 episodes)")
    parser.add_argument("--repeats", type=int, default=1, help="episodes per task and side")
    parser.add_argument("--concurrency", type=int, default=2, help="episodes in flight")
    parser.add_argument("--max-tokens", type=int, default=48, help="reply cap per call")
    parser.add_argument("--max-turns", type=int, default=3, help="model calls per episode")
    parser.add_argument(
        "--runs", type=int, default=None, help="per model; default 3 for tiny-random, else 2"
    )
    parser.add_argument("--threads", type=int, default=None, help="engine torch threads")
    parser.add_argument("--output", type=Path, default=None, help="markdown to rewrite")
    args = parser.parse_args(argv)
    args.models = [name.strip() for name in args.model.split(",") if name.strip()]
    if not args.models:
        parser.error("--model names no model")
    sizes = (args.tasks, args.repeats, args.concurrency, args.max_tokens, args.max_turns)
    if min(*sizes, args.runs or 1) < 1:
        parser.error(
            "--tasks, --repeats, --concurrency, --max-tokens, --max-turns and --runs "
            "must be at least 1"
        )
    if args.repeats > 20:
        parser.error("--repeats is at most 20 (gate.episodes.repeats)")
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
    }
    results: list[ModelResult] = []
    with scratch_dir() as scratch:
        world = make_world(args, scratch)
        for model in args.models:
            runs = args.runs or (3 if model == "tiny-random" else 2)
            log(f"loading {model} (load average {side.load()})")
            work = scratch / model
            work.mkdir()
            with gate_cost.running_engine(model, args.home, args.threads) as (url, load_s):
                done = measure(world, model, url, runs, work, log)
            results.append(ModelResult(model, load_s, done))
        text = markdown(report, results, world)
    print(text)
    if args.output is not None:
        write_between(args.output, START, END, text)
        print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main(sys.argv[1:]))
    sys.exit(130)
