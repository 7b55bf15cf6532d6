"""The configuration models: one section per domain noun."""

from __future__ import annotations

import contextvars
import hashlib
import math
import re
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from reef.config.distill import DistillConfig, check_distill
from reef.config.spend import (
    BudgetsConfig,
    LearningBudgetLimit,
    PriceConfig,
    RateLimitsConfig,
    check_learning_limits,
    check_spend,
)
from reef.core.trust import Trust, parse_trust


class Section(BaseModel):
    """Base of every config section: unknown keys are errors, values are frozen."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class ServerConfig(Section):
    """Where the gateway listens and what it accepts."""

    host: str | None = Field(
        default=None,
        description="Bind address. Default: 0.0.0.0 when API keys are configured, else "
        "127.0.0.1 (an unauthenticated gateway never listens beyond loopback).",
    )
    port: int = Field(default=8600, ge=0, le=65535, description="TCP port of the gateway.")
    max_body_bytes: int = Field(
        default=8 * 1024 * 1024, gt=0, description="Largest request body accepted (413 above)."
    )
    access_log: bool = Field(default=False, description="Log one line per request.")
    workers: int = Field(
        default=1,
        ge=1,
        le=256,
        description="Gateway processes sharing the port (`reef serve --workers`). Each is a "
        "full gateway on the same store; the learning worker and the embedded engine still "
        "run once. Default 1: one process is enough below a few thousand requests/s and "
        "leaves the other cores to the engine and training; raise it to the cores you give "
        "the gateway (docs/operations.md, Workers).",
    )
    shutdown_grace_seconds: float = Field(
        default=10.0,
        ge=0,
        description="On Ctrl-C or SIGTERM, how long requests in flight may take to finish "
        "before they are cut: a stream ends with an error event, a call still waiting for "
        "its upstream gets a 503, and both are recorded `aborted` with `interrupted: the "
        "gateway stopped`. A second Ctrl-C cuts them at once.",
    )
    allowed_hosts: list[str] = Field(
        default_factory=list,
        description="Host names the gateway answers to, beyond loopback (localhost, "
        "127.0.0.1, [::1]), `server.host` and `evaluation.gateway_url`'s host, which are "
        "always allowed. `.example.com` also allows every subdomain, `*.example.com` only "
        "the subdomains, `*` any host (turns the check off, and with it the guard against DNS "
        "rebinding: only behind a proxy that checks the host). A request naming another "
        "`Host` is refused (400): it guards against DNS rebinding. Add the name clients "
        "use, such as the one a reverse proxy forwards.",
    )
    allowed_origins: list[str] = Field(
        default_factory=list,
        description="Web origins (`https://app.example.com`, scheme and host, port when "
        "not the default) whose pages may call the gateway from a browser; they get CORS "
        "headers. A request carrying another `Origin` is refused (403) on every route, and "
        "so is its CORS preflight. The gateway's own origin (the dashboard) is always "
        "allowed.",
    )
    unknown_scenarios: Literal["create", "reject"] = Field(
        default="create",
        description="What an inference request naming a scenario that `scenarios` does not "
        "configure (`model: reef/<s>` or `x-reef-scenario`) gets. create: the scenario is "
        "created from the defaults on its first request (logged once). reject: 404 naming "
        "the configured scenarios, so a misspelled name never becomes a scenario. A request "
        "naming no scenario is served by `default` either way.",
    )

    @field_validator("allowed_hosts")
    @classmethod
    def _check_hosts(cls, hosts: list[str]) -> list[str]:
        checked = []
        for host in hosts:
            name = host.strip().lower().rstrip(".")
            if not name or any(c in name for c in "/@ ") or "*" in name.lstrip("*"):
                raise ValueError(
                    f"server.allowed_hosts: {host!r} is not a host name; give a name like "
                    "reef.example.com, .example.com, *.example.com, or *"
                )
            checked.append(name)
        return checked

    @field_validator("allowed_origins")
    @classmethod
    def _check_origins(cls, origins: list[str]) -> list[str]:
        checked = []
        for origin in origins:
            value = origin.strip().lower().rstrip("/")
            scheme, _, rest = value.partition("://")
            if scheme not in ("http", "https") or not rest or any(c in rest for c in "/?#@*"):
                raise ValueError(
                    f"server.allowed_origins: {origin!r} is not an origin; give scheme and "
                    "host (and a port when not the default), like https://app.example.com"
                )
            checked.append(value)
        return checked


class AdapterSlotsConfig(Section):
    """How many LoRA adapters an upstream holds at once, when the upstream does not say."""

    max_loras: int | None = Field(
        default=None,
        ge=1,
        description="Adapters the server computes with at once (vLLM's --max-loras; "
        "SGLang's --max-loras-per-batch). An upstream whose `GET /models` gives "
        "`max_loras` overrides this. When the adapters Reef needs active (every head, "
        "canary and candidate the gate or shadow arm runs) exceed it, the gateway warns "
        "of the cache cliff (docs/releases.md, adapter cache telemetry).",
    )
    max_cpu_loras: int | None = Field(
        default=None,
        ge=1,
        description="Adapters the server keeps in host memory to swap in (vLLM's "
        "--max-cpu-loras); reported beside max_loras. An upstream's `max_cpu_loras` in "
        "`GET /models` overrides this.",
    )


class UpstreamConfig(Section):
    """A model server the gateway forwards to."""

    type: Literal["openai", "anthropic", "local"] = Field(
        default="openai",
        description="Dialect: an OpenAI-compatible server (vLLM, SGLang, OpenAI, ...), "
        "the Anthropic API, or the embedded local engine.",
    )
    base_url: str | None = Field(
        default=None,
        description="Base URL including the version prefix, e.g. http://127.0.0.1:8000/v1.",
    )
    api_key: SecretStr | None = Field(default=None, description="Key sent to the upstream.")
    model: str | None = Field(
        default=None,
        description="Model name sent upstream, whatever model the client names (without "
        "one, the client's model name goes upstream). For `type: local`: the engine's "
        "model source (smollm2-135m, tiny-random, or a local Hugging Face model "
        "directory); default smollm2-135m. A scenario's first release records the model "
        "it serves, and the release chain decides from then on: a model edited here later "
        "serves once `reef releases adopt-config --scenario <s>` appends it (the gateway "
        "warns on start while they differ).",
    )
    dtype: Literal["float32", "float16", "bfloat16", "int8", "auto"] = Field(
        default="float32",
        description="For `type: local`: the weights' precision. float16 holds the "
        "projections' weights in float16 for fbgemm's product (x86 CPUs with AVX2), with "
        "float32 activations: 2-3x float32's decode speed on a CPU without native "
        "bfloat16 and on one with AVX-512 BF16, answers nearly float32's. bfloat16 "
        "decodes about 1.5x faster than float32 where the CPU computes it natively "
        "(AVX-512 BF16 or AMX) and answers approximately as float32 does "
        "(docs/engine.md). auto picks bfloat16 on a GPU; on a CPU float16 where fbgemm "
        "runs (then bfloat16 or float32 if a weight does not fit in float16), else "
        "bfloat16 where native, else float32. int8 keeps "
        "the decoder layers' weights in int8 (weight-only, bfloat16 activations): faster "
        "again for one stream, and more approximate.",
    )
    threads: int | None = Field(
        default=None,
        ge=1,
        description="For `type: local`: the engine's torch threads; default all cores but one.",
    )
    backend: Literal["eager", "openvino", "auto"] = Field(
        default="eager",
        description="For `type: local`: what runs the model. eager is PyTorch; openvino "
        "is OpenVINO GenAI (the openvino extra and a converter, docs/engine.md); auto "
        "picks the fastest backend and precision whose greedy answers agree with the "
        "eager engine's on 95% of a probe set on this CPU, calibrated once per CPU, "
        "model and versions and cached in <home>/engine/backend-choice.json (eager, at "
        "no cost, without the openvino extra).",
    )
    prefix_cache_mb: int = Field(
        default=256,
        ge=0,
        description="For `type: local`: MiB of keys and values of prompt prefixes the "
        "engine keeps to reuse (a scenario's requests share the chat template, system "
        "prompt and demos: a request prefills only what follows them); 0 turns it off.",
    )
    connect_timeout_seconds: float = Field(
        default=5.0, gt=0, description="Longest wait for a TCP connection to the upstream."
    )
    read_timeout_seconds: float = Field(
        default=120.0, gt=0, description="Longest silence between bytes from the upstream."
    )
    total_timeout_seconds: float = Field(
        default=600.0, gt=0, description="Deadline for the whole call, retries included."
    )
    max_retries: int = Field(
        default=2,
        ge=0,
        description="Retries before the first byte, on connection errors, 429 and 5xx only.",
    )
    max_connections: int = Field(
        default=256,
        ge=1,
        description="Most connections open to this upstream at once, in each of the "
        "gateway's two pools (complete answers over plain http; streams, https and admin "
        "calls). A call that finds every one busy waits for one to come free, within its "
        "total_timeout_seconds, then gets 503 with Retry-After. 256 is vLLM's default "
        "batch (max_num_seqs): requests past it queue inside the server anyway, so "
        "waiting for them in the gateway costs no throughput, and two pools of 256 stay "
        "within the usual 1024 open-files limit. Raise it to the server's batch size "
        "(vLLM on a GPU of 70 GiB or more: 1024; SGLang; a hosted API).",
    )
    max_response_bytes: int = Field(
        default=64 * 1024 * 1024,
        ge=1024,
        description="Largest answer read from this upstream: a complete body (as "
        "announced by Content-Length, or as counted when chunked or ended by the close) "
        "and the bytes of a whole stream, which the gateway reassembles for the record. "
        "Past it the call fails with 502 naming this setting (mid-stream: the dialect's "
        "error event). 64 MiB holds a 128k-token answer streamed (some 250 bytes of event "
        "per token: 32 MiB) or a batch of 2048 embeddings of 3072 dimensions in base64 "
        "(32 MiB), while 256 connections' worth of answers stays within 16 GiB; raise it "
        "for logprobs on long streamed outputs or large embedding batches as JSON floats.",
    )
    max_sse_line_bytes: int = Field(
        default=8 * 1024 * 1024,
        ge=1024,
        description="Longest line of an upstream's event stream the gateway holds while "
        "waiting for its end: an upstream that sends bytes with no line break is stopped "
        "here (502 naming this setting; mid-stream: the dialect's error event) instead of "
        "filling memory. One event is one line; the largest legitimate ones are a whole "
        "tool call's arguments sent in one delta or an image chunk in base64, and 8 MiB "
        "(the largest request body, server.max_body_bytes, by default) holds them. At most "
        "max_response_bytes.",
    )
    anthropic_version: str = Field(default="2023-06-01", description="anthropic-version header.")
    prices: dict[str, PriceConfig] = Field(
        default_factory=dict,
        description="Price per model this upstream serves (`docs/costs.md`). Empty by "
        "default: Reef never guesses a price; an unpriced model's records have no cost.",
    )
    responses: Literal["translate", "native"] = Field(
        default="translate",
        description="How POST /v1/responses reaches this upstream. translate: as chat "
        "completions, both ways (vLLM, SGLang, the embedded engine), and on to Anthropic "
        "Messages for `type: anthropic`. native: passed "
        "through to the upstream's own POST /responses (OpenAI; vLLM's Responses API), "
        "with previous_response_id resolved by Reef and Reef's response ids. Only for "
        "`type: openai`.",
    )

    checkpoint_loading: Literal["engine", "vllm", "sglang"] = Field(
        default="engine",
        description="How a release's checkpoint (full fine-tuned weights) reaches this "
        "upstream. engine: loaded beside the weights serving now (`POST /load_checkpoint`, "
        "the embedded engine), several at once. vllm: the server's one set of weights is "
        "reloaded in place from the checkpoint's directory (`POST /collective_rpc` "
        "reload_weights, then `/reset_prefix_cache`; start vLLM with "
        "VLLM_SERVER_DEV_MODE=1). sglang: the same through `POST /update_weights_from_disk`. "
        "In place, the gateway holds new requests and lets those in flight finish before "
        "it reloads, and only the serving release's weights can be reached: no canary, "
        "and a request pinned to other weights is refused (docs/releases.md).",
    )
    adapter_slots: AdapterSlotsConfig = Field(
        default_factory=AdapterSlotsConfig,
        description="The upstream's adapter slots, for the adapter cache telemetry in "
        "/metrics and /reef/status (resident adapters, evictions, the cache-cliff warning).",
    )
    base_weights: str | None = Field(
        default=None,
        description="For checkpoint_loading vllm or sglang: the directory the server "
        "reads the base model's weights from, to return to them (a rollback past every "
        "checkpoint). Default: the `root` that `GET /models` gives for the served model. "
        "Checkpoint directories are read by the server from the gateway's artifact cache, "
        "so both must see the same path.",
    )

    @model_validator(mode="after")
    def _needs_url(self) -> UpstreamConfig:
        if self.type != "local" and not self.base_url:
            raise ValueError(f"an upstream of type {self.type!r} needs base_url")
        if self.checkpoint_loading != "engine" and self.type != "openai":
            raise ValueError(
                f"checkpoint_loading: {self.checkpoint_loading} needs an upstream of type "
                f"'openai' (a {self.checkpoint_loading} server), not {self.type!r}"
            )
        if self.max_sse_line_bytes > self.max_response_bytes:
            raise ValueError(
                f"max_sse_line_bytes ({self.max_sse_line_bytes}) cannot exceed "
                f"max_response_bytes ({self.max_response_bytes}): a line is part of the answer"
            )
        if self.responses == "native" and self.type != "openai":
            raise ValueError(
                f"responses: native needs an upstream of type 'openai', not {self.type!r} "
                "(the Anthropic API and the embedded engine have no Responses API)"
            )
        return self


_MODEL_ALIAS_RE = re.compile(r"[^/\s]{1,128}")


class ScenarioConfig(Section):
    """One agent task that Reef serves and learns."""

    upstream: str | None = Field(
        default=None, description="Name of the upstream (key of `upstreams`); default: first."
    )
    model: str | None = Field(
        default=None,
        description="Upstream model name, whatever model the client names; overrides the "
        "upstream's `model`. The scenario's first release records it, and the release chain "
        "decides what serves: a model changed here later serves once `reef releases "
        "adopt-config --scenario <s>` appends a release with it (the gateway warns on start "
        "while they differ).",
    )
    model_aliases: list[str] = Field(
        default_factory=list,
        description="Model names that choose this scenario when a request has no "
        "`x-reef-scenario` header, for SDKs that refuse `reef/<scenario>` (the OpenAI Agents "
        "SDK reads `x/y` as provider/model): `model: support-agent` is then served as "
        "`reef/support` is. Unique across scenarios; no `/`.",
    )
    capture: bool = Field(default=True, description="Record this scenario's exchanges.")
    harness: Literal["managed", "client"] = Field(
        default="client",
        description="managed: the gateway renders the serving release's harness into every "
        "request. client: clients install the harness themselves (reef harness install) "
        "and the gateway forwards requests as sent.",
    )
    initial_harness: Path | None = Field(
        default=None,
        description="A harness bundle directory (with harness.yaml) for the scenario's "
        "first release. Checked before the gateway starts: a missing folder or an invalid "
        "bundle stops it with exit code 2.",
    )
    recipe: Path | None = Field(
        default=None,
        description="A learning recipe (YAML: trigger, selection, learners, gate) that the "
        "worker runs for this scenario; none: the scenario does not learn. Checked with the "
        "suites, environments and upstreams it names before a worker starts (exit code 2); "
        "read again on every worker pass, and a failure while running is logged once per "
        "change of the file.",
    )
    trust: dict[str, str] = Field(
        default_factory=dict,
        description="Trust levels of keys in this scenario, by key id (operator, user or "
        "untrusted); they override the keys' own `trust`.",
    )
    learning_budget: list[LearningBudgetLimit] = Field(
        default_factory=list,
        description="Caps on Reef's own learning spend for this scenario, per window: "
        "model calls, tokens and money by purpose (judge, reflect, eval, episode, teacher, "
        "total) and training minutes (docs/costs.md#reefs-own-spending).",
    )
    score_range: tuple[float, float] = Field(
        default=(0.0, 1.0),
        description="The lowest and highest feedback score (inclusive); a score outside is "
        "refused with 400. Recipes' score thresholds (`min_score`, "
        "`gate.holdout_reference_min_score`) are on this scale.",
    )
    distill: DistillConfig | None = Field(
        default=None,
        description="Serve a student model that learns from a teacher model "
        "(docs/distillation.md): the teacher, the escalation rules and the rollout steps. "
        "The scenario's first release then routes everything to the teacher.",
    )

    @field_validator("model_aliases")
    @classmethod
    def _aliases_are_names(cls, aliases: list[str]) -> list[str]:
        for alias in aliases:
            if not _MODEL_ALIAS_RE.fullmatch(alias):
                raise ValueError(
                    f"model alias {alias[:80]!r} must be 1-128 characters without '/' or "
                    "whitespace (an SDK that reads 'x/y' as provider/model would split it)"
                )
        return aliases

    @model_validator(mode="after")
    def _trust_levels(self) -> ScenarioConfig:
        for key_id, level in self.trust.items():
            parse_trust(level, f"trust of api key {key_id!r}")
        check_learning_limits("learning_budget", self.learning_budget)
        low, high = self.score_range
        if not (math.isfinite(low) and math.isfinite(high) and low < high):
            raise ValueError(
                f"score_range must be two finite numbers, lowest first, got {[low, high]}"
            )
        return self


class StoreConfig(Section):
    """Where experience is stored and how durably."""

    url: str | None = Field(
        default=None,
        description="SQLAlchemy URL: sqlite:///path or postgresql://... "
        "Default: SQLite at <home>/reef.db.",
    )
    durability: Literal["sync", "async"] = Field(
        default="sync",
        description="sync: a response completes only after its record is committed. "
        "async: records are queued and committed shortly after.",
    )
    queue_size: int = Field(default=10_000, gt=0, description="Bound of the capture queue.")
    overflow: Literal["block", "drop"] = Field(
        default="block",
        description="When the async queue is full: block (the request waits for room) or "
        "drop (the record is dropped and counted in reef_capture_dropped_total).",
    )
    max_batch: int = Field(default=256, gt=0, description="Most records per group commit.")


class ArtifactsConfig(Section):
    """Where adapters and harness bundles are kept, content-addressed."""

    url: str | None = Field(
        default=None,
        description="A local directory or any fsspec URL (file://, s3://, memory://, ...). "
        "Default: <home>/artifacts.",
    )


class ActivationConfig(Section):
    """How a gateway follows the release chain."""

    poll_interval_seconds: float = Field(
        default=0.5, gt=0, description="How often the gateway looks for moved heads."
    )
    max_adapters: int = Field(
        default=4,
        ge=1,
        description="Adapters kept loaded in each upstream; the least recently used beyond "
        "this are unloaded (never one that a request still uses).",
    )
    max_checkpoints: int = Field(
        default=2,
        ge=1,
        description="Checkpoints (full fine-tuned weights) kept loaded in each upstream "
        "besides its base model; the least recently used beyond this are unloaded after a "
        "flip (never one that serves or that a request still uses).",
    )
    unload_adapters: bool = Field(
        default=True,
        description="Unload least recently used adapters beyond max_adapters. Turn off when "
        "several gateways share one upstream (one gateway's unload would pull an adapter "
        "from under the others); the upstream's own limit (vLLM --max-loras) then applies.",
    )
    warmup: bool = Field(
        default=True, description="Send one short request through a new adapter before the flip."
    )
    adapter_cache_interval_seconds: float = Field(
        default=15.0,
        gt=0,
        description="How often the gateway lists each adapter-serving upstream's models for "
        "the adapter cache telemetry: adapters resident against the upstream's slots "
        "(upstreams.<name>.adapter_slots), evictions, the cache-cliff warning.",
    )
    stage_timeout_seconds: float = Field(
        default=120.0, gt=0, description="Longest a release may take to stage."
    )
    verify: bool = Field(
        default=True,
        description="Probe every adapter or checkpoint after loading it with the fingerprint "
        "its trainer recorded, and fail staging when the upstream answers otherwise "
        "(docs/releases.md, verified activation).",
    )
    verify_interval_seconds: float = Field(
        default=300.0,
        ge=0,
        description="How often the gateway probes the weights every scenario serves again "
        "(and loads them again when the upstream evicted or changed them); 0 turns it off "
        "(the probe right after each flip stays).",
    )


class ApiKeyConfig(Section):
    """An API key. Give `key` (hashed at load, never stored) or its `sha256`."""

    id: str = Field(description="Name of the key; stored as the principal of what it sends.")
    key: SecretStr | None = Field(default=None, description="The key itself.")
    sha256: str | None = Field(default=None, description="Hex sha256 of the key.")
    role: Literal["inference", "admin"] = Field(
        default="inference",
        description="inference: inference and feedback; admin: everything, admin API included.",
    )
    scenarios: list[str] | None = Field(
        default=None,
        description="Limit the key to these scenarios (inference and admin keys alike: "
        "every route of another scenario, and every route that spans all scenarios such "
        "as /reef/status and /metrics, is refused).",
    )
    trust: str | None = Field(
        default=None,
        description="How far what this key sends is trusted: operator, user or untrusted "
        "(default: operator for admin keys, user for inference keys). Feedback keeps the "
        "level its author had; the gate counts evidence below the recipe's "
        "`gate.evidence_min_trust` only when no single author decides the outcome.",
    )

    @model_validator(mode="after")
    def _hash_key(self) -> ApiKeyConfig:
        if self.trust is not None:
            parse_trust(self.trust, f"api key {self.id!r}")
        if (self.key is None) == (self.sha256 is None):
            raise ValueError(f"api key {self.id!r}: give exactly one of `key` or `sha256`")
        if self.key is not None:
            digest = hashlib.sha256(self.key.get_secret_value().encode()).hexdigest()
            object.__setattr__(self, "sha256", digest)
            object.__setattr__(self, "key", None)
        elif not re.fullmatch(r"[0-9a-f]{64}", self.sha256 or ""):
            raise ValueError(f"api key {self.id!r}: sha256 must be 64 lowercase hex digits")
        return self

    def trust_level(self) -> Trust:
        """The key's own level (``trust``, else by role)."""
        if self.trust is not None:
            return parse_trust(self.trust, f"api key {self.id!r}")
        return "operator" if self.role == "admin" else "user"


