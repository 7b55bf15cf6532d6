"""Calibrate model learning: the default recipe through the public path next to a bare
PEFT loop on the same data, in the same run.

    .venv/bin/python bench/learning.py --model smollm2-135m --tasks label_map \
        --feedback 240 --output docs/benchmarks.md

For each task (synthetic, seeded) and each ``--feedback`` count:

- **Reef**: the embedded engine and a real gateway on loopback, scenario ``calib`` with
  the default recipe (``fewshot`` k=2, then ``sft`` with its default budget), holdout 0.2,
  the gate on the held-out experience. An OpenAI SDK client sends ``N`` requests, each
  in a session named from its position in the traffic (the split goes by session, so
  every run holds out the same items), and corrects every answer through
  ``POST /reef/feedback``; one learning job runs (training, then the gate). The
  candidate's accuracy is measured on a separate test set that was never sent as
  traffic, through the gateway pinned to the candidate.
- **Bare PEFT loop**: ``get_peft_model`` (LoRA r=8, alpha 16, q_proj/v_proj) + AdamW
  at a constant rate, ``--bare-epochs`` epochs at batch 8 over exactly the records the
  job trained on, then greedy answers on the same test set.

``--compare-recipes fewshot-sft,fewshot-sft-keep,sft --harness managed`` runs the
default recipe, the same with the adapter trained and served under the demos
(``demos: keep``) and ``sft`` alone through the public path for a ``harness: managed``
scenario, without the bare loop: a user's fewshot-then-sft recipe, trained as served by
default (docs/training.md#train-as-served).

Both report held-out accuracy, training CPU-minutes (the training loop's wall time on
this machine's cores) and the feedback items used. The accuracy ratio is Reef / bare.
Tasks: ``label_map`` (16 products, each owned by a team with an arbitrary code: only
learning the mapping helps), ``extraction`` (the order number out of a ticket) and
``format`` (a name rewritten as ``LAST, First``).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import time
import urllib.request
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

sys.path.insert(0, str(Path(__file__).resolve().parent))
import engine_vs_vllm as side  # machine()
from gate_cost import GatewayServer, running_engine  # the same world as the gate bench
from sections import write_between

from reef.config import ReefSettings
from reef.evaluation import EvaluationStore
from reef.jobs import JobQueue
from reef.learning.worker import Worker
from reef.releases import ReleaseChain, open_artifact_store

START = "<!-- learning:start -->"
END = "<!-- learning:end -->"
SCENARIO = "calib"
TEST_ITEMS = 48


@dataclass(frozen=True)
class Task:
    """A synthetic task: ``make(count, rng)`` gives (prompt, answer) pairs."""

    name: str
    make: Callable[[int, random.Random], list[tuple[str, str]]]
    max_tokens: int


PRODUCTS = (
    "Aurora lamp", "Basalt kettle", "Cobalt router", "Dune speaker", "Ember heater",
    "Fjord tablet", "Glacier fridge", "Harbor camera", "Iris watch", "Juniper blender",
    "Kestrel drone", "Lumen projector", "Mistral fan", "Nimbus printer", "Onyx keyboard",
    "Pebble scale",
)  # fmt: skip
PROBLEMS = ("stopped working", "arrived late", "is making a noise", "will not turn on",
            "came without a manual", "was charged twice", "needs a replacement part")  # fmt: skip
LABEL_TEMPLATES = (
    "Which team owns the {product}? Answer with the team code only.",
    "My {product} {problem}. Which team code should handle this ticket? Code only.",
    "Route this ticket to its team (reply with the code): the {product} {problem}.",
    "Team code for a customer whose {product} {problem}?",
)
NAMES = ("Ada", "Bruno", "Chen", "Dara", "Emil", "Farah", "Goran", "Hana", "Ivo", "Jia",
         "Kofi", "Lena", "Mateo", "Nour", "Oskar", "Priya")  # fmt: skip
SURNAMES = ("Smith", "Okafor", "Nakamura", "Silva", "Novak", "Haddad", "Larsen", "Moreau",
            "Rossi", "Kowalski", "Bauer", "Petrova", "Quinn", "Varga", "Weber",
            "Young")  # fmt: skip


def team_codes() -> dict[str, str]:
    """Each product's team code: arbitrary, fixed by a seed."""
    rng = random.Random(1234)
    letters = "ABCDEFGHJKLMNPQRSTUVWXYZ"
    return {p: "T-" + "".join(rng.choice(letters) for _ in range(3)) for p in PRODUCTS}


