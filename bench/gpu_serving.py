"""The GPU check's serving runs (``bench/gpu_check.py``): adapter publishes under load
through the gateway, multi-LoRA throughput, and an in-place checkpoint reload.

On a GPU the upstream is vLLM (``python -m vllm.entrypoints.openai.api_server`` in this
Python, LoRA on, runtime adapter loading and dev-mode reloads allowed) serving the
check's random 0.5B model; with ``--cpu-smoke`` it is the loopback vLLM-protocol fake
(``tests.fakes.upstream --vllm-lora``, whose adapters answer their fingerprints' probes
as their weights would), so the same
code drives the same routes and cannot rot. Adapters are rank-8 LoRAs on q/v built with
PEFT on the served model (seeded random B matrices: distinct digests), each with the
fingerprint a trainer would record. Everything goes
through Reef's own code: ``reef serve`` as a child process, the release chain's
propose/publish, ``HTTPUpstream`` for the throughput calls.

- Publishes under load: ``concurrency`` client threads send chat requests through the
  gateway without pause while the chain head moves ``publishes`` times, each to a new
  adapter, which the gateway verifies (probes with its fingerprint) before its flip.
  Publish→first verified response from the new adapter: from ``publish`` returning to
  the end of the first response whose ``x-reef-release-id`` is the new release; each
  publish is counted verified when ``/reef/status`` then says so. Every
  request that does not answer 200 counts as failed (there must be none).
- A wrong adapter (``refuse_swapped``): after the publishes, one of two adapters far
  apart is published, then the other's directory holding its weights (the other's
  fingerprint over these weights): staging must refuse it while the first serves on.
- Multi-LoRA throughput: the same request mix (``requests`` chat calls of
  ``max_tokens`` tokens, ``ignore_eos``, at ``concurrency``) on the base model, then
  spread over 1, 4 and 16 loaded adapters; completion tokens/s of each against the
  base's. The fake's figures measure nothing (it answers at once): a smoke run reports
  them as such.
- In-place checkpoint reload (``inplace_reload``): a fingerprinted checkpoint release
  (verified after the reload, before the flip), then the base again, on a gateway whose
  upstream reloads in place, under light load.
"""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import json
import math
import os
import shutil
import statistics
import sys
import threading
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from contenders import ChildProcesses, child_env, free_port, wait_ready

from reef.config import UpstreamConfig
from reef.experience import open_store
from reef.releases import ModelComponent, ReleaseChain, ReleaseManifest, open_artifact_store
from reef.upstream import UpstreamError, UpstreamRequest
from reef.upstream.http import HTTPUpstream

SCENARIO = "s"
FLIP_LIMIT_S = 120.0  # longest wait for one publish to serve
REQUEST_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class ServingPlan:
    """The sizes of the serving runs."""

    publishes: int
    concurrency: int
    max_tokens: int
    throughput_requests: int
    throughput_concurrency: int
    throughput_tokens: int
    adapter_counts: tuple[int, ...] = (1, 4, 16)


GPU_SERVING = ServingPlan(20, 16, 16, 256, 64, 128)
SMOKE_SERVING = ServingPlan(4, 4, 4, 32, 8, 8)


@dataclass
class Upstream:
    """A started model server: what serves, and how the gateway reaches it."""

    kind: str  # "vllm" or "fake"
    base_url: str
    model: str


