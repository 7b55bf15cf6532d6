"""Activation latency: publish → first response from the new release, engine and vLLM.

    .venv/bin/python bench/activation.py --releases 10 --output docs/benchmarks.md

For each upstream in turn (the embedded engine, then vLLM when ``bench/.venv-vllm``
exists; never both at once), one child process serves SmolLM2 and a Reef gateway
(``reef serve``, SQLite, capture on, head polling every ``--poll-interval`` s, adapter
warm-up on) runs in front of it. The bench then publishes ``--releases`` releases of
scenario ``s`` alternating two LoRA adapters (r=8 on q/v, random weights), then as
many with a new adapter each time. Right after ``publish`` commits it sends 1-token
requests through the gateway, one after the other, until one answers with the new
``x-reef-release-id``: the time until that response is the activation latency. The
gateway's own flip time (``activated_at`` in ``/reef/status``) is reported too.

With alternating adapters only the first two releases load an adapter into the
upstream (both stay loaded: ``max_adapters`` is 4); later ones are staged, warmed up
and flipped. With a new adapter each release every activation also loads one.

Every process is its own process group, stopped when the bench ends (also on
Ctrl-C/SIGTERM); all traffic stays on 127.0.0.1; every wait is bounded.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import signal
import statistics
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
import engine_vs_vllm as side  # bench/engine_vs_vllm.py: engine and vLLM start/stop
from contenders import ChildProcesses, child_env, free_port, wait_ready

from reef.experience import open_store
from reef.releases import ModelComponent, ReleaseChain, ReleaseManifest, open_artifact_store

REPO = Path(__file__).resolve().parent.parent
START = "<!-- activation:start -->"
END = "<!-- activation:end -->"
BENCH_START = "<!-- activation:bench:start -->"
BENCH_END = "<!-- activation:bench:end -->"
SCENARIO = "s"
FLIP_LIMIT_S = 60.0  # longest wait for one release to serve
REQUEST_TIMEOUT_S = 60.0
MAX_RELEASES = 50
MODES = (("alternate", "alternating 2 adapters"), ("fresh", "a new adapter each release"))


@dataclass
class Activation:
    mode: str
    release_id: str
    first_response_s: float
    flip_s: float | None  # gateway's activated_at - publish time
    polls: int


@dataclass
class TargetResult:
    name: str
    activations: list[Activation] = field(default_factory=list)
    failed_polls: int = 0
    load_before: str = ""
    startup_s: float = 0.0


def make_adapters(model: str, home: Path, root: Path, count: int) -> list[Path]:
    """``count`` rank-8 LoRAs on q/v with seeded random weights (distinct digests)."""
    import torch
    from peft import LoraConfig, get_peft_model

    from reef.engine.models import load_model

    loaded = load_model(model, home)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        peft_model = get_peft_model(
            loaded.model, LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"])
        )
    paths = []
    for i in range(count):
        torch.manual_seed(i)
        with torch.no_grad():
            for name, parameter in peft_model.named_parameters():
                if "lora_B" in name:
                    parameter.normal_(std=0.01)
        path = root / f"adapter-{i}"
        peft_model.save_pretrained(str(path))
        paths.append(path)
    return paths


class Poller:
    """1-token chat requests to the gateway on one keep-alive connection."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=REQUEST_TIMEOUT_S)
        self.failures = 0
        self.body = json.dumps(
            {
                "model": f"reef/{SCENARIO}",
                "messages": [{"role": "user", "content": "hi"}],
                "max_tokens": 1,
                "temperature": 0,
            }
        ).encode()

    def served_by(self) -> str | None:
        """The release that served one request (None when the request failed)."""
        headers = {"content-type": "application/json", "x-reef-scenario": SCENARIO}
        try:
            self.conn.request("POST", "/v1/chat/completions", self.body, headers)
            response = self.conn.getresponse()
            response.read()
        except (OSError, http.client.HTTPException):
            self.failures += 1
            self.conn.close()
            return None
        if response.status != 200:
            self.failures += 1
            return None
        return response.getheader("x-reef-release-id")

    def status(self) -> dict[str, Any]:
        self.conn.request("GET", "/reef/status")
        response = self.conn.getresponse()
        data: dict[str, Any] = json.loads(response.read())
        return data

    def close(self) -> None:
        self.conn.close()


def start_gateway(
    children: ChildProcesses, workdir: Path, upstream_url: str, model: str, poll: float
) -> tuple[int, str, str]:
    """``reef serve`` in front of ``upstream_url``; its port, store URL and artifacts dir."""
    port = free_port()
    store_url = f"sqlite:///{workdir / 'reef.db'}"
    artifacts = str(workdir / "artifacts")
    config = {
        "home": str(workdir / "home"),
        "server": {"port": port},
        "store": {"url": store_url},
        "artifacts": {"url": artifacts},
        "upstreams": {"up": {"type": "openai", "base_url": upstream_url, "model": model}},
        "scenarios": {SCENARIO: {"upstream": "up"}},
        "activation": {"poll_interval_seconds": poll},
    }
    path = workdir / "reef.yaml"
    path.write_text(yaml.safe_dump(config))
    argv = [sys.executable, "-m", "reef", "serve", "-c", str(path), "--log-level", "WARNING"]
    process, log = children.spawn(f"reef-{workdir.name}", argv, child_env())
    wait_ready(process, log, f"http://127.0.0.1:{port}/healthz", 60)
    return port, store_url, artifacts