def label_map(count: int, rng: random.Random) -> list[tuple[str, str]]:
    codes = team_codes()
    items = []
    for index in range(count):
        product = PRODUCTS[index % len(PRODUCTS)]
        text = rng.choice(LABEL_TEMPLATES).format(product=product, problem=rng.choice(PROBLEMS))
        items.append((text, codes[product]))
    return items


def extraction(count: int, rng: random.Random) -> list[tuple[str, str]]:
    items = []
    for _ in range(count):
        number = str(rng.randrange(100_000, 999_999))
        product, problem = rng.choice(PRODUCTS), rng.choice(PROBLEMS)
        text = (
            f"Ticket from {rng.choice(NAMES)}: order {number} for a {product} {problem}. "
            "Reply with the order number only."
        )
        items.append((text, number))
    return items


def name_format(count: int, rng: random.Random) -> list[tuple[str, str]]:
    items = []
    for _ in range(count):
        first, last = rng.choice(NAMES), rng.choice(SURNAMES)
        text = f"Write the name {first} {last} as it goes on a badge."
        items.append((text, f"{last.upper()}, {first}"))
    return items


TASKS = {
    "label_map": Task("label_map", label_map, 8),
    "extraction": Task("extraction", extraction, 10),
    "format": Task("format", name_format, 12),
}
RECIPE = """\
schema_version: 1
trigger: {type: manual}
selection: {holdout_fraction: 0.2, holdout_key: session}
learners:
  - {type: fewshot, k: 2}
  - {type: sft, model: MODEL}
gate:
  holdout: true
  scorer: {type: contains}
  min_items: 10
  max_tokens: 16
publish: auto
"""
# The same recipe without the harness learner: the adapter alone.
SFT_ALONE = RECIPE.replace("  - {type: fewshot, k: 2}\n", "")
# The adapter trained and served under the demos (the default drops them).
KEEP_DEMOS = RECIPE.replace("{type: sft, model: MODEL}", "{type: sft, model: MODEL, demos: keep}")
RECIPES = {"fewshot-sft": RECIPE, "fewshot-sft-keep": KEEP_DEMOS, "sft": SFT_ALONE}
RECIPES_START = "<!-- learning-recipes:start -->"
RECIPES_END = "<!-- learning-recipes:end -->"


