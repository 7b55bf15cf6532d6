"""Calibrating the fingerprint tolerance per dtype (``reef.releases.FINGERPRINT_TOLERANCE``).

On the CPU with torch and transformers: SmolLM2-135M (the packaged model) with several
seeded random LoRAs (rank 8 on q/v, as a learner's adapter). For each adapter the
fingerprint is computed in float32 by the trainer's code
(``reef.learning.trainers.fingerprint.compute_fingerprint``, the built-in probes); then
the same weights are run in other precisions, each probe's fingerprint tokens teacher
forced through one forward pass:

- ``bf16-autocast``: float32 weights under bf16 autocast (the trainer's CUDA default);
- ``bf16-weights``: the weights cast to bfloat16 (what ``--dtype bfloat16`` serves);
- ``fp16-weights``: the weights cast to float16.

Per variant: max |Δ logprob| of the fingerprint's greedy tokens against float32 over
every probe position and adapter; the greedy tokens that changed (the variant's arg-max
is not the fingerprint's token) and the largest float32 margin among them (the
near-tie rule covers a change only where that margin is within the tolerance); and
between the two bfloat16 variants (two bf16 implementations, as a bf16 trainer against
a bf16 server). Then the same for wrong weights under the fingerprint: another adapter
of the same size (the next seed) and a deliberately wrong one (lora_B std 0.5): their
max |Δ| is the gap a tolerance must stay below. The base model itself (lora_B zero: the
adapter silently dropped) is probed too. Finally the rule itself
(``reef.releases.compare_fingerprint``) with the proposed tolerances: each variant's own
free-running greedy answers against the fingerprint must pass, the wrong weights' must
not.

    python bench/fingerprint_tolerance.py --model smollm2-135m --adapters 3
    python bench/fingerprint_tolerance.py --model smollm2-135m --output docs/benchmarks.md
"""

from __future__ import annotations

import argparse
import contextlib
import json
import platform
import sys
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from peft import LoraConfig, get_peft_model

sys.path.insert(0, str(Path(__file__).resolve().parent))
from sections import write_between

from reef.engine.models import load_model
from reef.learning.trainers.fingerprint import TrainedModel, compute_fingerprint
from reef.releases import (
    FINGERPRINT_TOLERANCE,
    Fingerprint,
    ProbeAnswer,
    compare_fingerprint,
    probe_prompts,
)

START = "<!-- fingerprint-tolerance:start -->"
END = "<!-- fingerprint-tolerance:end -->"
VARIANTS = ("bf16-autocast", "bf16-weights", "fp16-weights")
SAFETY = 3.0  # a tolerance must be at least this many times the largest same-weights drift


@dataclass
class Drift:
    """What one set of weights or one precision did to the fingerprints' tokens."""

    max_delta: float = 0.0
    positions: int = 0
    changed: int = 0
    changed_max_margin: float = 0.0
    verdicts: list[str] = field(default_factory=list)

    def add(self, deltas: list[float], changes: list[float]) -> None:
        self.max_delta = max([self.max_delta, *deltas])
        self.positions += len(deltas)
        self.changed += len(changes)
        self.changed_max_margin = max([self.changed_max_margin, *changes])


