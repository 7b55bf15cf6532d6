"""``bench/gpu_check.py --cpu-smoke``: the GPU check's whole script on tiny models on the
CPU, so that it cannot rot between the runs on a GPU (docs/benchmarks.md holds those).
Nothing here checks a time."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_the_gpu_check_smoke_run_trains_through_the_trainer_and_reports_skips(
    tmp_path: Path,
) -> None:
    pytest.importorskip("torch")
    out, table = tmp_path / "gpu-check.json", tmp_path / "gpu-check.md"
    done = subprocess.run(
        [
            sys.executable, str(REPO / "bench" / "gpu_check.py"), "--cpu-smoke",
            "--out", str(out), "--markdown", str(table),
            # the budget keeps a GPU run within 10 minutes; on a shared CPU machine it
            # would turn the last runs into skips
            "--budget-seconds", "1500",
        ],
        cwd=REPO, capture_output=True, text=True, timeout=1500,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    report = json.loads(out.read_text(encoding="utf-8"))
    assert report["mode"] == "cpu-smoke"
    assert report["machine"]["torch"] and report["machine"]["cpu"]
    runs = report["training"]
    ray = importlib.util.find_spec("ray") is not None
    # LoRA and full as the accelerator's runs, then the CPU reference pair, then the
    # Ray trainer's LoRA run where ray is installed
    assert [(r["model"], r["mode"], r["role"]) for r in runs] == [
        ("llama-smoke-random", "lora", "accelerator"),
        ("llama-smoke-random", "full", "accelerator"),
        ("llama-smoke-random", "lora", "cpu"),
        ("llama-smoke-random", "full", "cpu"),
    ] + ([("llama-smoke-random", "lora", "ray")] if ray else [])
    assert [r["runner"] for r in runs] == ["child"] * 4 + (["ray"] if ray else [])
    for run in runs:
        assert run["status"] == "ok", run["reason"]
        assert run["device"] == "cpu" and run["steps"] == 3
        assert run["tokens"] > 0 and run["tokens_per_second"] > 0
        if run["runner"] == "child":  # Ray hands the losses over at the end only
            assert run["steady_tokens_per_second"] > 0  # every step's progress line arrived
        assert run["peak_memory_bytes"] is None  # a CPU run reports no GPU memory
        assert run["peak_rss_bytes"] > 0  # but the training process's host memory
        # the accelerator's runs rehearse what CUDA picks (bf16); the CPU reference, float32
        assert run["bf16"] is (run["role"] != "cpu")
    # the models are built with the realistic vocabulary, so the head costs what it would
    for model in report["models"].values():
        assert model["config"]["vocab_size"] == 49152
    full_run = next(r for r in runs if r["mode"] == "full")
    assert full_run["parameters"] == report["models"]["llama-smoke-random"]["parameters"]
    assert [(r["model"], r["mode"]) for r in report["ratios"]] == [
        ("llama-smoke-random", "lora"),
        ("llama-smoke-random", "full"),
    ]
    # what it cannot measure is reported, never a figure
    skipped = {s["check"]: s["reason"] for s in report["skipped"]}
    assert any(check.startswith("embedded engine on CUDA") for check in skipped)
    assert ("Ray trainer on the GPU" in skipped) is not ray
    assert "sft on smollm2-135m" in skipped  # tiny models only in a smoke run
    # the serving path against the loopback vLLM-protocol fake: publishes under load
    # through the gateway, every one served, no request failed; then multi-LoRA calls;
    # then a checkpoint reloaded in place and the base again
    serving = {result["check"]: result for result in report["serving"]}
    publishes = serving["vLLM through the gateway: adapter publishes under load"]
    assert publishes["upstream"] == "fake" and publishes["status"] == "ok", publishes
    assert publishes["publishes"] == 4 and publishes["not_served_within_limit"] == 0
    assert publishes["failed_requests"] == 0 and publishes["requests"] > 4
    assert publishes["verified_publishes"] == 4  # each fingerprinted, verified before its flip
    # one adapter's directory holding another's weights: staging on the upstream refuses
    # it with the diff, and the adapter serving before serves on
    swapped = serving["a wrong adapter refused by staging through the gateway"]
    assert swapped["status"] == "ok" and swapped["refused"], swapped
    assert swapped["right_adapter_served_on"] and swapped["decisive_probes"] > 0
    assert "does not answer its fingerprint" in swapped["detail"]
    latency = publishes["publish_to_first_response_ms"]
    assert 0 < latency["p50"] <= latency["p99"]
    throughput = serving["multi-LoRA throughput at 1/4/16 adapters against the base"]
    assert throughput["status"] == "ok", throughput
    assert [row["adapters"] for row in throughput["rows"]] == [0, 1, 4, 16]
    assert all(row["completion_tokens"] > 0 for row in throughput["rows"])
    assert "measure nothing" in throughput["note"]  # the fake's figures are not figures
    reload = serving["in-place checkpoint reload"]
    assert reload["status"] == "ok" and reload["failed_requests"] == 0, reload
    assert reload["reloads"] >= 2  # to the checkpoint and back to the base, in place
    assert reload["checkpoint_verified"]  # its fingerprint probed after the reload
    assert all(ms > 0 for ms in reload["publish_to_first_response_ms"].values())
    # one adapter's weights under another's name: its fingerprint accepts its own
    # weights and names where the wrong ones differ
    fingerprint = serving["fingerprint check catching a wrong adapter"]
    assert fingerprint["status"] == "ok", fingerprint
    assert fingerprint["detail"].startswith("own weights: match; wrong weights: probe ")
    text = table.read_text(encoding="utf-8")
    assert text.count("| `llama-smoke-") == len(runs)
    assert "cpu (reference)" in text and "Skipped:" in text
    assert "0 failed" in text and "vendor anchor 98/94/88%" in text
    assert text.strip() in done.stdout