def post(url: str, body: dict[str, Any]) -> None:
    request = urllib.request.Request(
        url, json.dumps(body).encode(), {"content-type": "application/json"}, method="POST"
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        response.read()


def correct(answer: str, reference: str) -> bool:
    return reference.casefold() in answer.casefold()


# -- Reef: the public path ---------------------------------------------------------------


def reef_run(
    model: str,
    task: Task,
    count: int,
    test: list[tuple[str, str]],
    recipe: str = RECIPE,
    harness: str = "client",
) -> dict[str, Any]:
    """Traffic and corrections through the gateway, one learning job of ``recipe``
    (its ``MODEL`` replaced) for a scenario with ``harness`` (``client``: the demos a
    ``fewshot`` learner adds are not served; ``managed``: the gateway renders them into
    every request), accuracy of what it produced on ``test``."""
    from openai import OpenAI

    with tempfile.TemporaryDirectory(prefix="reef-bench-learning-") as scratch:
        work = Path(scratch)
        (work / "recipe.yaml").write_text(recipe.replace("MODEL", model))
        with running_engine(model, work / "home", None) as (engine_url, _):
            settings = ReefSettings(
                home=work / "home",
                store={"url": f"sqlite:///{work / 'reef.db'}"},
                upstreams={"engine": {"type": "openai", "base_url": engine_url, "model": model}},
                scenarios={
                    SCENARIO: {
                        "upstream": "engine",
                        "recipe": work / "recipe.yaml",
                        "harness": harness,
                    }
                },
            )
            with GatewayServer(settings) as gateway:
                settings = settings.model_copy(
                    update={"evaluation": settings.evaluation.model_copy(
                        update={"gateway_url": gateway.url})}
                )  # fmt: skip
                client = OpenAI(base_url=gateway.url + "/v1", api_key="unused", max_retries=0)
                answers: dict[str, tuple[str, str]] = {}
                for index, (prompt, answer) in enumerate(task.make(count, random.Random(7))):
                    raw = client.chat.completions.with_raw_response.create(
                        model=f"reef/{SCENARIO}",
                        messages=[{"role": "user", "content": prompt}],
                        max_tokens=task.max_tokens,
                        temperature=0,
                        extra_headers={"x-reef-session": traffic_session(task, index)},
                    )
                    record_id = raw.headers["x-reef-record-id"]
                    said = raw.parse().choices[0].message.content or ""
                    answers[record_id] = (prompt, answer)
                    body = {
                        "record_ids": [record_id],
                        "score": 1.0 if correct(said, answer) else 0.0,
                        "correction": answer,
                    }
                    post(gateway.url + "/reef/feedback", body)
                chain = ReleaseChain(gateway.database)
                worker = Worker(
                    settings,
                    gateway.store,
                    chain,
                    open_artifact_store(settings.artifacts_url()),
                    queue=JobQueue(gateway.database),
                    evaluations=EvaluationStore(gateway.database),
                )
                queue = JobQueue(gateway.database)
                # Before the job: with ``publish: auto`` an unpinned request afterwards is
                # served by the candidate itself once the gate passes it.
                base = accuracy(client, test, task, None)
                post(gateway.url + f"/reef/scenarios/{SCENARIO}/learn", {})
                started = time.monotonic()
                [job] = worker.run_once()
                job_seconds = time.monotonic() - started
                result = job.result or {}
                learned = result.get("metrics") or {}
                sft = next((v for k, v in learned.items() if k.endswith(":sft")), {})
                candidate = result.get("candidate_id")
                tuned = accuracy(client, test, task, candidate) if candidate else base
                trained = [answers[i] for i in queue.consumed_by(job.id) if i in answers]
    gate = result.get("gate") or {}
    return {
        "accuracy": tuned,
        "base_accuracy": base,
        "published": gate.get("action") == "published",
        "gate": gate.get("decision"),
        "train_minutes": (sft.get("seconds") or 0.0) / 60,
        "train_cpu_minutes": (sft.get("cpu_seconds") or 0.0) / 60,
        "job_minutes": job_seconds / 60,
        "steps": sft.get("steps"),
        "stop_reason": sft.get("stop_reason"),
        "undertrained": sft.get("undertrained"),
        "examples": sft.get("examples"),
        "trained": trained,
        "state": job.state,
        "error": job.error,
        # the train/serve skew check's figures (docs/training.md#train-as-served)
        "trained_accuracy": (job.metrics or {}).get("trained_accuracy"),
        "served_accuracy": (job.metrics or {}).get("served_accuracy"),
    }


def traffic_session(task: Task, index: int) -> str:
    """The session the ``index``-th traffic item is sent in (``x-reef-session``). The
    recipes split the holdout by session (``holdout_key: session``), so every run, and
    every recipe of a ``--compare-recipes`` run, trains on the same items and is gated on
    the same ones. Split by record id (drawn at random) the sets differed from run to
    run: on the label map at 240 corrections one run of ``fewshot-sft`` trained on 120
    examples and the ``sft`` run beside it on 131, a difference that was not the recipe's."""
    return f"{task.name}-{index}"


def accuracy(client: Any, test: list[tuple[str, str]], task: Task, release: str | None) -> float:
    headers = {"x-reef-release": release} if release else {}
    hits = 0
    for prompt, answer in test:
        reply = client.chat.completions.create(
            model=f"reef/{SCENARIO}",
            messages=[{"role": "user", "content": prompt}],
            max_tokens=task.max_tokens,
            temperature=0,
            extra_headers={**headers, "x-reef-capture": "off"},
        )
        hits += correct(reply.choices[0].message.content or "", answer)
    return hits / len(test)


# -- the bare PEFT loop ------------------------------------------------------------------


def bare_run(
    model_name: str,
    task: Task,
    train: list[tuple[str, str]],
    test: list[tuple[str, str]],
    epochs: int,
) -> dict[str, Any]:
    """LoRA r=8 + AdamW at 5e-4, ``epochs`` epochs at batch 8, then greedy answers."""
    import torch
    from peft import LoraConfig, get_peft_model

    from reef.engine.models import load_model

    torch.manual_seed(0)
    rng = random.Random(0)
    with tempfile.TemporaryDirectory(prefix="reef-bench-bare-") as scratch:
        loaded = load_model(model_name, Path(scratch) / "home")
    tokenizer = loaded.tokenizer
    rows = []
    for prompt, answer in train:
        messages = [{"role": "user", "content": prompt}]
        head = tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, tokenize=True, return_dict=False
        )
        full = tokenizer.apply_chat_template(
            [*messages, {"role": "assistant", "content": answer}], tokenize=True, return_dict=False
        )
        rows.append((list(full), [-100] * len(head) + list(full)[len(head) :]))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = get_peft_model(
            loaded.model, LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"])
        )
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=5e-4)
    pad = tokenizer.pad_token_id or 0
    model.train()
    started = time.monotonic()
    for _ in range(epochs):
        order = list(range(len(rows)))
        rng.shuffle(order)
        for start in range(0, len(order), 8):
            chunk = [rows[i] for i in order[start : start + 8]]
            width = max(len(ids) for ids, _ in chunk)
            ids = torch.tensor([a + [pad] * (width - len(a)) for a, _ in chunk])
            labels = torch.tensor([b + [-100] * (width - len(b)) for _, b in chunk])
            mask = torch.tensor([[1] * len(a) + [0] * (width - len(a)) for a, _ in chunk])
            model(input_ids=ids, attention_mask=mask, labels=labels).loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
    seconds = time.monotonic() - started
    model.eval()
    hits = 0
    with torch.no_grad():
        for prompt, answer in test:
            ids = tokenizer.apply_chat_template(
                [{"role": "user", "content": prompt}],
                add_generation_prompt=True,
                return_tensors="pt",
                return_dict=False,
            )
            out = model.generate(
                input_ids=ids, max_new_tokens=task.max_tokens, do_sample=False, pad_token_id=pad
            )
            hits += correct(
                tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True), answer
            )
    return {"accuracy": hits / len(test), "train_minutes": seconds / 60, "examples": len(rows)}