def make_adapters(
    model_dir: Path, root: Path, count: int, std: float = 0.01, fingerprint_tokens: int = 8
) -> list[Path]:
    """``count`` rank-8 LoRAs on q/v of the model at ``model_dir``, seeded random B
    (normal, ``std``), each fingerprinted as a trainer fingerprints what it saves
    (``reef.learning.trainers.fingerprint``: the built-in probes, ``fingerprint_tokens``
    greedy tokens each, on the GPU under the trainer's bf16 autocast when there is one),
    so that staging verifies every publish."""
    import torch
    from peft import LoraConfig, get_peft_model

    from reef.engine.models import load_model
    from reef.learning.trainers.fingerprint import TrainedModel, compute_fingerprint
    from reef.learning.trainers.precision import use_bf16

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    loaded = load_model(str(model_dir), root / ".reef")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        peft_model = get_peft_model(
            loaded.model, LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"])
        ).to(device)
    trained = TrainedModel(
        peft_model, loaded.tokenizer, loaded.eos_token_ids, device, use_bf16("auto", device)
    )
    paths = []
    for index in range(count):
        torch.manual_seed(1000 + index)
        with torch.no_grad():
            for name, parameter in peft_model.named_parameters():
                if "lora_B" in name:
                    parameter.normal_(std=std)
        path = root / f"adapter-{index}"
        peft_model.save_pretrained(str(path))
        compute_fingerprint(trained, [], fingerprint_tokens).write(path)
        paths.append(path)
    del trained, peft_model, loaded
    if device.type == "cuda":
        torch.cuda.empty_cache()  # the GPU's memory is vLLM's next
    return paths


def fingerprinted_checkpoint(model_dir: Path, path: Path, fingerprint_tokens: int = 8) -> Path:
    """``model_dir``'s files (hard links where the disk allows: nothing copied) as a
    checkpoint directory at ``path`` with the fingerprint a ``full`` trainer would record
    (the built-in probes, on the GPU under bf16 autocast when there is one)."""
    import torch

    from reef.engine.models import load_model
    from reef.learning.trainers.fingerprint import TrainedModel, compute_fingerprint
    from reef.learning.trainers.precision import use_bf16

    def link(source: str, target: str) -> None:
        try:
            os.link(source, target)
        except OSError:  # another disk: copy
            shutil.copy2(source, target)

    shutil.copytree(model_dir, path, copy_function=link)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    loaded = load_model(str(path), path.parent / ".reef")
    model = loaded.model.to(device)
    trained = TrainedModel(
        model, loaded.tokenizer, loaded.eos_token_ids, device, use_bf16("auto", device)
    )
    compute_fingerprint(trained, [], fingerprint_tokens).write(path)
    del trained, model, loaded
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return path


def swapped_adapter(right: Path, wrong: Path, path: Path) -> Path:
    """A copy of ``right`` (its config and fingerprint) holding ``wrong``'s weights: what
    a failed hot-swap or a reused name serves."""
    shutil.copytree(right, path)
    for weights in wrong.glob("*.safetensors"):
        shutil.copy(weights, path / weights.name)
    return path


def start_upstream(children: ChildProcesses, kind: str, model_dir: Path, model: str) -> Upstream:
    """vLLM on the GPU (``kind`` vllm) or the vLLM-protocol fake; ready when it lists
    its models."""
    port = free_port()
    env = child_env()
    if kind == "vllm":
        argv = [
            sys.executable, "-m", "vllm.entrypoints.openai.api_server",
            "--model", str(model_dir), "--served-model-name", model,
            "--host", "127.0.0.1", "--port", str(port), "--dtype", "bfloat16",
            "--enable-lora", "--max-lora-rank", "8", "--max-loras", "16",
            "--max-cpu-loras", "32", "--max-model-len", "1024",
            "--gpu-memory-utilization", "0.5",
        ]  # fmt: skip
        # runtime adapters, and the dev-mode routes an in-place reload uses
        env.update(VLLM_ALLOW_RUNTIME_LORA_UPDATING="True", VLLM_SERVER_DEV_MODE="1")
        limit = 300.0
    else:
        argv = [
            sys.executable, "-m", "tests.fakes.upstream", "--port", str(port),
            "--model", model, "--vllm-lora", "--reloads", "vllm",
        ]  # fmt: skip
        limit = 30.0
    process, log = children.spawn(f"{kind}-{port}", argv, env)
    base_url = f"http://127.0.0.1:{port}/v1"
    wait_ready(process, log, base_url + "/models", limit)
    return Upstream(kind, base_url, model)


