"""The quickstart's directory: the files a user would write to run Reef on the triage
application (``reef.yaml``, the initial harness, the learning recipe), the held-out set
the quickstart measures with, and where everything else lands (``.reef/``: the store
``reef.db``, artifacts, the converted model; ``logs/``; the report).

Every file is ordinary Reef configuration: after the quickstart, ``cd`` into the
directory and ``reef serve`` serves the learned release.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from reef.config import ReefSettings
from reef.engine.choice import CHOICE_FILE
from reef.quickstart.agent import SYSTEM_PROMPT as AGENT_PROMPT
from reef.quickstart.errors import QuickstartError
from reef.quickstart.scenario import LABELS, SYSTEM_PROMPT, Ticket

SCENARIO = "triage"
MARKER = ".reef-quickstart"
HOME = ".reef"
# Written by the quickstart, removed by --fresh. The converted model under
# .reef/models is kept: it derives from the installed wheel, and converting it again
# costs ~20 s.
_OWNED = (
    "reef.yaml",
    "recipe.yaml",
    "harness",
    "heldout.jsonl",
    "suite.jsonl",
    "logs",
    "report.html",
    "learning_curve.png",
    "summary.json",
)


@dataclass(frozen=True)
class Workspace:
    """Paths inside the quickstart directory ``root``."""

    root: Path

    @property
    def home(self) -> Path:
        """Reef's ``home``: store, artifacts, models, job work directories."""
        return self.root / HOME

    @property
    def logs(self) -> Path:
        """Logs of the engine and of the quickstart's own Reef components."""
        return self.root / "logs"

    @property
    def report_html(self) -> Path:
        """The report."""
        return self.root / "report.html"

    @property
    def curve_png(self) -> Path:
        """The learning curve."""
        return self.root / "learning_curve.png"

    @property
    def summary_json(self) -> Path:
        """Every measured figure, machine-readable."""
        return self.root / "summary.json"


def prepare(root: Path, fresh: bool) -> Workspace:
    """Create ``root`` or make it reusable. A directory holding anything refuses to be
    reused without ``fresh``; ``fresh`` clears only a directory an earlier quickstart
    wrote (its marker file), keeping the converted model."""
    workspace = Workspace(root.resolve())
    if root.exists() and not root.is_dir():
        raise QuickstartError(f"{root} exists and is not a directory; pick another --dir")
    entries = sorted(p.name for p in root.iterdir()) if root.exists() else []
    if entries and not fresh:
        raise QuickstartError(
            f"{root} is not empty ({', '.join(entries[:5])}{', ...' if len(entries) > 5 else ''});"
            " the quickstart starts from an empty store. Rerun with --fresh to clear an "
            "earlier quickstart run there, or pick another --dir"
        )
    if entries and not (root / MARKER).is_file():
        raise QuickstartError(
            f"{root} is not a quickstart directory (no {MARKER} file), so --fresh will not "
            "clear it; pick another --dir"
        )
    for name in entries:
        _clear(root / name)
    root.mkdir(parents=True, exist_ok=True)
    (root / MARKER).write_text("written by `reef quickstart`; --fresh may clear this folder\n")
    workspace.logs.mkdir(exist_ok=True)
    return workspace


def _clear(path: Path) -> None:
    if path.name in _OWNED:
        if path.is_dir():
            shutil.rmtree(path)
        else:
            path.unlink()
    elif path.name == HOME:
        for child in path.iterdir():
            if child.name == "engine":
                _clear_engine(child)
            elif child.name != "models":
                shutil.rmtree(child) if child.is_dir() else child.unlink()


def _clear_engine(path: Path) -> None:
    """Clear ``<home>/engine`` but for ``--backend auto``'s choice: like the converted
    model, it derives from the machine and the installed packages, not from a run."""
    if not path.is_dir():
        path.unlink()
        return
    for child in path.iterdir():
        if child.name != CHOICE_FILE.name:
            shutil.rmtree(child) if child.is_dir() else child.unlink()


HARNESS_YAML = """\
# The application's starting harness: what its developers wrote before Reef learned
# anything. The gateway renders the serving release's harness into every request
# (scenarios.triage.harness: managed).
schema_version: 1
system_prompt: {system_prompt}
params:
  temperature: 0.0
  max_tokens: 8
"""


IDLE_SHARE = 0.25
"""The machine counts as idle while other processes use less than this share of its
cores (at most half a core of two)."""