class AuthConfig(Section):
    """API keys. With none configured the gateway listens on loopback only."""

    keys: list[ApiKeyConfig] = Field(
        default_factory=list, description="Accepted keys; none means no auth, loopback only."
    )


class CaptureConfig(Section):
    """What is recorded and what is scrubbed first."""

    redact_patterns: list[str] = Field(
        default_factory=list,
        description="Regular expressions; matches in every stored string (request, "
        "response, error, tag values, stored Responses state, feedback text, corrections "
        "and metadata) are replaced by [REDACTED] before the write, and in what reef "
        "export writes.",
    )
    embedding_vectors: Literal["omit", "keep"] = Field(
        default="omit",
        description="What an embeddings record keeps of its answer. omit: the model, usage "
        "and each vector's dimension count, not the vectors (they are large and nothing "
        "learns from them; a retry under the same idempotency key is then answered "
        "afresh). keep: the whole response, vectors included.",
    )

    @field_validator("redact_patterns")
    @classmethod
    def _compiles(cls, patterns: list[str]) -> list[str]:
        for pattern in patterns:
            try:
                re.compile(pattern)
            except re.error as exc:
                raise ValueError(f"redact pattern {pattern!r} is not a regex: {exc}") from exc
        return patterns


class EvaluationConfig(Section):
    """How the evaluation gate reaches the gateway it evaluates through."""

    gateway_url: str | None = Field(
        default=None,
        description="Base URL of a gateway (without /v1) the gate sends its eval calls to. "
        "Default: this configuration's own gateway on 127.0.0.1.",
    )
    api_key: SecretStr | None = Field(
        default=None,
        description="Key the gate sends when the gateway requires one. `reef serve` makes "
        "a random in-memory key for its own worker when this is unset.",
    )