# -- the trainer alone: a sweep of the sft defaults -------------------------------------


def sweep_run(
    model_name: str, task: Task, count: int, test: list[tuple[str, str]], overrides: str
) -> dict[str, Any]:
    """Reef's own trainer (``train_lora_sft``) with the ``sft`` learner's defaults and
    ``overrides`` (``key=value,...`` of its settings, e.g. ``lr=1e-3,epochs=8``) on the
    distinct prompts of ``count`` corrections, less the gate's 20% share; greedy answers
    on ``test``. Calibrates a default without the traffic and the gate around it."""
    import torch
    from peft import PeftModel

    from reef.engine.models import load_model
    from reef.learning.learners.sft import SFTConfig
    from reef.learning.trainers.lora_sft import train_lora_sft
    from reef.learning.trainers.spec import SFTExample, SFTSpec

    values: dict[str, Any] = {}
    for pair in filter(None, overrides.split(",")):
        key, _, value = pair.partition("=")
        values[key.strip()] = value.strip()
    # Bench-only keys: ``demos=K`` puts the first K training items before every prompt as
    # user/assistant turns, as a managed harness renders a fewshot learner's demos (in
    # training and at test time alike).
    # ``mix=F`` renders the demos into a seeded share F of the training prompts only (the
    # rest bare); with demos, the test reports both renderings (``accuracy`` with the
    # demos, ``accuracy_bare`` without).
    demos_count = int(values.pop("demos", 0))
    mix = float(values.pop("mix", 1.0))
    demo_at = int(values.pop("demo_at", 0))  # the demos are train[demo_at:demo_at+demos]
    # ``vary=1``: each training prompt gets ``demos`` other training items as its demos,
    # drawn per prompt (seeded); the test still shows the fixed demos.
    vary = values.pop("vary", "0") == "1"
    cfg = SFTConfig.model_validate({"model": model_name, **values})
    distinct = list(dict.fromkeys(task.make(count, random.Random(7))))
    train = distinct[: round(len(distinct) * 0.8)]
    demos: list[dict[str, str]] = []
    for prompt, answer in train[demo_at : demo_at + demos_count]:
        demos += [{"role": "user", "content": prompt}, {"role": "assistant", "content": answer}]
    coin = random.Random(11)

    def shown(index: int) -> list[dict[str, str]]:
        if coin.random() >= mix:
            return []
        if not vary:
            return demos
        picked = coin.sample([j for j in range(len(train)) if j != index], demos_count)
        turns: list[dict[str, str]] = []
        for j in picked:
            turns += [
                {"role": "user", "content": train[j][0]},
                {"role": "assistant", "content": train[j][1]},
            ]
        return turns

    examples = [
        SFTExample(messages=[*shown(i), {"role": "user", "content": p}], target=a)
        for i, (p, a) in enumerate(train)
    ]
    with tempfile.TemporaryDirectory(prefix="reef-bench-sweep-") as scratch:
        work = Path(scratch)
        spec = SFTSpec(
            model=model_name,
            home=work / "home",
            output_dir=work / "adapter",
            examples=examples,
            lora=cfg.lora(),
            **cfg.run_settings(),
        )
        result = train_lora_sft(spec)
        loaded = load_model(model_name, work / "home")
        model = PeftModel.from_pretrained(loaded.model, str(work / "adapter")).eval()
        tokenizer = loaded.tokenizer
        pad = tokenizer.pad_token_id or 0
        hits = {"demos": 0, "bare": 0}
        renderings = {"demos": demos, "bare": []} if demos else {"demos": demos}
        with torch.no_grad():
            for prompt, answer in test:
                for rendering, shown in renderings.items():
                    ids = tokenizer.apply_chat_template(
                        [*shown, {"role": "user", "content": prompt}],
                        add_generation_prompt=True,
                        return_tensors="pt",
                        return_dict=False,
                    )
                    out = model.generate(
                        input_ids=ids,
                        max_new_tokens=task.max_tokens,
                        do_sample=False,
                        pad_token_id=pad,
                    )
                    hits[rendering] += correct(
                        tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True), answer
                    )
    metrics = result.metrics
    return {
        "task": task.name,
        "feedback": count,
        "overrides": overrides,
        "accuracy": hits["demos"] / len(test),
        **({"accuracy_bare": hits["bare"] / len(test)} if demos else {}),
        "examples": len(examples),
        "train_minutes": metrics["seconds"] / 60,
        "train_cpu_minutes": metrics.get("cpu_seconds", 0.0) / 60,
        "steps": metrics["steps"],
        "stop_reason": metrics.get("stop_reason"),
        "undertrained": metrics.get("undertrained"),
        "best_step": metrics.get("best_step"),
    }