def training_threads(busy: float | None = None, cores: int | None = None) -> int:
    """Torch threads for the quickstart's training: every core when the machine is idle
    as the quickstart starts (nothing else of the quickstart runs while a round trains:
    its traffic is done, the gateway and the engine wait), else one. ``busy``: cores in
    use by other processes (default: :func:`busy_cores`). Measured on 2 cores (AMD
    EPYC, quiet): two threads trained round 1 in 90 s against 105 s and round 2 in 99 s
    against 143 s, the whole run 6.9 min against 8.3; where something else is busy, two
    threads on two cores spin-wait on each other and a step gets slower, not faster."""
    cores = cores if cores is not None else (os.cpu_count() or 1)
    if busy is None:
        busy = busy_cores()
    if busy is None:
        return 1
    return cores if busy < IDLE_SHARE * cores else 1


def busy_cores(seconds: float = 0.5) -> float | None:
    """Cores' worth of CPU time the machine spent busy over the next ``seconds`` (this
    process sleeps meanwhile), from ``/proc/stat``; elsewhere the 1-minute load average;
    None where neither exists."""
    first = _cpu_times()
    if first is None:
        try:
            return os.getloadavg()[0]
        except (AttributeError, OSError):
            return None
    time.sleep(seconds)
    second = _cpu_times()
    if second is None:
        return None
    total, idle = second[0] - first[0], second[1] - first[1]
    if total <= 0:
        return None
    return (1 - idle / total) * (os.cpu_count() or 1)


def _cpu_times() -> tuple[int, int] | None:
    """(all CPU time, idle and iowait time) since boot, in ticks, from ``/proc/stat``."""
    try:
        line = Path("/proc/stat").read_text(encoding="ascii").splitlines()[0]
    except (OSError, IndexError, UnicodeDecodeError):
        return None
    fields = [int(value) for value in line.split()[1:]]
    if len(fields) < 5:
        return None
    return sum(fields[:8]), fields[3] + fields[4]


def _sft_settings(tiny: bool) -> str:
    """The triage adapter's training settings, the same in the sft and distill recipes:
    a constant 2e-3, batch 4, LoRA on q/v (the tiny model also trains ``lm_head``)."""
    return f"""\
    lr_schedule: constant
    warmup_fraction: 0
    validation_fraction: 0
    lr: {0.01 if tiny else 0.002}
    batch_size: 4
    target_modules: [{"q_proj, v_proj, lm_head" if tiny else "q_proj, v_proj"}]"""


def recipe_yaml(
    model: str, epochs: float, demos: int = 0, implicit: bool = False, threads: int = 1
) -> str:
    """The learning recipe (see the comments in it for why each choice); ``demos`` > 0
    adds a few-shot harness learner before the adapter, and the adapter trains and
    serves under its demos (``demos: keep``); ``implicit`` learns from the
    conversation's signals and gates on the operator's suite; ``threads``: the training
    child's torch threads (:func:`training_threads`)."""
    tiny = model == "tiny-random"
    fewshot = f"  - {{type: fewshot, k: {demos}}}\n" if demos else ""
    keep = "    demos: keep  # train and serve under the fewshot learner's demos\n" if demos else ""
    signals = (
        "# Nobody grades: what users say next is the feedback (reef.learning.signals).\n"
        "signals: {enabled: [correction, accept]}\n"
        if implicit
        else ""
    )
    evidence = (
        """  # Computed feedback trains but is never evidence: the operator's labelled suite
  # decides.
  holdout: false
  suites: [suite.jsonl]
"""
        if implicit
        else "  holdout: true\n"
    )
    return f"""\
# reef learn --scenario {SCENARIO} -c reef.yaml   (the quickstart starts each job itself:
# POST /reef/scenarios/{SCENARIO}/learn; a `reef serve` worker then runs it)
schema_version: 1
name: quickstart-triage
trigger: {{type: manual}}
{signals}selection:
  # A quarter of the traffic's sessions is held out: the gate's evidence, never trained on.
  holdout_fraction: 0.25
  # Split by the session id, which the quickstart draws from each ticket's text: the
  # same seed holds out the same tickets on every run (record ids are random).
  holdout_key: session
learners:
  # The adapter alone. Measured on this task (SmolLM2-135M, two CPU cores, two rounds
  # of 120 tickets, 2026-12-05): the adapter alone reached 0% -> 68% -> 92% held-out in
  # 4.0 min; with two few-shot demos learned first and the adapter trained and served
  # under them, 0% -> 73% -> 73% in 5.3 min (a demo doubles a training step's tokens
  # and lengthens every request). Demos alone barely help the base model (0% -> 3%
  # with six). `reef quickstart --demos 2` adds the demos.
{fewshot}  - type: sft
    model: {model}
{keep}    # The records hold the application's request without the managed harness; the
    # adapter learns under the prompt it will serve with (the system prompt), the
    # default for a managed scenario (render_harness).
    # Passes over this round's examples: the more feedback, the more steps. On SmolLM2
    # two passes at a constant 2e-3 are the 40 steps per round measured before budgets
    # followed the data (90 examples at batch 4): 0% -> 67% held-out after one round.
    # No validation split: a tenth of a 90-example round is 9 examples, too few to
    # stop on and a tenth less to learn from (one run with it: 25% after round 1).
    epochs: {epochs:g}
{_sft_settings(tiny)}
    # Torch threads: every core when the machine was idle as the quickstart started
    # (nothing else runs while a round trains), else one: two threads on two cores
    # spin-wait on each other whenever anything else runs.
    threads: {threads}
gate:
{evidence}  scorer: {{type: normalized_exact}}
  # A quarter of 120 tickets' sessions is 30 held-out items on average, but the split is
  # by hash, so a round can hold fewer: one run held 19 and was refused at 20 although
  # its candidate led 84% to 0%. Past 15 items, the gate's interval (the sequential
  # rule's: it can also answer "undecided, waiting for more traffic") is what guards
  # against a gain by chance. Binomial(120, 1/4): under 20 items once in 93 rounds, under
  # 15 once in 4,400.
  min_items: 15
  min_improvement: 0.02
  # Every earlier release was admitted on held-out traffic records, and today's holdout
  # holds every one of them: a regression suite would ask the same items twice.
  regression_releases: 0
  max_tokens: 8
  temperature: 0.0
  concurrency: 8
publish: auto
"""