def start_gateway(
    children: ChildProcesses, work: Path, upstream: Upstream, in_place: bool = False
) -> tuple[int, str, str]:
    """``reef serve`` in front of ``upstream``; its port, store URL and artifacts dir."""
    port = free_port()
    work.mkdir(parents=True, exist_ok=True)
    store_url = f"sqlite:///{work / 'reef.db'}"
    artifacts = str(work / "artifacts")
    up: dict[str, Any] = {
        "type": "openai",
        "base_url": upstream.base_url,
        "model": upstream.model,
        "adapter_slots": {"max_loras": 16, "max_cpu_loras": 32},
        "read_timeout_seconds": REQUEST_TIMEOUT_S,
    }
    if in_place:
        up["checkpoint_loading"] = "vllm"
    config = {
        "home": str(work / "home"),
        "server": {"port": port},
        "store": {"url": store_url},
        "artifacts": {"url": artifacts},
        "upstreams": {"up": up},
        "scenarios": {SCENARIO: {"upstream": "up"}},
        "activation": {"poll_interval_seconds": 0.05, "stage_timeout_seconds": FLIP_LIMIT_S},
    }
    path = work / "reef.yaml"
    path.write_text(yaml.safe_dump(config))
    argv = [sys.executable, "-m", "reef", "serve", "-c", str(path), "--log-level", "WARNING"]
    process, log = children.spawn(f"reef-{work.name}", argv, child_env())
    wait_ready(process, log, f"http://127.0.0.1:{port}/healthz", 120)
    return port, store_url, artifacts


@dataclass
class LoadRecord:
    """One client request through the gateway: when it ended and who served it."""

    ended: float
    release_id: str | None
    status: int  # 0: no answer (connection error)


@dataclass
class Load:
    """Client threads sending chat requests through the gateway until stopped."""

    port: int
    concurrency: int
    max_tokens: int
    records: list[LoadRecord] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)
    changed: threading.Condition = field(default_factory=threading.Condition)
    threads: list[threading.Thread] = field(default_factory=list)

    def start(self) -> None:
        for index in range(self.concurrency):
            thread = threading.Thread(target=self._client, args=(index,), daemon=True)
            thread.start()
            self.threads.append(thread)

    def _client(self, index: int) -> None:
        body = json.dumps(
            {
                "model": f"reef/{SCENARIO}",
                "messages": [{"role": "user", "content": f"Describe a river, please ({index})."}],
                "max_tokens": self.max_tokens,
                "temperature": 0,
            }
        ).encode()
        headers = {"content-type": "application/json", "x-reef-scenario": SCENARIO}
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=REQUEST_TIMEOUT_S)
        while not self.stop.is_set():
            status, release = 0, None
            try:
                conn.request("POST", "/v1/chat/completions", body, headers)
                response = conn.getresponse()
                payload = response.read()
                status, release = response.status, response.getheader("x-reef-release-id")
                if status != 200:
                    self.errors.append(f"{status}: {payload[:300]!r}")
            except (OSError, http.client.HTTPException) as exc:
                self.errors.append(repr(exc))
                conn.close()
                conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=REQUEST_TIMEOUT_S)
            with self.changed:
                self.records.append(LoadRecord(time.perf_counter(), release, status))
                self.changed.notify_all()
        conn.close()

    def first_served(self, release_id: str, after: float, limit: float) -> float | None:
        """When the first response from ``release_id`` ending after ``after`` ended."""
        deadline = time.perf_counter() + limit
        seen = 0
        with self.changed:
            while True:
                for record in self.records[seen:]:
                    if record.release_id == release_id and record.ended > after:
                        return record.ended
                seen = len(self.records)
                left = deadline - time.perf_counter()
                if left <= 0:
                    return None
                self.changed.wait(left)

    def first_served_any(self, limit: float) -> float | None:
        """When the first request answered 200, whoever served it."""
        deadline = time.perf_counter() + limit
        with self.changed:
            while True:
                if any(record.status == 200 for record in self.records):
                    return time.perf_counter()
                left = deadline - time.perf_counter()
                if left <= 0:
                    return None
                self.changed.wait(left)

    def finish(self) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(REQUEST_TIMEOUT_S + 5)