class OtelConfig(Section):
    """Live export of every exchange as an OpenTelemetry GenAI span over OTLP."""

    enabled: bool = Field(
        default=False,
        description="Send one span per recorded exchange, and feedback and gate results as "
        "gen_ai.evaluation.result events, to an OTLP collector. Needs the otel extra: "
        "pip install 'reef-agent[otel]'.",
    )
    endpoint: str | None = Field(
        default=None,
        description="The collector's URL. Default: http://localhost:4318/v1/traces for "
        "http/protobuf, http://localhost:4317 for grpc. For http/protobuf give the whole "
        "URL, /v1/traces included.",
    )
    protocol: Literal["http/protobuf", "grpc"] = Field(
        default="http/protobuf", description="The OTLP transport."
    )
    headers: dict[str, SecretStr] = Field(
        default_factory=dict,
        description="Headers sent with every export (an API key of a hosted collector); "
        "masked in `reef config show`.",
    )
    service_name: str = Field(
        default="reef", min_length=1, description="The spans' `service.name` resource attribute."
    )
    capture_content: bool = Field(
        default=False,
        description="Also send the messages (gen_ai.input.messages, gen_ai.output.messages), "
        "after capture.redact_patterns. Off: spans carry models, usage, ids and timings only.",
    )
    max_queue_size: int = Field(
        default=2048,
        ge=1,
        description="Spans held for export; when the collector falls behind, newer spans "
        "are dropped rather than slow a request.",
    )
    max_export_batch_size: int = Field(
        default=512, ge=1, description="Spans per export request (at most max_queue_size)."
    )
    schedule_delay_seconds: float = Field(
        default=1.0, gt=0, description="Longest wait before queued spans are exported."
    )
    timeout_seconds: float = Field(
        default=10.0, gt=0, description="Time allowed for one export, retries included."
    )

    @model_validator(mode="after")
    def _batch_fits_queue(self) -> OtelConfig:
        if self.max_export_batch_size > self.max_queue_size:
            raise ValueError(
                f"otel.max_export_batch_size ({self.max_export_batch_size}) must be at most "
                f"otel.max_queue_size ({self.max_queue_size})"
            )
        return self