def reef_yaml(
    model: str, port: int, scenario: str = SCENARIO, dtype: str = "float32"
) -> dict[str, Any]:
    """``reef.yaml`` as data, paths relative to the quickstart directory."""
    # backend: auto serves on the fastest backend whose answers agree with the eager
    # engine's on this CPU (reef.engine.choice): eager, at no cost, without the openvino
    # extra; with it, a check once per CPU, model and versions, kept across --fresh.
    local: dict[str, Any] = {"type": "local", "model": model, "backend": "auto"}
    if dtype != "float32":
        local["dtype"] = dtype
    return {
        "home": HOME,
        "server": {"port": port},
        "upstreams": {"local": local},
        "scenarios": {
            scenario: {
                "harness": "managed",
                "initial_harness": "harness",
                "recipe": "recipe.yaml",
            }
        },
    }


def write_config(
    workspace: Workspace,
    model: str,
    port: int,
    epochs: float,
    heldout: list[Ticket],
    demos: int = 0,
    suite: list[Ticket] | None = None,
    dtype: str = "float32",
    threads: int = 1,
) -> ReefSettings:
    """Write the configuration files and the held-out set; the settings, with paths
    made absolute (the quickstart does not change directory). ``threads``: the
    training child's torch threads (:func:`training_threads`)."""
    root = workspace.root
    (root / "harness").mkdir(exist_ok=True)
    (root / "harness" / "harness.yaml").write_text(
        HARNESS_YAML.format(system_prompt=json.dumps(SYSTEM_PROMPT)), encoding="utf-8"
    )
    recipe = recipe_yaml(model, epochs, demos, implicit=suite is not None, threads=threads)
    (root / "recipe.yaml").write_text(recipe, encoding="utf-8")
    _write_items(root / "heldout.jsonl", "heldout", heldout)
    if suite is not None:
        _write_items(root / "suite.jsonl", "suite", suite)
    return _write_reef_yaml(workspace, model, port, SCENARIO, dtype)


def _write_reef_yaml(
    workspace: Workspace, model: str, port: int, name: str, dtype: str = "float32"
) -> ReefSettings:
    root = workspace.root
    config = reef_yaml(model, port, name, dtype)
    header = (
        "# Written by `reef quickstart`. Serve what it learned: cd into this directory,\n"
        "# then `reef serve` (it reads ./reef.yaml; paths are relative to here).\n"
    )
    (root / "reef.yaml").write_text(header + yaml.safe_dump(config, sort_keys=False))
    scenario = config["scenarios"][name]
    scenario["initial_harness"] = root / "harness"
    scenario["recipe"] = root / "recipe.yaml"
    config["home"] = workspace.home
    return ReefSettings(**config)


def _write_items(path: Path, prefix: str, tickets: list[Ticket]) -> None:
    with path.open("w", encoding="utf-8") as out:
        for index, ticket in enumerate(tickets):
            item = {"id": f"{prefix}-{index}", "input": ticket.text, "reference": ticket.label}
            out.write(json.dumps(item) + "\n")