def measure(
    target: str, upstream_url: str, adapters: list[Path], args: argparse.Namespace, work: Path
) -> TargetResult:
    result = TargetResult(target)
    children = ChildProcesses(work)
    try:
        port, store_url, artifacts_url = start_gateway(
            children, work, upstream_url, args.model, args.poll_interval
        )
        poller = Poller(port)
        store = open_store(store_url)
        try:
            for _ in range(3):  # creates the scenario's first release, warms the path up
                poller.served_by()
            chain = ReleaseChain(store.database)
            artifacts = open_artifact_store(artifacts_url)
            digests = [artifacts.put_dir(path, "adapter") for path in adapters]
            plan = [("alternate", digests[k % 2]) for k in range(args.releases)]
            plan += [("fresh", digests[2 + k]) for k in range(args.releases)]
            for k, (mode, digest) in enumerate(plan):
                head = chain.head(SCENARIO)
                assert head is not None
                manifest = ReleaseManifest(model=ModelComponent(base=args.model, adapter=digest))
                candidate = chain.propose(SCENARIO, manifest, head.id, "bench", f"release {k}")
                release = chain.publish(
                    candidate.id, head.id, "bench", f"release {k}", require_passed=False
                )
                published_wall, published = time.time(), time.perf_counter()
                polls = 0
                while True:
                    polls += 1
                    if poller.served_by() == release.id:
                        break
                    if time.perf_counter() - published > FLIP_LIMIT_S:
                        raise RuntimeError(f"{target}: release {k} not served in {FLIP_LIMIT_S} s")
                elapsed = time.perf_counter() - published
                state = poller.status()["scenarios"][SCENARIO]
                flip = None
                if state.get("serving_release_id") == release.id and state.get("activated_at"):
                    flip = float(state["activated_at"]) - published_wall
                result.activations.append(Activation(mode, release.id, elapsed, flip, polls))
                print(
                    f"{target} {mode} #{k}: first response {elapsed * 1000:.0f} ms, "
                    f"flip {flip * 1000 if flip is not None else float('nan'):.0f} ms, "
                    f"{polls} polls",
                    file=sys.stderr,
                )
                time.sleep(args.pause)
        finally:
            result.failed_polls = poller.failures
            poller.close()
            store.close()
    finally:
        children.stop_all()
    return result


def summary(values: list[float]) -> str:
    if not values:
        return "n/a"
    return f"{statistics.median(values) * 1000:.0f} / {max(values) * 1000:.0f}"


def p50(result: TargetResult | None, mode: str) -> float | None:
    if result is None:
        return None
    values = [a.first_response_s for a in result.activations if a.mode == mode]
    return statistics.median(values) if values else None