def percentile(values: list[float], q: float) -> float | None:
    """The nearest-rank ``q`` percentile (of 20 values, p99 is the largest)."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]


def publish_under_load(
    upstream: Upstream,
    adapters: list[Path],
    plan: ServingPlan,
    work: Path,
    wrong: tuple[Path, Path] | None = None,
) -> dict[str, Any]:
    """``plan.publishes`` adapter publishes while ``plan.concurrency`` clients load the
    gateway; publish→first-verified-response p50/p99 (each adapter is fingerprinted, and
    the gateway verifies it before its flip), the publishes ``/reef/status`` shows
    verified, and the failed requests. With ``wrong`` (two adapters far apart): the
    second published, then the first's directory holding the second's weights, which
    staging must refuse while the second serves on (``result["swapped"]``)."""
    children = ChildProcesses(work)
    result: dict[str, Any] = {
        "check": "publishes under load",
        "upstream": upstream.kind,
        "publishes": plan.publishes,
        "concurrency": plan.concurrency,
    }
    swapped: dict[str, Any] | None = None
    try:
        port, store_url, artifacts_url = start_gateway(children, work / "gateway", upstream)
        load = Load(port, plan.concurrency, plan.max_tokens)
        load.start()
        store = open_store(store_url)
        try:
            chain = ReleaseChain(store.database)
            artifacts = open_artifact_store(artifacts_url)
            # the first answers create the scenario's first release
            if load.first_served_any(FLIP_LIMIT_S) is None:
                raise RuntimeError("no request answered through the gateway")
            latencies: list[float] = []
            missed = 0
            verified = 0
            for index in range(plan.publishes):
                digest = artifacts.put_dir(adapters[index % len(adapters)], "adapter")
                release_id, published = _publish(chain, upstream, digest, f"#{index}")
                served = load.first_served(release_id, published, FLIP_LIMIT_S)
                if served is None:
                    missed += 1
                    continue
                latencies.append(served - published)
                verification = gateway_status(port)["scenarios"][SCENARIO]["verification"]
                verified += verification is not None and verification["state"] == "verified"
            if wrong is not None:
                swapped = refuse_swapped(load, port, chain, artifacts, upstream, wrong, work)
        finally:
            load.finish()
            store.close()
    finally:
        children.stop_all()
    failed = sum(1 for record in load.records if record.status != 200)
    result.update(
        requests=len(load.records),
        failed_requests=failed,
        failures=load.errors[:5],
        not_served_within_limit=missed,
        verified_publishes=verified,
        publish_to_first_response_ms={
            "p50": _ms(statistics.median(latencies) if latencies else None),
            "p99": _ms(percentile(latencies, 99)),
            "max": _ms(max(latencies) if latencies else None),
        },
        status="ok" if failed == 0 and missed == 0 and verified == plan.publishes else "failed",
    )
    if swapped is not None:
        result["swapped"] = swapped
    return result


def _publish(chain: ReleaseChain, upstream: Upstream, digest: str, note: str) -> tuple[str, float]:
    """Publish the adapter ``digest`` on the head; the release id and when."""
    head = chain.head(SCENARIO)
    assert head is not None
    manifest = ReleaseManifest(model=ModelComponent(base=upstream.model, adapter=digest))
    candidate = chain.propose(SCENARIO, manifest, head.id, "gpu-check", note)
    release = chain.publish(candidate.id, head.id, "gpu-check", note, require_passed=False)
    return release.id, time.perf_counter()


def refuse_swapped(
    load: Load,
    port: int,
    chain: ReleaseChain,
    artifacts: Any,
    upstream: Upstream,
    wrong: tuple[Path, Path],
    work: Path,
) -> dict[str, Any]:
    """The fingerprint check through the gateway: ``wrong[1]`` published (and verified),
    then ``wrong[0]``'s directory holding ``wrong[1]``'s weights: staging on the upstream
    must fail with the diff while ``wrong[1]`` serves on. ``decisive_probes``: the
    probes whose first token's margin is over the tolerance the gateway holds the
    upstream to (0: every probe starts with a near tie, and no weights can be told
    apart; then a swap that passes is ``inconclusive``, not a miss)."""
    from reef.releases import FINGERPRINT_TOLERANCE, read_fingerprint

    outcome: dict[str, Any] = {
        "check": "wrong adapter refused by staging",
        "upstream": upstream.kind,
    }
    right_id, published = _publish(chain, upstream, artifacts.put_dir(wrong[1], "adapter"), "right")
    if load.first_served(right_id, published, FLIP_LIMIT_S) is None:
        return {**outcome, "status": "failed", "reason": "the right adapter never served"}
    path = swapped_adapter(wrong[0], wrong[1], work / "swapped-adapter")
    fingerprint = read_fingerprint(path)
    assert fingerprint is not None
    tolerance = FINGERPRINT_TOLERANCE[fingerprint.dtype]
    decisive = sum(1 for p in fingerprint.probes if p.margins and p.margins[0] > tolerance)
    swapped_id, published = _publish(chain, upstream, artifacts.put_dir(path, "adapter"), "swap")
    deadline = published + FLIP_LIMIT_S
    state: dict[str, Any] = {}
    while time.perf_counter() < deadline:
        state = gateway_status(port)["scenarios"][SCENARIO]
        if state.get("state") == "failed" or state.get("serving_release_id") == swapped_id:
            break
        time.sleep(0.05)
    refused = state.get("state") == "failed" and state.get("serving_release_id") == right_id
    served_on = load.first_served(right_id, time.perf_counter(), FLIP_LIMIT_S) is not None
    status = "ok" if refused and served_on else "failed"
    if not refused and decisive == 0:
        status = "inconclusive"
    return {
        **outcome,
        "status": status,
        "dtype": fingerprint.dtype,
        "tolerance": tolerance,
        "decisive_probes": decisive,
        "probes": len(fingerprint.probes),
        "refused": refused,
        "right_adapter_served_on": served_on,
        "detail": state.get("error") or f"not refused: state {state.get('state')!r}",
    }


def inplace_reload(upstream: Upstream, model_dir: Path, work: Path) -> dict[str, Any]:
    """A release whose model is a checkpoint (the served model's weights stored again as
    a ``checkpoint`` artifact, with its fingerprint) published to a gateway that reloads
    the upstream in place (``checkpoint_loading: vllm``, ``reef.gateway.serving.inplace``)
    while 2 clients load it, then the base model published back: publish to the first
    response from each, whether the reloaded checkpoint was verified, and the failed
    requests."""
    children = ChildProcesses(work)
    result: dict[str, Any] = {"check": "in-place checkpoint reload", "upstream": upstream.kind}
    try:
        port, store_url, artifacts_url = start_gateway(
            children, work / "gateway", upstream, in_place=True
        )
        load = Load(port, 2, 4)
        load.start()
        store = open_store(store_url)
        try:
            if load.first_served_any(FLIP_LIMIT_S) is None:
                raise RuntimeError("no request answered through the gateway")
            chain = ReleaseChain(store.database)
            checkpoint = fingerprinted_checkpoint(model_dir, work / "checkpoint")
            digest = open_artifact_store(artifacts_url).put_dir(checkpoint, "checkpoint")
            timings: dict[str, float | None] = {}
            verified = False
            for step, model in (
                ("to_checkpoint", ModelComponent(base=upstream.model, checkpoint=digest)),
                ("back_to_base", ModelComponent(base=upstream.model)),
            ):
                head = chain.head(SCENARIO)
                assert head is not None
                manifest = ReleaseManifest(model=model)
                candidate = chain.propose(SCENARIO, manifest, head.id, "gpu-check", step)
                release = chain.publish(
                    candidate.id, head.id, "gpu-check", step, require_passed=False
                )
                published = time.perf_counter()
                served = load.first_served(release.id, published, FLIP_LIMIT_S)
                timings[step] = None if served is None else served - published
                if step == "to_checkpoint" and served is not None:
                    found = gateway_status(port)["scenarios"][SCENARIO]["verification"]
                    verified = found is not None and found["state"] == "verified"
            reloads = gateway_status(port)["in_place"]["up"]["reloads"]
        finally:
            load.finish()
            store.close()
    finally:
        children.stop_all()
    failed = sum(1 for record in load.records if record.status != 200)
    missed = sum(1 for value in timings.values() if value is None)
    result.update(
        publish_to_first_response_ms={step: _ms(value) for step, value in timings.items()},
        reloads=reloads,  # the gateway's count: both publishes reloaded the upstream
        checkpoint_verified=verified,  # its fingerprint probed after the reload, before the flip
        requests=len(load.records),
        failed_requests=failed,
        failures=load.errors[:5],
        status="ok" if failed == 0 and missed == 0 and verified else "failed",
    )
    return result


def gateway_status(port: int) -> dict[str, Any]:
    """The gateway's ``/reef/status``."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=REQUEST_TIMEOUT_S)
    try:
        conn.request("GET", "/reef/status")
        status: dict[str, Any] = json.loads(conn.getresponse().read())
        return status
    finally:
        conn.close()


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 1)