# -- the table ---------------------------------------------------------------------------


def machine() -> str:
    found = side.machine()
    return f"{found['cpu']}, {found['cores']} cores"


def table_row(row: dict[str, Any]) -> str:
    reef, bare = row["reef"], row["bare"]
    ratio = reef["accuracy"] / bare["accuracy"] if bare["accuracy"] else float("nan")
    stop = f"{reef['steps']}, {reef['stop_reason']}"
    train = f"{reef['train_minutes']:.1f}"
    if reef.get("train_cpu_minutes"):
        train += f" ({reef['train_cpu_minutes']:.1f} CPU)"
    if reef["undertrained"]:
        stop += " (undertrained)"
    cells = [
        row["task"],
        str(row["feedback"]),
        f"{reef['base_accuracy']:.0%}",
        f"{reef['accuracy']:.0%}",
        f"{bare['accuracy']:.0%}",
        f"{ratio:.2f}x",
        train,
        f"{bare['train_minutes']:.1f}",
        stop,
        "published" if reef["published"] else "not published",
    ]
    return "| " + " | ".join(cells) + " |"


def target_checks(rows: list[dict[str, Any]]) -> list[str]:
    """Issue 18's targets, each with its figures and whether this run met it: the
    default recipe at >= 0.95x the bare loop on every cell; the label map at >= 90%
    held-out from <= 300 corrections within 10 training-minutes; no task worse when its
    feedback doubles (the largest count's accuracy against the smallest's)."""
    checks = []
    ratios = []
    for row in rows:
        reef, bare = row["reef"]["accuracy"], row["bare"]["accuracy"]
        ratios.append(
            (reef >= 0.95 * bare, f"{row['task']}@{row['feedback']} {reef:.0%}/{bare:.0%}")
        )
    met = all(ok for ok, _ in ratios)
    checks.append(
        f"- Reef >= 0.95x the bare loop on every cell: {'met' if met else 'NOT met'} ("
        + "; ".join(text + ("" if ok else " (short)") for ok, text in ratios)
        + ")"
    )
    label = [r for r in rows if r["task"] == "label_map" and int(r["feedback"]) <= 300]
    if label:
        best = max(label, key=lambda r: (r["reef"]["accuracy"], -int(r["feedback"])))
        reef = best["reef"]
        # CPU minutes where the trainer reported them (a shared machine stretches wall
        # time, not CPU time), else wall minutes
        minutes = reef.get("train_cpu_minutes") or reef["train_minutes"]
        unit = "CPU min" if reef.get("train_cpu_minutes") else "min (wall)"
        ok = reef["accuracy"] >= 0.9 and minutes <= 10
        checks.append(
            f"- label_map >= 90% from <= 300 corrections within 10 CPU-minutes of training: "
            f"{'met' if ok else 'NOT met'} ({reef['accuracy']:.0%} from {best['feedback']} "
            f"corrections, {minutes:.1f} {unit}, {reef['train_minutes']:.1f} min wall)"
        )
    by_task: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        by_task.setdefault(row["task"], []).append(row)
    doubled = []
    for task, cells in by_task.items():
        if len(cells) < 2:
            continue
        cells = sorted(cells, key=lambda r: int(r["feedback"]))
        low, high = cells[0], cells[-1]
        ok = high["reef"]["accuracy"] >= low["reef"]["accuracy"]
        doubled.append(
            (ok, f"{task} {low['reef']['accuracy']:.0%} at {low['feedback']} -> "
                 f"{high['reef']['accuracy']:.0%} at {high['feedback']}")
        )  # fmt: skip
    if doubled:
        met = all(ok for ok, _ in doubled)
        checks.append(
            f"- no task worse with more feedback: {'met' if met else 'NOT met'} ("
            + "; ".join(text for _, text in doubled)
            + ")"
        )
    return checks