def markdown(report: dict[str, Any], results: list[TargetResult], vllm_reason: str | None) -> str:
    info = report["machine"]
    lines = [
        "### Bench: publish → first response",
        "",
        f"Command: `{report['command']}`",
        "",
        f"Machine: {info['cores']} cores, {info['cpu']}, Python {info['python']}, "
        f"{info['date_utc']}; load average before each target: "
        + ", ".join(f"{r.name} {r.load_before}" for r in results)
        + "."
        + (f" vLLM: {report['vllm_versions']}." if report.get("vllm_versions") else ""),
        "",
        f"Setup: SmolLM2-135M (`{report['model']}`, float32) behind `reef serve` (SQLite, "
        f"capture on, adapter warm-up on), gateway head polling every "
        f"{report['poll_interval_s']} s. {report['releases']} releases alternating two "
        f"LoRA adapters (r=8, q/v; only the first two load an adapter, both then stay "
        f"loaded), then {report['releases']} with a new adapter each (every one loads). "
        "Right after `publish` commits, 1-token requests go through the gateway one "
        "after another until one carries the new `x-reef-release-id`; flip = the "
        "gateway's `activated_at` minus the publish time.",
        "",
        "| upstream | adapters | releases | publish → first response, ms p50 / max "
        "| publish → flip, ms p50 / max | polls p50 |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for result in results:
        for mode, label in MODES:
            done = [a for a in result.activations if a.mode == mode]
            flips = [a.flip_s for a in done if a.flip_s is not None]
            polls = statistics.median([a.polls for a in done]) if done else 0
            lines.append(
                f"| {result.name} | {label} | {len(done)} | "
                f"{summary([a.first_response_s for a in done])} | {summary(flips)} | "
                f"{polls:.0f} |"
            )
    by_name = {r.name: r for r in results}
    ratios = []
    for mode, label in MODES:
        ours, theirs = p50(by_name.get("engine"), mode), p50(by_name.get("vLLM"), mode)
        if ours and theirs:
            ratios.append(f"{label} {theirs / ours:.2f}")
    lines.append("")
    lines.append(
        "Failed requests while polling: "
        + ", ".join(f"{r.name} {r.failed_polls}" for r in results)
        + ". Server start to ready: "
        + ", ".join(f"{r.name} {r.startup_s:.0f} s" for r in results)
        + "."
    )
    if ratios:
        lines.append("")
        lines.append("vLLM/engine ratio of the p50 first-response latency: " + "; ".join(ratios))
    if vllm_reason:
        lines.append("")
        lines.append(f"vLLM not benched: {vllm_reason}")
    return "\n".join(lines)


def write_section(path: Path, block: str) -> None:
    """Rewrite the bench's block inside the activation section (appended when absent)."""
    inner = f"{BENCH_START}\n{block}\n{BENCH_END}"
    text = path.read_text() if path.exists() else "# Benchmarks\n"
    if BENCH_START in text and BENCH_END in text:
        head, rest = text.split(BENCH_START, 1)
        text = head + inner + rest.split(BENCH_END, 1)[1]
    elif START in text and END in text:
        head, tail = text.split(END, 1)
        text = head + inner + "\n" + END + tail
    else:
        text = text.rstrip("\n") + f"\n\n{START}\n## Activation latency\n\n{inner}\n{END}\n"
    path.write_text(text)


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--home", type=Path, default=Path(".reef"))
    parser.add_argument("--releases", type=int, default=10, help=f"per mode, 2..{MAX_RELEASES}")
    parser.add_argument("--poll-interval", type=float, default=0.1, help="gateway head polling")
    parser.add_argument("--pause", type=float, default=0.5, help="s between releases")
    parser.add_argument("--threads", type=int, default=None, help="engine torch threads")
    parser.add_argument("--vllm-python", type=Path, default=side.DEFAULT_VLLM_PYTHON)
    parser.add_argument("--vllm-dtype", default="float32")
    parser.add_argument("--vllm-args", default=side.DEFAULT_VLLM_ARGS, help="more vLLM flags")
    parser.add_argument("--no-vllm", action="store_true")
    parser.add_argument("--no-engine", action="store_true")
    parser.add_argument("--start-timeout", type=float, default=300)
    parser.add_argument("--vllm-start-timeout", type=float, default=600)
    parser.add_argument("--output", type=Path, default=None, help="markdown to rewrite")
    parser.add_argument("--log-dir", type=Path, default=None, help="keep the servers' logs")
    args = parser.parse_args()
    args.releases = max(2, min(args.releases, MAX_RELEASES))
    args.home = args.home.resolve()
    signal.signal(signal.SIGTERM, side.interrupt)

    report: dict[str, Any] = {
        "machine": side.machine(),
        "command": "python bench/" + " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
        "model": args.model,
        "poll_interval_s": args.poll_interval,
        "releases": args.releases,
    }
    vllm_reason: str | None = "--no-vllm" if args.no_vllm else None
    if vllm_reason is None:
        try:
            report["vllm_versions"] = side.vllm_versions(args.vllm_python)
        except side.Unavailable as error:
            vllm_reason = str(error)
    results: list[TargetResult] = []
    with tempfile.TemporaryDirectory(prefix="reef-activation-") as scratch_dir:
        scratch = Path(scratch_dir)
        logs = args.log_dir or scratch
        logs.mkdir(parents=True, exist_ok=True)
        adapters = make_adapters(args.model, args.home, scratch, args.releases + 2)
        targets = [] if args.no_engine else ["engine"]
        if vllm_reason is None:
            targets.append("vLLM")
        for target in targets:
            before = side.load()
            print(f"{target}: starting (load {before})", file=sys.stderr)
            work = scratch / target
            work.mkdir()
            if target == "engine":
                server = side.start_engine(args, logs / "engine.log")
            else:
                from reef.engine.models import DEFAULT_MODEL, smollm2_cache

                if args.model == DEFAULT_MODEL:
                    model_dir = smollm2_cache(args.home)
                else:
                    model_dir = Path(args.model).resolve()
                try:
                    server = side.start_vllm(args, model_dir, logs / "vllm.log")
                except side.Unavailable as error:
                    vllm_reason = str(error)
                    print(f"vLLM unavailable: {vllm_reason}", file=sys.stderr)
                    continue
            try:
                result = measure(target, server.base_url, adapters, args, work)
            finally:
                side.stop_server(server.process)
            result.load_before, result.startup_s = before, server.startup_s
            results.append(result)

    text = markdown(report, results, vllm_reason)
    print(text)
    if args.output is not None:
        write_section(args.output, text)
        print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
    sys.exit(130)