def multi_lora_throughput(
    upstream: Upstream, adapters: list[Path], plan: ServingPlan
) -> dict[str, Any]:
    """Completion tokens/s on the base and spread over 1/4/16 adapters, loaded through
    ``HTTPUpstream.load_adapter``; each against the base (vendor anchor 98/94/88%)."""

    async def run() -> dict[str, Any]:
        config = UpstreamConfig(
            type="openai", base_url=upstream.base_url, model=upstream.model,
            read_timeout_seconds=REQUEST_TIMEOUT_S, total_timeout_seconds=600,
            max_connections=plan.throughput_concurrency,
        )  # fmt: skip
        client = HTTPUpstream("throughput", config)
        names = [f"lora-{index}" for index in range(max(plan.adapter_counts))]
        try:
            for name, path in zip(names, adapters, strict=False):
                await client.load_adapter(name, str(path), None)
            await mix(client, [upstream.model], 4)  # warm-up
            base = await mix(client, [upstream.model], plan.throughput_requests)
            rows = [{"adapters": 0, **base, "vs_base": 1.0}]
            for count in plan.adapter_counts:
                if count > len(names):
                    continue
                figures = await mix(client, names[:count], plan.throughput_requests)
                ratio = figures["tokens_per_second"] / base["tokens_per_second"]
                rows.append({"adapters": count, **figures, "vs_base": round(ratio, 3)})
            return {"rows": rows}
        finally:
            for name in names:
                with contextlib.suppress(UpstreamError):
                    await client.unload_adapter(name)
            await client.aclose()

    async def mix(client: HTTPUpstream, models: list[str], requests: int) -> dict[str, Any]:
        gate = asyncio.Semaphore(plan.throughput_concurrency)
        tokens = 0

        async def one(index: int) -> None:
            nonlocal tokens
            body = {
                "model": models[index % len(models)],
                "messages": [{"role": "user", "content": f"Tell a story, number {index}."}],
                "max_tokens": plan.throughput_tokens,
                "temperature": 0,
                "ignore_eos": True,
            }
            async with gate:
                answer = await client.send(
                    UpstreamRequest("/chat/completions", json.dumps(body).encode(), False)
                )
            tokens += int(json.loads(answer.body)["usage"]["completion_tokens"])

        started = time.perf_counter()
        await asyncio.gather(*(one(index) for index in range(requests)))
        seconds = time.perf_counter() - started
        return {
            "requests": requests,
            "completion_tokens": tokens,
            "seconds": round(seconds, 3),
            "tokens_per_second": round(tokens / seconds, 1),
        }

    result = {
        "check": "multi-LoRA throughput",
        "upstream": upstream.kind,
        "concurrency": plan.throughput_concurrency,
        "max_tokens": plan.throughput_tokens,
        "anchor": {"1": 0.98, "4": 0.94, "16": 0.88},
        **asyncio.run(run()),
        "status": "ok",
    }
    if upstream.kind == "fake":
        result["note"] = "the loopback fake answers at once: its figures measure nothing"
    return result