AGENT_SCENARIO = "orders"

AGENT_HARNESS_YAML = """\
# The order-support agent's starting harness: what its developers wrote before Reef
# learned anything (scenarios.orders.harness: managed). The tools come with every
# request from the application; the engine writes them into the system message.
schema_version: 1
system_prompt: {system_prompt}
params:
  temperature: 0.0
  max_tokens: {max_tokens}
"""
AGENT_MAX_TOKENS = 48  # a call with two arguments is ~40 SmolLM2 tokens


def agent_recipe_yaml(model: str, epochs: float, threads: int = 1) -> str:
    """The agent task's recipe (the comments in it say why each choice); ``threads``:
    the training child's torch threads (:func:`training_threads`)."""
    tiny = model == "tiny-random"
    return f"""\
# reef learn --scenario {AGENT_SCENARIO} -c reef.yaml   (the quickstart starts each job
# itself: POST /reef/scenarios/{AGENT_SCENARIO}/learn; a `reef serve` worker then runs it)
schema_version: 1
name: quickstart-agent
trigger: {{type: manual}}
selection:
  # The gate asks the operator's suite (suite.jsonl), so no traffic is held out: every
  # episode trains.
  holdout_fraction: 0
  # Each episode's outcome reaches its turns: a success makes every turn (the call and
  # the answer) a good example; a failure's correction lands on the turn that went wrong.
  credit: outcome
learners:
  - type: sft
    model: {model}
    # The records hold the application's request without the managed harness; the
    # adapter learns under the prompt it will serve with (system prompt + tool prompt),
    # the default for a managed scenario (render_harness).
    # Two passes over the round's examples at a constant rate (the 60 steps measured on
    # 120 examples: 0% -> 67% held-out episode success); a round with twice the
    # episodes trains twice the steps. No validation split, as in the triage recipe.
    epochs: {epochs:g}
    lr_schedule: constant
    warmup_fraction: 0
    validation_fraction: 0
    # A round that continues from the serving adapter on traffic it already answers (a
    # first pass at a mean loss of 0.05 or less) makes that one pass, not two: measured,
    # round 1's first pass averages 0.155 (60 steps run), round 2's 0.021 (45 of 90).
    known_loss: 0.05
    lr: {0.01 if tiny else 0.003}
    batch_size: 4
    target_modules: [{"q_proj, v_proj, lm_head" if tiny else "q_proj, k_proj, v_proj, o_proj"}]
    # The tool prompt makes a turn ~300 SmolLM2 tokens (the tiny model's tokenizer spells
    # it out character by character).
    max_seq_len: {2048 if tiny else 640}
    # Torch threads: every core when the machine was idle as the quickstart started
    # (nothing else runs while a round trains), else one: two threads on two cores
    # spin-wait on each other whenever anything else runs.
    threads: {threads}
gate:
  # The operator's suite: requests in held-out phrasings (none in the report's held-out
  # set), each asked twice: its first turn (scored by tool_call against the right call)
  # and its answer after the right call's result (scored by contains: the fact).
  holdout: false
  suites: [suite.jsonl]
  scorer: {{type: turn}}
  min_items: 20
  min_improvement: 0.02
  # The suite admitted every earlier release: a regression suite would ask it again.
  regression_releases: 0
  max_tokens: {AGENT_MAX_TOKENS}
  temperature: 0.0
  concurrency: 8
publish: auto
"""


def write_agent_config(
    workspace: Workspace,
    model: str,
    port: int,
    epochs: float,
    heldout: list[dict[str, Any]],
    suite: list[dict[str, Any]],
    dtype: str = "float32",
    threads: int = 1,
) -> ReefSettings:
    """The agent task's configuration files, its held-out episodes and the gate's
    suite; the settings, with paths made absolute. ``threads``: the training child's
    torch threads (:func:`training_threads`)."""
    root = workspace.root
    (root / "harness").mkdir(exist_ok=True)
    harness = AGENT_HARNESS_YAML.format(
        system_prompt=json.dumps(AGENT_PROMPT), max_tokens=AGENT_MAX_TOKENS
    )
    (root / "harness" / "harness.yaml").write_text(harness, encoding="utf-8")
    (root / "recipe.yaml").write_text(agent_recipe_yaml(model, epochs, threads), encoding="utf-8")
    for name, items in (("heldout.jsonl", heldout), ("suite.jsonl", suite)):
        (root / name).write_text("".join(json.dumps(item) + "\n" for item in items))
    return _write_reef_yaml(workspace, model, port, AGENT_SCENARIO, dtype)