def make_lora(base: Any, seed: int, std: float) -> Any:
    """``base`` wrapped in a rank-8 LoRA on q/v: A as PEFT initialises it, B normal
    (``std``), both from ``seed``."""
    torch.manual_seed(seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = get_peft_model(
            base, LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"])
        )
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "lora_B" in name:
                parameter.normal_(std=std) if std > 0 else parameter.zero_()
    model.eval()
    return model


@contextlib.contextmanager
def variant(model: Any, name: str) -> Iterator[bool]:
    """``model`` run as ``name`` (float32 weights restored after); yields whether the
    forward passes run under bf16 autocast."""
    if name == "float32":
        yield False
        return
    if name == "bf16-autocast":
        with torch.autocast("cpu", dtype=torch.bfloat16):
            yield True
        return
    dtype = torch.bfloat16 if name == "bf16-weights" else torch.float16
    model.to(dtype)
    try:
        yield False
    finally:
        model.to(torch.float32)


def forced_logprobs(
    trained: TrainedModel, fingerprint: Fingerprint
) -> list[tuple[list[float], list[int]]]:
    """Per probe: the log-probability of each fingerprint token and the arg-max at its
    position, teacher forced in one forward pass."""
    results = []
    with torch.no_grad():
        for probe in fingerprint.probes:
            prompt = list(
                trained.tokenizer.apply_chat_template(
                    probe.messages, tokenize=True, add_generation_prompt=True, return_dict=False
                )
            )
            ids = torch.tensor([prompt + probe.tokens])
            logits = trained.model(input_ids=ids).logits[0].float()
            rows = torch.log_softmax(
                logits[len(prompt) - 1 : len(prompt) - 1 + len(probe.tokens)], -1
            )
            target = torch.tensor(probe.tokens)
            chosen = rows.gather(1, target[:, None])[:, 0]
            results.append(([float(v) for v in chosen], [int(v) for v in rows.argmax(-1)]))
    return results


def drift_of(
    reference: Fingerprint, forced: list[tuple[list[float], list[int]]], drift: Drift
) -> None:
    for probe, (logprobs, argmax) in zip(reference.probes, forced, strict=True):
        deltas = [abs(a - b) for a, b in zip(logprobs, probe.logprobs, strict=True)]
        changes = [
            m for m, tok, top in zip(probe.margins, probe.tokens, argmax, strict=True) if tok != top
        ]
        drift.add(deltas, changes)


def answers_of(fingerprint: Fingerprint) -> list[ProbeAnswer]:
    """A fingerprint's greedy answers as a server's (token ids and logprobs returned)."""
    return [
        ProbeAnswer(list(p.tokens), p.text, list(p.logprobs), "stop" if p.ended else "length")
        for p in fingerprint.probes
    ]


def verdict(reference: Fingerprint, probed: Fingerprint, tolerance: float) -> str:
    found = compare_fingerprint(reference, answers_of(probed), tolerance)
    return "match" if found is None else found.describe()


def run(args: argparse.Namespace) -> dict[str, Any]:
    torch.set_num_threads(args.threads)
    prompts = probe_prompts([])
    same: dict[str, Drift] = {name: Drift() for name in VARIANTS}
    pair = Drift()  # bf16-weights against bf16-autocast
    wrong: dict[str, Drift] = {
        "the base model (the adapter dropped)": Drift(),
        "another adapter": Drift(),
        "wrong adapter (std 0.5)": Drift(),
    }
    references: list[Fingerprint] = []
    probed: dict[str, list[Fingerprint]] = {name: [] for name in VARIANTS}
    started = time.monotonic()
    for index in range(args.adapters):
        seed = args.seed + index
        loaded = load_model(args.model, args.home)
        model = make_lora(loaded.model, seed, args.std)
        trained = TrainedModel(
            model, loaded.tokenizer, loaded.eos_token_ids, torch.device("cpu"), False
        )
        reference = compute_fingerprint(trained, prompts, args.max_tokens)
        references.append(reference)
        forced: dict[str, list[tuple[list[float], list[int]]]] = {}
        for name in VARIANTS:
            with variant(model, name) as bf16:
                run_as = TrainedModel(
                    model, loaded.tokenizer, loaded.eos_token_ids, torch.device("cpu"), bf16
                )
                forced[name] = forced_logprobs(run_as, reference)
                probed[name].append(compute_fingerprint(run_as, prompts, args.max_tokens))
            drift_of(reference, forced[name], same[name])
        for a, b in zip(forced["bf16-autocast"], forced["bf16-weights"], strict=True):
            pair.add([abs(x - y) for x, y in zip(a[0], b[0], strict=True)], [])
        print(f"adapter {index} (seed {seed}): {time.monotonic() - started:.0f} s", flush=True)
    # wrong weights under each fingerprint: the next adapter's, and a far one
    wrong_probed: dict[str, list[Fingerprint]] = {key: [] for key in wrong}
    for index, reference in enumerate(references):
        for key, (seed, std) in {
            "the base model (the adapter dropped)": (args.seed, 0.0),  # B = 0: the base's output
            "another adapter": (
                args.seed + (index + 1) % args.adapters if args.adapters > 1 else args.seed + 99,
                args.std,
            ),
            "wrong adapter (std 0.5)": (args.seed + 500 + index, 0.5),
        }.items():
            loaded = load_model(args.model, args.home)
            model = make_lora(loaded.model, seed, std)
            trained = TrainedModel(
                model, loaded.tokenizer, loaded.eos_token_ids, torch.device("cpu"), False
            )
            drift_of(reference, forced_logprobs(trained, reference), wrong[key])
            wrong_probed[key].append(compute_fingerprint(trained, prompts, args.max_tokens))
    print(f"wrong weights: {time.monotonic() - started:.0f} s", flush=True)
    proposed = {
        "float32": FINGERPRINT_TOLERANCE["float32"],
        "bfloat16": FINGERPRINT_TOLERANCE["bfloat16"],
        "float16": FINGERPRINT_TOLERANCE["float16"],
    }
    rule = {"bf16-autocast": "bfloat16", "bf16-weights": "bfloat16", "fp16-weights": "float16"}
    for name in VARIANTS:
        limit = proposed[rule[name]]
        same[name].verdicts = [
            verdict(r, p, limit) for r, p in zip(references, probed[name], strict=True)
        ]
    for key in wrong:
        for dtype, limit in proposed.items():
            wrong[key].verdicts += [
                f"{dtype}: {verdict(r, p, limit)}"
                for r, p in zip(references, wrong_probed[key], strict=True)
            ]
    return {
        "model": args.model,
        "adapters": args.adapters,
        "std": args.std,
        "probes": len(prompts),
        "max_tokens": args.max_tokens,
        "threads": args.threads,
        "seconds": round(time.monotonic() - started, 1),
        "machine": f"{platform.processor() or platform.machine()}, torch {torch.__version__}",
        "tolerance": proposed,
        "same_weights": {k: vars(v) for k, v in same.items()},
        "bf16_pair": vars(pair),
        "wrong_weights": {k: vars(v) for k, v in wrong.items()},
    }


def render(result: dict[str, Any], command: str) -> str:
    tol = result["tolerance"]
    lines = [
        "## Fingerprint tolerance per dtype (`bench/fingerprint_tolerance.py`)",
        "",
        "```bash",
        command,
        "```",
        "",
        f"{result['model']}, {result['adapters']} seeded random LoRAs (r=8 on q/v, lora_B std "
        f"{result['std']}), the {result['probes']} built-in probes, up to {result['max_tokens']} "
        f"greedy tokens each; the fingerprint in float32 by the trainer's code, then the same "
        f"weights in each precision with the fingerprint's tokens teacher forced; "
        f"{result['threads']} torch thread(s), {result['seconds']} s. |Δ| is the logprob of a "
        "fingerprint token against the float32 fingerprint's; a changed token is a position "
        "whose arg-max is another token, its margin the float32 gap between the top two there "
        "(the near-tie rule excuses a change only where that margin is within the tolerance).",
        "",
        "| weights under the fingerprint | positions | max \\|Δ logprob\\| | greedy tokens changed "
        "| largest margin at a change | the rule's verdict on its own greedy answers |",
        "|---|---:|---:|---:|---:|---|",
    ]
    rule = {"bf16-autocast": "bfloat16", "bf16-weights": "bfloat16", "fp16-weights": "float16"}
    for name, drift in result["same_weights"].items():
        verdicts = drift["verdicts"]
        ok = sum(v == "match" for v in verdicts)
        lines.append(
            f"| same, {name} | {drift['positions']} | {drift['max_delta']:.4f} "
            f"| {drift['changed']} | {drift['changed_max_margin']:.4f} "
            f"| {ok}/{len(verdicts)} match at {tol[rule[name]]:g} |"
        )
    pair = result["bf16_pair"]
    lines.append(
        f"| same, bf16-weights against bf16-autocast | {pair['positions']} "
        f"| {pair['max_delta']:.4f} | - | - | - |"
    )
    for name, drift in result["wrong_weights"].items():
        caught = {
            d: sum(not v.endswith("match") for v in drift["verdicts"] if v.startswith(d + ":"))
            for d in tol
        }
        said = ", ".join(f"{caught[d]}/{result['adapters']} refused at {tol[d]:g}" for d in tol)
        lines.append(
            f"| {name} | {drift['positions']} | {drift['max_delta']:.4f} | {drift['changed']} "
            f"| {drift['changed_max_margin']:.4f} | {said} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--home", type=Path, default=Path(".reef"))
    parser.add_argument("--adapters", type=int, default=3)
    parser.add_argument("--std", type=float, default=0.02, help="lora_B std of the right adapters")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json", type=Path, default=None, help="write the figures here")
    parser.add_argument("--output", type=Path, default=None, help="rewrite this section of it")
    args = parser.parse_args(argv)
    result = run(args)
    command = "python bench/fingerprint_tolerance.py " + " ".join(
        argv if argv is not None else sys.argv[1:]
    )
    report = render(result, command.strip())
    print(report)
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    if args.output is not None:
        write_between(args.output, START, END, report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
