"""A vLLM-protocol server on loopback whose adapters answer as their weights would.

A vLLM server cannot run here at test speed, so this one stands in for it at the
protocol: ``/v1/load_lora_adapter`` reads the adapter directory's fingerprint
(``reef-fingerprint.json``, what the trained weights answered) and, asked one of its
probes on the adapter's name (``/v1/chat/completions``, greedy), answers those tokens,
their logprobs, ``token_ids`` and the finish reason, as vLLM serving those weights would.
Anything else, and every request to the base model, gets the base model's answer: other
tokens. ``GET /v1/models`` lists the base model and the loaded adapters.

Two faults of real servers can be played:

- ``impostor``: a directory whose weights every later load serves instead of the one
  asked for (another digest's weights under the expected name);
- ``evict(name)``: the adapter is dropped silently, as vLLM's LRU drops one beyond
  ``--max-cpu-loras``: no longer listed, and its name answers with the base weights;
  ``evict_after(name, answers)`` does the same once ``name`` has answered that many
  requests (say, right after its staging's warm-up and probes, before the flip).

It also reloads its base weights in place as vLLM does in dev mode (``POST
/collective_rpc`` reload_weights with ``weights_path``, then ``POST
/reset_prefix_cache``) and as SGLang does (``POST /update_weights_from_disk`` with
``model_path``; ``/v1/models`` gives ``BASE_ROOT`` as the base's ``root``): the
base model's name then answers as the checkpoint's fingerprint says.
``impostor_reload``: a directory the next reload serves instead of the one asked for
(once). ``token_ids = False`` leaves out vLLM's ``token_ids`` (SGLang returns none:
text is compared).
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

from aiohttp import web

from tests.fakes.loopback import LoopbackThread

BASE_MODEL = "fake-model"  # the model tests.gateway.harness.make_settings names
FINGERPRINT_FILE = "reef-fingerprint.json"  # as reef.releases names it
BASE_TOKENS = [7, 7, 7, 7]
BASE_ROOT = "/srv/models/fake-base"


class FingerprintedUpstream(LoopbackThread):
    """The server (module docstring). Read ``adapters`` (name → directory served) and
    ``loads`` (load calls) from tests."""

    def __init__(self) -> None:
        super().__init__()
        self.adapters: dict[str, Path] = {}
        self.loads = 0
        self.impostor: Path | None = None
        self.last_model: str | None = None
        self.weights: Path | None = None  # the base's weights reloaded in place (None: base)
        self.reloaded: list[str] = []
        self.impostor_reload: Path | None = None
        self._evict_after: dict[str, int] = {}
        self.token_ids = True
        self._lock = threading.Lock()

    def evict(self, name: str) -> None:
        """Drop ``name`` silently (module docstring)."""
        with self._lock:
            self.adapters.pop(name, None)

    def evict_after(self, name: str, answers: int) -> None:
        """Drop ``name`` silently once it has answered ``answers`` more requests."""
        with self._lock:
            self._evict_after[name] = answers

    def routes(self, app: web.Application) -> None:
        """vLLM's routes that activation uses."""
        app.router.add_get("/v1/models", self._models)
        app.router.add_post("/v1/load_lora_adapter", self._load)
        app.router.add_post("/v1/unload_lora_adapter", self._unload)
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_post("/collective_rpc", self._collective_rpc)
        app.router.add_post("/reset_prefix_cache", self._reset_prefix_cache)
        app.router.add_post("/update_weights_from_disk", self._update_weights_from_disk)

    async def _models(self, request: web.Request) -> web.Response:
        with self._lock:
            names = [BASE_MODEL, *self.adapters]
        data = [{"id": name, "object": "model", "owned_by": "vllm"} for name in names]
        data[0]["root"] = BASE_ROOT
        return web.json_response({"object": "list", "data": data})

    async def _load(self, request: web.Request) -> web.Response:
        body = await request.json()
        name, path = body["lora_name"], Path(body["lora_path"])
        with self._lock:
            if name in self.adapters:
                return web.json_response(
                    {"error": {"message": f"The lora adapter '{name}' has already been loaded."}},
                    status=400,
                )
            self.adapters[name] = self.impostor or path
            self.loads += 1
        return web.Response(text=f"Success: LoRA adapter '{name}' added successfully.")

    async def _collective_rpc(self, request: web.Request) -> web.Response:
        body = await request.json()
        if body.get("method") != "reload_weights":
            return web.json_response({"detail": "unknown method"}, status=400)
        self._reload(str(body["kwargs"]["weights_path"]))
        return web.json_response({"results": [None]})

    async def _update_weights_from_disk(self, request: web.Request) -> web.Response:
        body = await request.json()
        self._reload(str(body["model_path"]))
        return web.json_response({"success": True, "message": "Succeeded to update weights."})

    def _reload(self, path: str) -> None:
        with self._lock:
            self.reloaded.append(path)
            served = self.impostor_reload or Path(path)
            self.impostor_reload = None
            self.weights = None if path == BASE_ROOT else served

    async def _reset_prefix_cache(self, request: web.Request) -> web.Response:
        return web.json_response({"success": True})

    async def _unload(self, request: web.Request) -> web.Response:
        body = await request.json()
        with self._lock:
            self.adapters.pop(body["lora_name"], None)
        return web.Response(text="Success")

    async def _chat(self, request: web.Request) -> web.Response:
        body = await request.json()
        model = body["model"]
        self.last_model = model
        with self._lock:
            directory = self.weights if model == BASE_MODEL else self.adapters.get(model)
            if directory is not None and model in self._evict_after:
                self._evict_after[model] -= 1
                if self._evict_after[model] <= 0:  # this answer is its last
                    del self._evict_after[model]
                    self.adapters.pop(model, None)
        if model != BASE_MODEL and directory is None:
            message = f"The model `{model}` does not exist."
            return web.json_response({"error": {"message": message, "code": 404}}, status=404)
        limit = int(body.get("max_tokens") or 16)
        tokens, logprobs, ended = _answer(directory, body["messages"])
        tokens, logprobs = tokens[:limit], logprobs[:limit]
        finish = "stop" if ended and limit > len(tokens) else "length"
        content = [
            {"token": f"t{t}", "logprob": lp, "top_logprobs": []}
            for t, lp in zip(tokens, logprobs, strict=True)
        ]
        choice: dict[str, Any] = {
            "index": 0,
            "message": {"role": "assistant", "content": "".join(f"t{t}" for t in tokens)},
            "finish_reason": finish,
            "logprobs": {"content": content} if body.get("logprobs") else None,
        }
        if body.get("return_token_ids") and self.token_ids:
            choice["token_ids"] = tokens
        return web.json_response(
            {"id": "chatcmpl-1", "object": "chat.completion", "model": model, "choices": [choice]}
        )


def _answer(
    directory: Path | None, messages: list[dict[str, Any]]
) -> tuple[list[int], list[float], bool]:
    """What the weights in ``directory`` answer to ``messages`` (the base's: None)."""
    if directory is not None and (directory / FINGERPRINT_FILE).is_file():
        fingerprint = json.loads((directory / FINGERPRINT_FILE).read_text())
        for probe in fingerprint["probes"]:
            if probe["messages"] == messages:
                return list(probe["tokens"]), list(probe["logprobs"]), bool(probe["ended"])
    return list(BASE_TOKENS), [-0.5] * len(BASE_TOKENS), False