__all__ = [
    "AGENT_SCENARIO",
    "LABELS",
    "SCENARIO",
    "Workspace",
    "agent_recipe_yaml",
    "busy_cores",
    "prepare",
    "training_threads",
    "write_agent_config",
    "write_config",
]


DISTILL_STEPS = (0.5, 1.0)  # the student's shares, one canary step each
DISTILL_MARGIN = 0.1  # the gate's non-inferiority margin (the recipe's comment says why)


def distill_recipe_yaml(model: str, epochs: float, threads: int = 1, min_requests: int = 10) -> str:
    """The ``--task distill`` recipe: the ``distill`` learner on the teacher's answers,
    a non-inferiority gate, a canary rollout (the comments in it say why)."""
    tiny = model == "tiny-random"
    return f"""\
# reef learn --scenario {SCENARIO} -c reef.yaml   (the quickstart starts the job itself)
schema_version: 1
name: quickstart-distill
trigger: {{type: manual}}
selection:
  # A quarter of the traffic's sessions is held out: the gate's evidence, never trained on.
  holdout_fraction: 0.25
  # The traffic has no feedback at all: the teacher's answers are the targets.
  require_feedback: false
learners:
  # SFT of the student (the model behind the scenario's managed harness) on the answers
  # the teacher gave to the recorded traffic (docs/distillation.md).
  - type: distill
    model: {model}
    # The main quickstart's sft settings (a constant 2e-3, batch 4, q/v), three passes
    # instead of two: the student has to come close to a teacher that is right on every
    # ticket, not merely beat a base model. On SmolLM2 two passes over 94 examples (the
    # 120-ticket run's 45 steps) reached 0.808 on the gate's items.
    epochs: {epochs:g}
{_sft_settings(tiny)}
    threads: {threads}
gate:
  holdout: true
  # A held-out record the teacher answered is an item without feedback: its reference
  # is the teacher's answer.
  holdout_teacher_references: true
  # A student need not beat the teacher, only not be worse by more than this. The
  # teacher here is right on every ticket, so on ~60 items (a quarter of 240 tickets'
  # sessions) the paired bootstrap's 95% lower end is -0.050 with one student error,
  # -0.083 with two, -0.117 with three: a 0.05 margin passes only a student right on
  # every item, 0.1 one within two errors of the teacher (about 97%). The canary steps
  # then check it again on graded live traffic (docs/distillation.md).
  non_inferiority_margin: {DISTILL_MARGIN}
  method: bootstrap
  scorer: {{type: normalized_exact}}
  min_items: 15
  regression_releases: 0
  max_tokens: 8
  temperature: 0.0
  concurrency: 8
  # Each rollout step is a canary decided on the application's graded live traffic, by
  # the same margin: promoted while the live interval of student - teacher stays above it.
  canary: {{fraction: 0.5, min_requests: {min_requests}}}
publish: canary
"""


def write_distill_config(
    workspace: Workspace,
    model: str,
    port: int,
    epochs: float,
    teacher_url: str,
    dtype: str = "float32",
    threads: int = 1,
    min_requests: int = 10,
) -> ReefSettings:
    """``--task distill``'s files: the triage harness, the distill recipe, and a
    ``reef.yaml`` whose triage scenario is distilled from the quickstart's teacher at
    ``teacher_url``; the settings, with paths made absolute."""
    root = workspace.root
    (root / "harness").mkdir(exist_ok=True)
    (root / "harness" / "harness.yaml").write_text(
        HARNESS_YAML.format(system_prompt=json.dumps(SYSTEM_PROMPT)), encoding="utf-8"
    )
    recipe = distill_recipe_yaml(model, epochs, threads, min_requests)
    (root / "recipe.yaml").write_text(recipe, encoding="utf-8")
    config = reef_yaml(model, port, SCENARIO, dtype)
    config["upstreams"]["teacher"] = {"type": "openai", "base_url": teacher_url}
    config["scenarios"][SCENARIO]["distill"] = {
        "teacher": {"upstream": "teacher", "model": "teacher"},
        "rollout_steps": list(DISTILL_STEPS),
    }
    header = (
        "# Written by `reef quickstart --task distill`. Its teacher ran inside the\n"
        "# quickstart's process: point upstreams.teacher at a real model to serve on.\n"
    )
    (root / "reef.yaml").write_text(header + yaml.safe_dump(config, sort_keys=False))
    scenario = config["scenarios"][SCENARIO]
    scenario["initial_harness"] = root / "harness"
    scenario["recipe"] = root / "recipe.yaml"
    config["home"] = workspace.home
    return ReefSettings(**config)