# The YAML file's contents for the settings being built; set by ``load_settings`` only.
yaml_data: contextvars.ContextVar[dict[str, Any] | None] = contextvars.ContextVar(
    "reef_yaml_data", default=None
)


class _YamlSource(PydanticBaseSettingsSource):
    """Settings source for the YAML file's contents (lower priority than the env)."""

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        return (yaml_data.get() or {}).get(field_name), field_name, False

    def __call__(self) -> dict[str, Any]:
        return dict(yaml_data.get() or {})


_DEFAULT_SCENARIO = ScenarioConfig()  # frozen; shared by every unconfigured scenario


def _default_upstreams() -> dict[str, UpstreamConfig]:
    return {"local": UpstreamConfig(type="local")}


class ReefSettings(BaseSettings):
    """The whole configuration (``reef.yaml`` + ``REEF_…`` environment)."""

    model_config = SettingsConfigDict(
        env_prefix="REEF_",
        env_nested_delimiter="__",
        extra="forbid",
        frozen=True,
    )

    home: Path = Field(
        default=Path(".reef"), description="Directory for local state (store, models)."
    )
    server: ServerConfig = Field(
        default_factory=ServerConfig, description="The gateway's listener."
    )
    store: StoreConfig = Field(default_factory=StoreConfig, description="The experience store.")
    upstreams: dict[str, UpstreamConfig] = Field(
        default_factory=_default_upstreams,
        description="Model servers by name. Default: one `local` upstream, the embedded engine.",
    )
    scenarios: dict[str, ScenarioConfig] = Field(
        default_factory=dict,
        description="Per-scenario settings; unlisted scenarios use the first upstream.",
    )
    auth: AuthConfig = Field(default_factory=AuthConfig, description="API keys and roles.")
    capture: CaptureConfig = Field(
        default_factory=CaptureConfig, description="What is recorded and scrubbed."
    )
    artifacts: ArtifactsConfig = Field(
        default_factory=ArtifactsConfig, description="The artifact store."
    )
    activation: ActivationConfig = Field(
        default_factory=ActivationConfig, description="Following the release chain."
    )
    evaluation: EvaluationConfig = Field(
        default_factory=EvaluationConfig, description="The evaluation gate's gateway access."
    )
    otel: OtelConfig = Field(
        default_factory=OtelConfig, description="Live export of exchanges over OTLP."
    )
    budgets: BudgetsConfig = Field(
        default_factory=BudgetsConfig, description="Serving budgets (402 when spent)."
    )
    rate_limits: RateLimitsConfig = Field(
        default_factory=RateLimitsConfig, description="Rate limits (429 when exceeded)."
    )

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        """Precedence: explicit arguments, then ``REEF_…`` env, then the YAML file."""
        return (init_settings, env_settings, _YamlSource(settings_cls))

    @model_validator(mode="after")
    def _references_resolve(self) -> ReefSettings:
        if not self.upstreams:
            raise ValueError("at least one upstream must be configured")
        for name, scenario in self.scenarios.items():
            if scenario.upstream is not None and scenario.upstream not in self.upstreams:
                raise ValueError(
                    f"scenarios.{name}.upstream: scenario {name!r} names upstream "
                    f"{scenario.upstream!r}, which is not configured; configured upstreams: "
                    f"{sorted(self.upstreams)}"
                )
        self.model_aliases()  # raises on an alias claimed twice
        ids = [key.id for key in self.auth.keys]
        if len(ids) != len(set(ids)):
            raise ValueError("api key ids must be unique")
        for name, scenario in self.scenarios.items():
            unknown = sorted(set(scenario.trust) - set(ids))
            if unknown:
                raise ValueError(
                    f"scenario {name!r} sets the trust of unknown api key(s) {unknown}; "
                    f"configured keys: {sorted(ids)}"
                )
        check_spend(self)
        check_distill(self)
        return self

    def trust_of(self, key_id: str | None, scenario: str) -> Trust:
        """The trust level of ``key_id`` in ``scenario``: the scenario's override, else the
        key's own level. With no keys configured (``key_id`` None) the caller is the
        operator."""
        if key_id is None:
            return "operator"
        override = self.scenario(scenario).trust.get(key_id)
        if override is not None:
            return parse_trust(override, f"trust of api key {key_id!r}")
        for key in self.auth.keys:
            if key.id == key_id:
                return key.trust_level()
        return "untrusted"

    def gateway_url(self) -> str:
        """Where the evaluation gate calls the gateway (``evaluation.gateway_url`` or this
        configuration's own listener on loopback)."""
        if self.evaluation.gateway_url:
            return self.evaluation.gateway_url.rstrip("/")
        return f"http://127.0.0.1:{self.server.port}"

    def store_url(self) -> str:
        """The store URL, defaulting to SQLite under ``home``."""
        return self.store.url or f"sqlite:///{self.home / 'reef.db'}"

    def artifacts_url(self) -> str:
        """The artifact store URL, defaulting to a directory under ``home``."""
        return self.artifacts.url or str(self.home / "artifacts")

    def bind_host(self) -> str:
        """The address to bind: loopback unless keys protect the gateway."""
        if self.server.host:
            return self.server.host
        return "0.0.0.0" if self.auth.keys else "127.0.0.1"  # noqa: S104 (all interfaces only when keys guard the gateway)

    def scenario(self, name: str) -> ScenarioConfig:
        """The scenario's config; an unconfigured scenario gets the defaults."""
        return self.scenarios.get(name) or _DEFAULT_SCENARIO

    def model_aliases(self) -> dict[str, str]:
        """Each configured model alias and the scenario it chooses; ``ValueError`` when
        two scenarios claim one alias."""
        aliases: dict[str, str] = {}
        for name, scenario in self.scenarios.items():
            for alias in scenario.model_aliases:
                if aliases.setdefault(alias, name) != name:
                    raise ValueError(
                        f"model alias {alias!r} is claimed by scenarios {aliases[alias]!r} "
                        f"and {name!r}; an alias chooses one scenario"
                    )
        return aliases

    def upstream_for(self, scenario: str) -> tuple[str, UpstreamConfig]:
        """Name and config of the upstream that serves ``scenario``."""
        name = self.scenario(scenario).upstream or next(iter(self.upstreams))
        return name, self.upstreams[name]