def load_rows(path: Path | None) -> dict[tuple[str, int], dict[str, Any]]:
    """The cells a previous run of the same command finished, by (task, feedback)."""
    if path is None or not path.exists():
        return {}
    found = {}
    for line in path.read_text().splitlines():
        if line.strip():
            row = json.loads(line)
            found[row["task"], int(row["feedback"])] = row
    return found


def feedback_counts(spec: str, task: str) -> list[int]:
    """The feedback counts ``--feedback`` gives ``task``: ``150,300`` for every task, or
    per task, ``label_map=150,300;extraction=60,120`` (a task not named gets none)."""
    if "=" not in spec:
        return [int(c) for c in spec.split(",")]
    for group in spec.split(";"):
        name, _, counts = group.partition("=")
        if name.strip() == task:
            return [int(c) for c in counts.split(",")]
    return []


def sweep(args: argparse.Namespace) -> None:
    """``--sweep``: each override set on each task and count, one JSON line each."""
    for name in args.tasks.split(","):
        task = TASKS[name]
        test = task.make(TEST_ITEMS, random.Random(99))
        for count in feedback_counts(args.feedback, name):
            for overrides in args.sweep.split(";"):
                line = json.dumps(sweep_run(args.model, task, count, test, overrides))
                print(line, flush=True)
                if args.rows is not None:
                    with args.rows.open("a") as sink:
                        sink.write(line + "\n")


def with_sft_cap(recipe: str, minutes: float | None, threads: int | None = None) -> str:
    """``recipe`` with its ``sft`` learner's wall-time cap (``max_minutes``) and torch
    ``threads`` set, so a comparison on a shared machine trains each recipe its planned
    steps without threads spin-waiting on busy cores (None: as is). Neither changes what
    is trained, only how long it takes."""
    extra = ""
    if minutes is not None:
        extra += f", max_minutes: {minutes:g}"
    if threads is not None:
        extra += f", threads: {threads}"
    return recipe.replace("{type: sft, model: MODEL", f"{{type: sft, model: MODEL{extra}")


def compare(args: argparse.Namespace) -> None:
    """``--compare-recipes``: each named recipe through the public path on each task and
    count, for a scenario with ``--harness``; one table (no bare loop)."""
    rows = []
    for name in args.tasks.split(","):
        task = TASKS[name]
        test = task.make(TEST_ITEMS, random.Random(99))
        for count in feedback_counts(args.feedback, name):
            for recipe in args.compare_recipes.split(","):
                text = with_sft_cap(RECIPES[recipe], args.sft_max_minutes, args.sft_threads)
                run = reef_run(args.model, task, count, test, text, args.harness)
                row = {"task": name, "feedback": count, "recipe": recipe}
                row |= {k: v for k, v in run.items() if k != "trained"}
                rows.append(row)
                print(json.dumps(row, default=str), flush=True)
    lines = [
        f"Measured {datetime.now(UTC):%Y-%m-%d} on {machine()}, model `{args.model}`, "
        f"`harness: {args.harness}`, test set {TEST_ITEMS} items per task never sent as "
        "traffic:",
        "",
        "```",
        f".venv/bin/python bench/learning.py --model {args.model} --tasks {args.tasks} "
        f"--feedback '{args.feedback}' --harness {args.harness} "
        f"--compare-recipes {args.compare_recipes}"
        + ("" if args.sft_max_minutes is None else f" --sft-max-minutes {args.sft_max_minutes:g}")
        + ("" if args.sft_threads is None else f" --sft-threads {args.sft_threads}"),
        "```",
        "",
        "| task | feedback | recipe | base | candidate | trained / served (skew check) "
        "| sft examples, steps, stop | training min (CPU) | job | gate |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        trained, served = row["trained_accuracy"], row["served_accuracy"]
        skew = (
            "-"
            if trained is None
            else f"{trained:.0%} / " + ("-" if served is None else f"{served:.0%}")
        )
        cells = [
            row["task"],
            str(row["feedback"]),
            f"`{row['recipe']}`",
            f"{row['base_accuracy']:.0%}",
            f"{row['accuracy']:.0%}",
            skew,
            f"{row['examples']}, {row['steps']}, {row['stop_reason']}",
            f"{row['train_minutes']:.1f} ({row['train_cpu_minutes']:.1f})",
            row["state"],
            "published" if row["published"] else "not published",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    print("\n".join(lines))
    if args.output is not None:
        write_between(args.output, RECIPES_START, RECIPES_END, "\n".join(lines))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--tasks", default="label_map,extraction,format")
    parser.add_argument(
        "--feedback",
        default="240",
        help="comma-separated counts for every task (150,300), or per task "
        "(label_map=150,300;extraction=60,120)",
    )
    parser.add_argument("--bare-epochs", type=int, default=5)
    parser.add_argument("--output", type=Path, default=None)
    parser.add_argument(
        "--rows",
        type=Path,
        default=None,
        help="a JSON-lines file: each finished cell is appended, and cells already in it "
        "are not run again (a long run that is cut off resumes where it stopped)",
    )
    parser.add_argument(
        "--sweep",
        default=None,
        help="trainer-only calibration: ';'-separated sft overrides, e.g. "
        "'lr=5e-4;lr=1e-3,epochs=8' (each runs Reef's trainer on each task and count)",
    )
    parser.add_argument(
        "--render",
        action="store_true",
        help="with --rows: render the table from the cells already there, run none",
    )
    parser.add_argument(
        "--harness",
        choices=("client", "managed"),
        default="client",
        help="the scenario's harness mode (managed: the gateway renders the candidate's "
        "demos into every request, as a user's fewshot-then-sft recipe serves them)",
    )
    parser.add_argument(
        "--compare-recipes",
        default=None,
        help="','-separated recipes to compare through the public path, no bare loop: "
        + ", ".join(RECIPES),
    )
    parser.add_argument(
        "--sft-max-minutes",
        type=float,
        default=None,
        help="with --compare-recipes: the sft learner's wall-time cap (default: the "
        "learner's own), raised so a loaded machine does not cut one recipe short",
    )
    parser.add_argument(
        "--sft-threads",
        type=int,
        default=None,
        help="with --compare-recipes: the sft learner's torch threads (default: the "
        "learner's own); 1 on a shared machine, where two threads spin-wait",
    )
    args = parser.parse_args()
    if args.compare_recipes is not None:
        compare(args)
        return
    if args.sweep is not None:
        sweep(args)
        return
    done = load_rows(args.rows)
    rows = []
    for name in args.tasks.split(","):
        task = TASKS[name]
        test = task.make(TEST_ITEMS, random.Random(99))
        for count in feedback_counts(args.feedback, name):
            if (name, count) in done:
                rows.append(done[name, count])
                continue
            if args.render:
                print(f"{name}@{count}: not in {args.rows}, left out", file=sys.stderr)
                continue
            reef = reef_run(args.model, task, count, test)
            bare = bare_run(args.model, task, reef["trained"], test, args.bare_epochs)
            row = {
                "task": name,
                "feedback": count,
                "reef": {k: v for k, v in reef.items() if k != "trained"},
                "bare": bare,
            }
            rows.append(row)
            line = json.dumps(row, default=str)
            print(line, flush=True)
            if args.rows is not None:
                with args.rows.open("a") as sink:
                    sink.write(line + "\n")
    lines = [
        f"Measured {datetime.now(UTC):%Y-%m-%d} on {machine()}, model `{args.model}`, "
        f"test set {TEST_ITEMS} items per task never sent as traffic:",
        "",
        "```",
        f".venv/bin/python bench/learning.py --model {args.model} --tasks {args.tasks} "
        f"--feedback '{args.feedback}' --bare-epochs {args.bare_epochs}",
        "```",
        "",
        "| task | feedback | base | Reef (default recipe) | bare PEFT loop | ratio "
        "| Reef training min | bare min | sft steps, stop | gate |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        lines.append(table_row(row))
    lines += ["", "Targets:", "", *target_checks(rows)]
    print("\n".join(lines))
    if args.output is not None:
        write_between(args.output, START, END, "\n".join(lines))
    print(
        "median ratio:",
        statistics.median(
            r["reef"]["accuracy"] / r["bare"]["accuracy"] for r in rows if r["bare"]["accuracy"]
        )
        if any(r["bare"]["accuracy"] for r in rows)
        else "n/a",
    )


if __name__ == "__main__":
    main()
