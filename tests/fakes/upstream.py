"""A fake model server on loopback that speaks the OpenAI and Anthropic dialects.

Replies are deterministic: ``echo: <last user text>`` (a legacy text completion:
``echo: <prompt>``; an embedding: ``embedding_dimensions`` floats, or ``dimensions``,
derived from the text's digest); with tools offered and
"weather" in the last user text, a call of the first tool with ``{"city": "Paris"}``
(with "parallel" in the text too, two calls at once: Paris, then Rome); after a tool
result, ``tool said: <result>``. Usage counts words.

Failures are chosen by a token in the last user text (so official SDK clients can
trigger them) or by the ``x-fake-behavior`` header: see ``BEHAVIORS``. ``*-once``
behaviours fail the first time a request is seen, keyed by ``x-fake-request-id`` or
else the last user text (so put an id in the text: "fail-500-once req-7").

Run standalone (benchmarks): ``python -m tests.fakes.upstream --port 8001``.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import hashlib
import re
import struct
import threading
from collections import Counter
from collections.abc import Iterator, Mapping
from pathlib import Path
from types import TracebackType
from typing import Any, Final

import orjson
from aiohttp import web

from tests.fakes.responses_api import item_text, last_input, responses_answer, responses_events
from tests.fakes.teacher import token_logprobs

BEHAVIORS: Final = frozenset(
    {
        "fail-500",  # always 500
        "fail-500-once",  # 500 the first time a request is seen, then success
        "fail-429-once",  # 429 with Retry-After: 0 the first time, then success
        "hang",  # never answers
        "drop-mid-stream",  # a little of the body, then the connection closes
        "slow-stream",  # a chunk every `slow_interval` s, `slow_chunks` times
        "bad-request",  # 400 with a dialect-shaped error
        "hold-answer",  # waits until `release_held()`, then answers as usual
        # -- stream ends (streams only unless noted) --
        "truncate-stream",  # some of the answer, then a clean end without the terminal event
        "stall-stream",  # some of the answer, then silence until the client leaves
        "malformed-stream",  # an event whose data is not JSON, then the rest of the stream
        "malformed-sse",  # JSON lines without SSE framing (NDJSON); not streaming: SSE, not JSON
        "error-mid-stream",  # the dialect's error event mid-way (OpenAI: then [DONE])
        # -- more failures (streams and not) --
        "fail-502",  # always 502
        "fail-501",  # always 501: the route is not implemented
        "fail-503-once",  # 503 with Retry-After: 1 the first time, then success
        "reset-before-headers",  # the connection closes before any response byte
        "stall-body",  # headers and half the JSON body, then silence (not streaming)
        "malformed-json",  # 200 with a body that is not JSON (not streaming)
        "wrong-content-type",  # 200 text/html: a proxy's welcome page
        "huge-answer",  # an answer of `huge_bytes` (100 MB), streamed in 64 KiB words
    }
)
_STREAM_ENDS: Final = frozenset(
    {"truncate-stream", "stall-stream", "malformed-stream", "error-mid-stream"}
)
_TRICKLED: Final = frozenset({"slow-stream", "drop-mid-stream", "stall-body"})
CREATED: Final = 1_700_000_000
_WORD_PIECES = re.compile(r"\S+\s*")
_JSON = "application/json"
_SSE_HEADERS: Final = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}


_RELOADED = "\0reloaded"  # adapter_weights' key for the weights reloaded in place


class FakeUpstream:
    """The fake server. Counters (read them from tests):

        - ``requests``: ``Counter`` of request paths received (every attempt counts), also
          as ``requests_received(path)``;
        - ``last_request_path``, ``last_request_body`` (parsed JSON or ``None``),
          ``last_request_headers`` (case-insensitive);
        - ``peers``: client (host, port) pairs seen, i.e. the connections used;
        - ``cancelled_streams``: streams whose client left before the end;
          ``completed_streams``: slow streams sent to the end;
        - ``held``: requests waiting (``hold-answer``) for ``release_held()``;
        - ``adapters``: adapters loaded through vLLM's runtime LoRA API, which the fake
          serves only when made with ``adapters=True`` (else loading one fails with 404).

        It serves vLLM's ``POST /tokenize`` (one token per word) unless made with
        ``tokenize=False``, Anthropic's ``/v1/messages/count_tokens``, and OpenAI's legacy
        ``/v1/completions`` and ``/v1/embeddings`` unless made with ``text_routes=False``,
        and its own Responses API (``/v1/responses``, ``tests.fakes.responses_api``).

        With ``lists_adapters=True`` ``GET /v1/models`` lists every loaded adapter after
        the models, as vLLM does (a card whose ``parent`` is the first model, ``root`` the
        adapter's path); ``evict(name)`` drops one silently, as vLLM's LRU cache does.

        ``card_extra`` adds fields to each model's card in ``GET /v1/models`` (a server
        that tells its adapter slots: ``{"max_loras": 2}``).

        With ``cached_prompt_tokens=N`` its usage reports that many of each prompt's
        tokens (at most all of them) as read from a prompt cache: chat's
        ``prompt_tokens_details.cached_tokens`` (streamed usage too), Anthropic's
        ``cache_read_input_tokens`` (its ``input_tokens`` then the rest, as Anthropic
        counts them).

        With ``strict_models=True`` a request for a model that is neither in ``models`` nor
        a loaded adapter is a 404, as vLLM answers it.

        A loaded adapter (or the model, once its weights were reloaded in place) answers
        the probes of a fingerprint (``reef-fingerprint.json``) as the weights it holds
        would: the first fingerprint seen beside a set of
        weights (its ``*.safetensors`` bytes) is what those weights answer, under any
        name and from any directory, so a directory holding another adapter's weights
        under its own fingerprint answers as those weights (greedy tokens, logprobs,
        vLLM's ``token_ids``, the end of turn), and staging can refuse it.

        With ``reloads="vllm"`` it reloads its weights in place as vLLM does in dev mode
        (``POST /collective_rpc`` reload_weights with ``weights_path``, then
        ``POST /reset_prefix_cache``); with ``reloads="sglang"`` through
        ``POST /update_weights_from_disk`` (``refuse_reload=True``: ``success: false`` for any
    directory but ``base_path``).
        ``GET /v1/models`` then gives ``base_path`` as its model's ``root``, and a chat answer
        names the weights' directory: ``echo[<directory name>]: <text>``, chosen when the
        request arrives. ``weights`` is the directory loaded now, ``reloaded`` every one
        loaded (in order), ``in_flight_at_reload`` how many chat requests were being answered
        at each reload, ``prefix_resets`` the prefix-cache resets.
    """

    def __init__(
        self,
        *,
        api_key: str | None = None,
        models: tuple[str, ...] = ("fake-model",),
        slow_chunks: int = 200,
        slow_interval: float = 0.05,
        adapters: bool = False,
        strict_models: bool = False,
        huge_bytes: int = 100 * 1024 * 1024,
        tokenize: bool = True,
        text_routes: bool = True,
        embedding_dimensions: int = 8,
        reloads: str | None = None,
        base_path: str = "/srv/models/fake-base",
        refuse_reload: bool = False,
        lists_adapters: bool = False,
        card_extra: dict[str, Any] | None = None,
        cached_prompt_tokens: int = 0,
    ) -> None:
        self.lists_adapters = lists_adapters
        self.cached_prompt_tokens = cached_prompt_tokens
        self.adapter_paths: dict[str, str] = {}
        self.weights_answers: dict[str, list[dict[str, Any]]] = {}  # weights → probes
        self.adapter_weights: dict[str, str] = {}  # adapter name → its weights
        self.reloads = reloads
        self.base_path = base_path
        self.weights = base_path
        self.reloaded: list[str] = []
        self.in_flight_at_reload: list[int] = []
        self.prefix_resets = 0
        self.refuse_reload = refuse_reload
        self.in_flight = 0
        self.serves_tokenize = tokenize
        self.serves_text_routes = text_routes
        self.embedding_dimensions = embedding_dimensions
        self.api_key = api_key
        self.serves_adapters = adapters
        self.strict_models = strict_models
        self.adapters: set[str] = set()
        self.held = 0
        self._release: asyncio.Event | None = None
        self.models = models
        self.slow_chunks = slow_chunks
        self.slow_interval = slow_interval
        self.huge_bytes = huge_bytes
        self._huge: tuple[str, list[str]] | None = None
        self.requests: Counter[str] = Counter()
        self.last_request_path: str | None = None
        self.last_request_body: Any = None
        self.last_request_headers: Mapping[str, str] = {}
        self.peers: set[Any] = set()
        self.cancelled_streams = 0
        self.completed_streams = 0
        self._seen: set[tuple[str, str]] = set()
        self._serial = 0
        self._runner: web.AppRunner | None = None
        self._stopping: asyncio.Event | None = None
        self.port = 0
        self.host = "127.0.0.1"
        listed = _models_list(models)
        for card in listed["data"]:
            card.update(card_extra or {})
        if reloads is not None:
            for card in listed["data"]:
                card["root"] = base_path
        self._models_body = orjson.dumps(listed)

    @property
    def base_url(self) -> str:
        """``http://host:port/v1``."""
        return f"http://{self.host}:{self.port}/v1"

    def requests_received(self, path: str) -> int:
        """How many requests (attempts) arrived for ``path``, e.g. ``/v1/chat/completions``."""
        return self.requests[path]

    def reset(self) -> None:
        """Forget counters and seen requests."""
        self.requests.clear()
        self.last_request_path = self.last_request_body = None
        self.last_request_headers = {}
        self.peers.clear()
        self.cancelled_streams = self.completed_streams = 0
        self._seen.clear()
        if self._release is not None:
            self._release.clear()

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> None:
        """Listen on ``host:port`` (0: a free port, then in ``.port``)."""
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_post("/v1/chat/completions", self._chat_completions)
        app.router.add_post("/v1/messages", self._messages)
        app.router.add_post("/v1/messages/count_tokens", self._count_tokens)
        app.router.add_get("/v1/models", self._list_models)
        if self.serves_tokenize:
            app.router.add_post("/tokenize", self._tokenize)
        if self.serves_text_routes:
            app.router.add_post("/v1/completions", self._completions)
            app.router.add_post("/v1/embeddings", self._embeddings)
        app.router.add_post("/v1/responses", self._responses)
        if self.serves_adapters:
            app.router.add_post("/v1/load_lora_adapter", self._load_adapter)
            app.router.add_post("/v1/unload_lora_adapter", self._unload_adapter)
        if self.reloads == "vllm":
            app.router.add_post("/collective_rpc", self._collective_rpc)
            app.router.add_post("/reset_prefix_cache", self._reset_prefix_cache)
        elif self.reloads == "sglang":
            app.router.add_post("/update_weights_from_disk", self._update_weights_from_disk)
        self._stopping = asyncio.Event()
        self._release = asyncio.Event()
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=1.0)
        await self._runner.setup()
        site = web.TCPSite(self._runner, host, port)
        await site.start()
        self.host = host
        self.port = self._runner.addresses[0][1]

    def release_held(self) -> None:
        """Let every ``hold-answer`` request answer, now and until ``reset()``."""
        assert self._release is not None
        self._release.set()

    async def stop(self) -> None:
        """Stop listening; hanging handlers return."""
        if self._stopping is not None:
            self._stopping.set()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    # -- handlers ------------------------------------------------------------------

    def evict(self, name: str) -> None:
        """Drop the loaded adapter ``name`` without being asked (vLLM's LRU eviction)."""
        self.adapters.discard(name)

    async def _list_models(self, request: web.Request) -> web.StreamResponse:
        self._note(request, None)
        if denied := self._denied(request, anthropic="anthropic-version" in request.headers):
            return denied
        if self.lists_adapters and self.adapters:
            listed = orjson.loads(self._models_body)
            parent = self.models[0] if self.models else None
            listed["data"] += [
                {
                    "id": name,
                    "object": "model",
                    "created": CREATED,
                    "owned_by": "fake",
                    "root": self.adapter_paths.get(name, name),
                    "parent": parent,
                }
                for name in sorted(self.adapters)
            ]
            return web.Response(body=orjson.dumps(listed), content_type=_JSON)
        return web.Response(body=self._models_body, content_type=_JSON)

    async def _load_adapter(self, request: web.Request) -> web.StreamResponse:
        body = orjson.loads(await request.read())
        self._note(request, body)
        name = body["lora_name"]
        if name in self.adapters and not body.get("load_inplace"):
            # vLLM's answer, word for word: a 400 whose only tell is the message.
            error = {
                "object": "error",
                "message": f"The lora adapter '{name}' has already been loaded.",
                "type": "BadRequestError",
                "param": None,
                "code": 400,
            }
            return web.json_response(error, status=400)
        self.adapters.add(name)
        self.adapter_paths[name] = str(body.get("lora_path", name))
        self._learn_weights(name, Path(self.adapter_paths[name]))
        return web.Response(text=f"Success: LoRA adapter '{name}' added.")

    def _learn_weights(self, name: str, directory: Path) -> None:
        """Note which weights ``name`` holds and, the first time they are seen beside a
        fingerprint, what they answer (the class docstring)."""
        files = sorted(directory.glob("*.safetensors")) if directory.is_dir() else []
        if not files:
            self.adapter_weights.pop(name, None)
            return
        digest = hashlib.sha256()
        for file in files:
            digest.update(file.read_bytes())
        weights = digest.hexdigest()
        self.adapter_weights[name] = weights
        fingerprint = directory / "reef-fingerprint.json"
        if weights not in self.weights_answers and fingerprint.is_file():
            self.weights_answers[weights] = orjson.loads(fingerprint.read_bytes())["probes"]

    def _probe_answer(self, body: Any) -> web.Response | None:
        """The answer of a loaded adapter's weights to one of their fingerprint's probes
        (None: not a probe of the weights asked for)."""
        model = body.get("model")
        weights = None
        if model in self.adapters:
            weights = self.adapter_weights.get(model)
        elif model in self.models:  # the weights reloaded in place, if any
            weights = self.adapter_weights.get(_RELOADED)
        messages = body.get("messages")
        probe = next(
            (p for p in self.weights_answers.get(weights or "", []) if p["messages"] == messages),
            None,
        )
        if probe is None:
            return None
        limit = int(body.get("max_tokens") or 16)
        tokens, logprobs = probe["tokens"][:limit], probe["logprobs"][:limit]
        text = probe["text"] if len(tokens) == len(probe["tokens"]) else None
        content = [
            {"token": str(t), "logprob": lp, "top_logprobs": []}
            for t, lp in zip(tokens, logprobs, strict=True)
        ]
        choice: dict[str, Any] = {
            "index": 0,
            "message": {"role": "assistant", "content": text or ""},
            "finish_reason": "stop" if probe["ended"] and limit > len(tokens) else "length",
            "logprobs": {"content": content} if body.get("logprobs") else None,
        }
        if body.get("return_token_ids"):
            choice["token_ids"] = tokens
        usage = {"prompt_tokens": 1, "completion_tokens": len(tokens)}
        usage["total_tokens"] = 1 + len(tokens)
        answer = {"id": "chatcmpl-probe", "object": "chat.completion", "model": model}
        return web.json_response({**answer, "choices": [choice], "usage": usage})

    async def _unload_adapter(self, request: web.Request) -> web.StreamResponse:
        body = orjson.loads(await request.read())
        self._note(request, body)
        self.adapters.discard(body["lora_name"])
        return web.Response(text=f"Success: LoRA adapter '{body['lora_name']}' removed.")

    async def _collective_rpc(self, request: web.Request) -> web.StreamResponse:
        body = orjson.loads(await request.read())
        self._note(request, body)
        if body.get("method") != "reload_weights":
            return web.json_response({"detail": "unknown method"}, status=400)
        self._reload(body["kwargs"]["weights_path"])
        return web.json_response({"results": [None]})

    async def _reset_prefix_cache(self, request: web.Request) -> web.StreamResponse:
        self._note(request, None)
        self.prefix_resets += 1
        return web.json_response({"success": self.in_flight == 0})

    async def _update_weights_from_disk(self, request: web.Request) -> web.StreamResponse:
        body = orjson.loads(await request.read())
        self._note(request, body)
        if self.refuse_reload and body["model_path"] != self.base_path:
            message = f"Failed to load {body['model_path']}: shape mismatch"
            return web.json_response({"success": False, "message": message}, status=400)
        self._reload(body["model_path"])
        return web.json_response({"success": True, "message": "Succeeded to update model weights."})

    def _reload(self, path: str) -> None:
        self.in_flight_at_reload.append(self.in_flight)
        self.reloaded.append(path)
        self.weights = path
        self._learn_weights(_RELOADED, Path(path))  # the model's name answers as these

    async def _chat_completions(self, request: web.Request) -> web.StreamResponse:
        if self.reloads is None:
            return await self._chat_answer(request)
        self.in_flight += 1
        try:
            return await self._chat_answer(request)
        finally:
            self.in_flight -= 1

    async def _chat_answer(self, request: web.Request) -> web.StreamResponse:  # noqa: C901
        body = orjson.loads(await request.read())
        self._note(request, body)
        if denied := self._denied(request, anthropic=False):
            return denied
        if unknown := self._unknown_model(body, anthropic=False):
            return unknown
        if (probed := self._probe_answer(body)) is not None:
            return probed
        messages = body.get("messages") or []
        last = messages[-1] if messages else {}
        text = _openai_text(last.get("content"))
        behavior = self._behavior(request, text)
        if behavior is not None and (failed := await self._fail(request, behavior, text, False)):
            return failed
        self._serial += 1
        calls: list[dict[str, str]] = []
        if last.get("role") == "tool":
            reply = f"tool said: {text}"
        elif body.get("tools") and "weather" in text.lower():
            function = body["tools"][0].get("function") or {}
            reply, calls = "", _weather_calls(function.get("name", ""), text)
        elif behavior == "huge-answer":
            reply = self._huge_reply()
        elif self.reloads is not None:
            reply = f"echo[{self.weights.rstrip('/').rsplit('/', 1)[-1]}]: {text}"
        else:
            reply = f"echo: {text}"
        call = calls[0] if calls else None
        prompt = sum(_openai_words(m.get("content")) for m in messages)
        if body.get("stream"):
            return await self._openai_stream(request, body, reply, calls, prompt, behavior)
        completion = len(self._words(reply)) + sum(len(c["arguments"].split()) for c in calls)
        message: dict[str, Any] = {"role": "assistant", "content": reply}
        if call is not None:
            message = {
                "role": "assistant",
                "content": None,
                "tool_calls": [self._openai_call(c) for c in calls],
            }
        response = {
            "id": f"chatcmpl-fake{self._serial}",
            "object": "chat.completion",
            "created": CREATED,
            "model": body.get("model") or self.models[0],
            "choices": [
                {
                    "index": 0,
                    "message": message,
                    "finish_reason": "tool_calls" if call else "stop",
                    "logprobs": (
                        token_logprobs(reply, int(body.get("top_logprobs") or 0))
                        if body.get("logprobs")
                        else None
                    ),
                }
            ],
            "usage": self._chat_usage(prompt, completion),
        }
        if behavior in _TRICKLED:
            return await self._trickle_json(request, orjson.dumps(response), behavior)
        if behavior == "malformed-sse":
            return _sse_instead_of_json(response)
        return web.Response(body=orjson.dumps(response), content_type=_JSON)

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        """A legacy text completion: ``echo: <first prompt>``, streamed word by word."""
        body = orjson.loads(await request.read())
        self._note(request, body)
        if denied := self._denied(request, anthropic=False):
            return denied
        if unknown := self._unknown_model(body, anthropic=False):
            return unknown
        prompt = body.get("prompt")
        text = prompt if isinstance(prompt, str) else str((prompt or [""])[0])
        behavior = self._behavior(request, text)
        if behavior is not None and (failed := await self._fail(request, behavior, text, False)):
            return failed
        self._serial += 1
        reply = (text if body.get("echo") else "") + f"echo: {text}"
        answer = text_completion(f"cmpl-fake{self._serial}", body, self.models[0], text, reply)
        if not body.get("stream"):
            return web.Response(body=orjson.dumps(answer), content_type=_JSON)
        with_usage = bool((body.get("stream_options") or {}).get("include_usage"))
        chunks = completion_chunks(answer, self._words(reply), with_usage)
        return await self._send_stream(request, iter(chunks), behavior, cut=2, anthropic=False)

    async def _responses(self, request: web.Request) -> web.StreamResponse:
        """The Responses API itself (``tests.fakes.responses_api``); a
        ``previous_response_id`` is a 400: this server keeps no responses."""
        body = orjson.loads(await request.read())
        self._note(request, body)
        if denied := self._denied(request, anthropic=False):
            return denied
        if body.get("previous_response_id"):
            return _error(400, "fake upstream stores no responses", "invalid_request_error", False)
        self._serial += 1
        answer = responses_answer(body, self._serial, self.models[0])
        if not body.get("stream"):
            return web.Response(body=orjson.dumps(answer), content_type=_JSON)
        text = item_text(last_input(body))
        events = responses_events(answer, fail_mid_stream="error-mid-stream" in text)
        return await self._send_stream(request, iter(events), None, cut=0, anthropic=False)

    async def _embeddings(self, request: web.Request) -> web.StreamResponse:
        """Embeddings: one vector per input, derived from its text, as floats or base64."""
        body = orjson.loads(await request.read())
        self._note(request, body)
        if denied := self._denied(request, anthropic=False):
            return denied
        if unknown := self._unknown_model(body, anthropic=False):
            return unknown
        inputs = body.get("input")
        texts = [inputs] if isinstance(inputs, str) else [str(item) for item in inputs or ()]
        if inputs and not isinstance(inputs, str) and isinstance(inputs[0], int):
            texts = [str(inputs)]  # one input of token ids
        behavior = self._behavior(request, " ".join(texts))
        if behavior is not None and (failed := await self._fail(request, behavior, "", False)):
            return failed
        size = body.get("dimensions") or self.embedding_dimensions
        answer = embeddings_list(body, self.models[0], texts, size)
        return web.Response(body=orjson.dumps(answer), content_type=_JSON)

    async def _tokenize(self, request: web.Request) -> web.StreamResponse:
        """vLLM's ``/tokenize`` (at the root) for a chat: one "token" per word."""
        body = orjson.loads(await request.read())
        self._note(request, body)
        if denied := self._denied(request, anthropic=False):
            return denied
        words = sum(_openai_words(m.get("content")) for m in body.get("messages") or [])
        return web.json_response(
            {"count": words, "max_model_len": 4096, "tokens": list(range(words))}
        )

    async def _count_tokens(self, request: web.Request) -> web.StreamResponse:
        """Anthropic's ``/v1/messages/count_tokens``: the words of the messages and
        system prompt, as usage counts them."""
        body = orjson.loads(await request.read())
        self._note(request, body)
        if denied := self._denied(request, anthropic=True):
            return denied
        system = body.get("system")
        words = sum(_anthropic_words(m.get("content")) for m in body.get("messages") or [])
        words += _anthropic_words(system) if system else 0
        return web.json_response({"input_tokens": words})

    async def _messages(self, request: web.Request) -> web.StreamResponse:  # noqa: C901
        body = orjson.loads(await request.read())
        self._note(request, body)
        if denied := self._denied(request, anthropic=True):
            return denied
        if unknown := self._unknown_model(body, anthropic=True):
            return unknown
        messages = body.get("messages") or []
        last = messages[-1] if messages else {}
        result = _tool_result_text(last.get("content"))
        text = result if result is not None else _anthropic_text(last.get("content"))
        behavior = self._behavior(request, text)
        if behavior is not None and (failed := await self._fail(request, behavior, text, True)):
            return failed
        self._serial += 1
        tools: list[dict[str, Any]] = []
        if result is not None:
            reply = f"tool said: {result}"
        elif body.get("tools") and "weather" in text.lower():
            reply = ""
            for call in _weather_calls(body["tools"][0].get("name", ""), text):
                serial = f"{self._serial}" + (f"_{call['id']}" if call["id"] else "")
                tool_use = {"type": "tool_use", "id": f"toolu_fake{serial}", "name": call["name"]}
                tools.append({**tool_use, "input": orjson.loads(call["arguments"])})
        elif behavior == "huge-answer":
            reply = self._huge_reply()
        else:
            reply = f"echo: {text}"
        system = body.get("system")
        prompt = sum(_anthropic_words(m.get("content")) for m in messages)
        prompt += _anthropic_words(system) if system else 0
        completion = len(self._words(reply)) + 2 * len(tools)
        message = {
            "id": f"msg_fake{self._serial}",
            "type": "message",
            "role": "assistant",
            "model": body.get("model") or self.models[0],
            "content": tools or [{"type": "text", "text": reply}],
            "stop_reason": "tool_use" if tools else "end_turn",
            "stop_sequence": None,
            "usage": self._anthropic_usage(prompt, completion),
        }
        if body.get("stream"):
            return await self._anthropic_stream(request, message, behavior)
        if behavior in _TRICKLED:
            return await self._trickle_json(request, orjson.dumps(message), behavior)
        if behavior == "malformed-sse":
            return _sse_instead_of_json(message)
        return web.Response(body=orjson.dumps(message), content_type=_JSON)

    def _chat_usage(self, prompt: int, completion: int) -> dict[str, Any]:
        """A chat answer's usage; ``cached_prompt_tokens`` of the prompt from a cache."""
        usage: dict[str, Any] = {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
        }
        if self.cached_prompt_tokens:
            cached = min(self.cached_prompt_tokens, prompt)
            usage["prompt_tokens_details"] = {"cached_tokens": cached}
        return usage

    def _anthropic_usage(self, prompt: int, completion: int) -> dict[str, Any]:
        """A message's usage: cache reads apart from ``input_tokens``, as Anthropic's."""
        if not self.cached_prompt_tokens:
            return {"input_tokens": prompt, "output_tokens": completion}
        cached = min(self.cached_prompt_tokens, prompt)
        return {
            "input_tokens": prompt - cached,
            "cache_read_input_tokens": cached,
            "output_tokens": completion,
        }

    # -- streams -------------------------------------------------------------------

    async def _openai_stream(
        self,
        request: web.Request,
        body: dict[str, Any],
        reply: str,
        calls: list[dict[str, str]],
        prompt: int,
        behavior: str | None,
    ) -> web.StreamResponse:
        base = {
            "id": f"chatcmpl-fake{self._serial}",
            "object": "chat.completion.chunk",
            "created": CREATED,
            "model": body.get("model") or self.models[0],
        }
        with_usage = bool((body.get("stream_options") or {}).get("include_usage"))

        def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
            data: dict[str, Any] = {
                **base,
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
            }
            if with_usage:
                data["usage"] = None
            return b"data: " + orjson.dumps(data) + b"\n\n"

        def pieces() -> Iterator[bytes]:
            yield chunk({"role": "assistant", "content": ""})
            if behavior == "slow-stream":
                for _ in range(self.slow_chunks):
                    yield chunk({"content": "tick "})
            for index, call in enumerate(calls):
                first = {"index": index, **self._openai_call({**call, "arguments": ""})}
                yield chunk({"tool_calls": [first]})
                middle = len(call["arguments"]) // 2  # arguments arrive in two pieces
                for part in (call["arguments"][:middle], call["arguments"][middle:]):
                    delta = {"index": index, "function": {"arguments": part}}
                    yield chunk({"tool_calls": [delta]})
            for word in self._words(reply):
                yield chunk({"content": word})
            yield chunk({}, "tool_calls" if calls else "stop")
            if with_usage:
                completion = len(self._words(reply)) + 2 * len(calls)
                usage = self._chat_usage(prompt, completion)
                yield b"data: " + orjson.dumps({**base, "choices": [], "usage": usage}) + b"\n\n"
            yield b"data: [DONE]\n\n"

        # role, "echo: ", the text: the whole answer but its end
        return await self._send_stream(request, pieces(), behavior, cut=3, anthropic=False)

    async def _anthropic_stream(
        self, request: web.Request, message: dict[str, Any], behavior: str | None
    ) -> web.StreamResponse:
        def event(name: str, data: dict[str, Any]) -> bytes:
            return b"event: " + name.encode() + b"\ndata: " + orjson.dumps(data) + b"\n\n"

        def pieces() -> Iterator[bytes]:
            start = {
                **message,
                "content": [],
                "stop_reason": None,
                "usage": {**message["usage"], "output_tokens": 1},
            }
            yield event("message_start", {"type": "message_start", "message": start})
            yield event("ping", {"type": "ping"})
            for index, block in enumerate(message["content"]):
                if block["type"] == "tool_use":
                    opening = {**block, "input": {}}
                else:
                    opening = {"type": "text", "text": ""}
                yield event(
                    "content_block_start",
                    {"type": "content_block_start", "index": index, "content_block": opening},
                )
                if block["type"] == "tool_use":
                    arguments = orjson.dumps(block["input"]).decode()
                    middle = len(arguments) // 2  # the input arrives in two pieces
                    deltas = [
                        {"type": "input_json_delta", "partial_json": part}
                        for part in (arguments[:middle], arguments[middle:])
                    ]
                else:
                    words = self._words(block["text"])
                    if behavior == "slow-stream":
                        words = ["tick "] * self.slow_chunks + words
                    deltas = [{"type": "text_delta", "text": word} for word in words]
                for delta in deltas:
                    yield event(
                        "content_block_delta",
                        {"type": "content_block_delta", "index": index, "delta": delta},
                    )
                yield event("content_block_stop", {"type": "content_block_stop", "index": index})
            yield event(
                "message_delta",
                {
                    "type": "message_delta",
                    "delta": {"stop_reason": message["stop_reason"], "stop_sequence": None},
                    "usage": {"output_tokens": message["usage"]["output_tokens"]},
                },
            )
            yield event("message_stop", {"type": "message_stop"})

        # message_start, ping, content_block_start, "echo: ", the text: all but the end
        return await self._send_stream(request, pieces(), behavior, cut=5, anthropic=True)

    async def _send_stream(
        self,
        request: web.Request,
        pieces: Iterator[bytes],
        behavior: str | None,
        *,
        cut: int,
        anthropic: bool,
    ) -> web.StreamResponse:
        """Send ``pieces``; the stream-end behaviours act once ``cut`` pieces are sent."""
        response = web.StreamResponse(headers=_SSE_HEADERS)
        try:
            await response.prepare(request)
            for sent, piece in enumerate(pieces):
                if behavior == "drop-mid-stream" and sent == 2:
                    _drop(request)
                    return response
                ends = sent == cut and behavior in _STREAM_ENDS
                if ends and await self._end_stream(request, response, behavior, anthropic):
                    return response
                if behavior == "slow-stream" and sent:
                    await asyncio.sleep(self.slow_interval)
                if behavior == "malformed-sse":
                    piece = _unframed(piece)
                await response.write(piece)
            await response.write_eof()
        except ConnectionError:
            self.cancelled_streams += 1
            return response
        except asyncio.CancelledError:
            self.cancelled_streams += 1
            raise
        if behavior == "slow-stream":
            self.completed_streams += 1
        return response

    async def _end_stream(
        self, request: web.Request, response: web.StreamResponse, behavior: str, anthropic: bool
    ) -> bool:
        """Act out a stream-end behaviour; whether the stream is over."""
        if behavior == "malformed-stream":
            name = b"event: content_block_delta\n" if anthropic else b""
            await response.write(name + b'data: {"choices": [{"delta": \n\n')
            return False
        if behavior == "error-mid-stream":
            message = "fake upstream overloaded mid-stream (error-mid-stream)"
            if anthropic:
                error = {"type": "error", "error": {"type": "overloaded_error", "message": message}}
                await response.write(b"event: error\ndata: " + orjson.dumps(error) + b"\n\n")
            else:
                error = {"error": {"message": message, "type": "server_error", "code": 503}}
                await response.write(b"data: " + orjson.dumps(error) + b"\n\ndata: [DONE]\n\n")
        elif behavior == "stall-stream":
            await self._hang(request)
            return True
        await response.write_eof()
        return True

    def _huge_reply(self) -> str:
        # Made once: building 100 MB per request would delay the headers past a short
        # read timeout on a loaded machine.
        if self._huge is None:
            word = "x" * (64 * 1024 - 1) + " "
            count = self.huge_bytes // len(word)
            self._huge = (word * count, [word] * count)
        return self._huge[0]

    def _words(self, text: str) -> list[str]:
        """``text`` in the pieces a stream sends (each word with its trailing space)."""
        if self._huge is not None and text is self._huge[0]:
            return self._huge[1]
        return _WORD_PIECES.findall(text)

    async def _trickle_json(
        self, request: web.Request, payload: bytes, behavior: str
    ) -> web.StreamResponse:
        """A non-streaming body sent slowly (JSON may start with whitespace), cut off,
        or stalled half-way."""
        response = web.StreamResponse(headers={"Content-Type": _JSON})
        response.content_length = len(payload) + (
            self.slow_chunks if behavior == "slow-stream" else 0
        )
        await response.prepare(request)
        if behavior == "drop-mid-stream":
            await response.write(payload[: len(payload) // 2])
            _drop(request)
            return response
        if behavior == "stall-body":
            await response.write(payload[: len(payload) // 2])
            await self._hang(request)
            return response
        try:
            for _ in range(self.slow_chunks):
                await response.write(b" ")
                await asyncio.sleep(self.slow_interval)
            await response.write(payload)
            await response.write_eof()
        except ConnectionError:
            self.cancelled_streams += 1
            return response
        except asyncio.CancelledError:
            self.cancelled_streams += 1
            raise
        self.completed_streams += 1
        return response

    # -- failures ------------------------------------------------------------------

    def _behavior(self, request: web.Request, text: str) -> str | None:
        header = request.headers.get("x-fake-behavior")
        if header:
            return header
        if "-" not in text and "hang" not in text:  # the benchmark's path stays cheap
            return None
        for token in text.split():
            if token in BEHAVIORS:
                return token
        return None

    async def _fail(  # noqa: C901
        self, request: web.Request, behavior: str, text: str, anthropic: bool
    ) -> web.StreamResponse | None:
        """The failure response for ``behavior``, or ``None`` to answer normally."""
        if behavior == "fail-500":
            return _error(500, "fake upstream failure (fail-500)", "api_error", anthropic)
        if behavior == "fail-501":
            return _error(501, "fake upstream: not implemented (fail-501)", "api_error", anthropic)
        if behavior == "fail-502":
            return _error(502, "fake upstream bad gateway (fail-502)", "api_error", anthropic)
        if behavior == "reset-before-headers":
            _drop(request)
            return web.Response(status=500)  # never reaches the client
        if behavior == "malformed-json":
            return web.Response(body=b'{"id": "chatcmpl-cut", "choices": [', content_type=_JSON)
        if behavior == "wrong-content-type":
            page = b"<html><body><h1>Welcome to nginx!</h1></body></html>"
            return web.Response(body=page, content_type="text/html")
        if behavior == "bad-request":
            return _error(
                400,
                "fake upstream rejected the request (bad-request)",
                "invalid_request_error",
                anthropic,
            )
        if behavior in ("fail-500-once", "fail-429-once", "fail-503-once"):
            key = (behavior, request.headers.get("x-fake-request-id") or text)
            if key in self._seen:
                return None
            self._seen.add(key)
            if behavior == "fail-500-once":
                return _error(500, "fake upstream failure (fail-500-once)", "api_error", anthropic)
            if behavior == "fail-503-once":
                kind = "overloaded_error" if anthropic else "service_unavailable"
                busy = _error(503, "fake upstream is busy (fail-503-once)", kind, anthropic)
                busy.headers["Retry-After"] = "1"
                return busy
            failed = _error(
                429, "fake upstream is rate limited (fail-429-once)", "rate_limit_error", anthropic
            )
            failed.headers["Retry-After"] = "0"
            return failed
        if behavior == "hang":
            await self._hang(request)
            return web.Response(status=504)  # only reached once the client has gone
        if behavior == "hold-answer":
            await self._hold()
            return None
        return None

    def _unknown_model(self, body: Any, anthropic: bool) -> web.Response | None:
        model = body.get("model")
        if not self.strict_models or model in self.models or model in self.adapters:
            return None
        kind = "not_found_error" if anthropic else "NotFoundError"
        return _error(404, f"The model `{model}` does not exist.", kind, anthropic)

    async def _hold(self) -> None:
        assert self._release is not None and self._stopping is not None
        self.held += 1
        waits = [asyncio.ensure_future(e.wait()) for e in (self._release, self._stopping)]
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            self.held -= 1
            for wait in waits:
                wait.cancel()

    async def _hang(self, request: web.Request) -> None:
        assert self._stopping is not None
        while not self._stopping.is_set():
            transport = request.transport
            if transport is None or transport.is_closing():
                return
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), 0.05)

    def _note(self, request: web.Request, body: Any) -> None:
        self.requests[request.path] += 1
        self.last_request_path = request.path
        self.last_request_body = body
        self.last_request_headers = request.headers
        transport = request.transport
        if transport is not None:
            self.peers.add(transport.get_extra_info("peername"))

    def _denied(self, request: web.Request, anthropic: bool) -> web.Response | None:
        if self.api_key is None:
            return None
        headers = request.headers
        if headers.get("x-api-key") == self.api_key:
            return None
        if headers.get("authorization") == f"Bearer {self.api_key}":
            return None
        return _error(401, "fake upstream: invalid api key", "authentication_error", anthropic)

    @staticmethod
    def _openai_call(call: dict[str, str]) -> dict[str, Any]:
        return {
            "id": "call_fake" + (f"_{call['id']}" if call["id"] else ""),
            "type": "function",
            "function": {"name": call["name"], "arguments": call["arguments"]},
        }


class FakeUpstreamThread:
    """A ``FakeUpstream`` running in its own event loop on a background thread, for
    tests whose client is synchronous::

        with FakeUpstreamThread() as fake:
            OpenAI(base_url=fake.base_url, api_key="x").chat.completions.create(...)
            assert fake.requests_received("/v1/chat/completions") == 1
    """

    def __init__(self, **options: Any) -> None:
        self.server = FakeUpstream(**options)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)

    @property
    def base_url(self) -> str:
        """``http://127.0.0.1:port/v1``."""
        return self.server.base_url

    # The server's counters, read across threads (plain reads of ints and references).

    @property
    def requests(self) -> Counter[str]:
        """Requests received per path."""
        return self.server.requests

    def requests_received(self, path: str) -> int:
        """How many requests (attempts) arrived for ``path``."""
        return self.server.requests_received(path)

    @property
    def last_request_path(self) -> str | None:
        """Path of the last request."""
        return self.server.last_request_path

    @property
    def last_request_body(self) -> Any:
        """Parsed JSON body of the last request (``None`` for a GET)."""
        return self.server.last_request_body

    @property
    def last_request_headers(self) -> Mapping[str, str]:
        """Headers of the last request (case-insensitive)."""
        return self.server.last_request_headers

    @property
    def held(self) -> int:
        """Requests waiting (``hold-answer``) for ``release_held()``."""
        return self.server.held

    @property
    def adapters(self) -> set[str]:
        """Adapters loaded (``adapters=True`` only)."""
        return self.server.adapters

    def release_held(self) -> None:
        """Let every ``hold-answer`` request answer, now and until ``reset()``."""
        self._loop.call_soon_threadsafe(self.server.release_held)

    @property
    def cancelled_streams(self) -> int:
        """Streams whose client left before the end."""
        return self.server.cancelled_streams

    @property
    def completed_streams(self) -> int:
        """Slow streams sent to the end."""
        return self.server.completed_streams

    def reset(self) -> None:
        """Forget counters and seen requests (done in the server's loop, then returns)."""

        async def reset() -> None:
            self.server.reset()

        asyncio.run_coroutine_threadsafe(reset(), self._loop).result(timeout=10)

    def __enter__(self) -> FakeUpstreamThread:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self.server.start(), self._loop).result(timeout=10)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        asyncio.run_coroutine_threadsafe(self.server.stop(), self._loop).result(timeout=10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        self._loop.close()


# -- reading requests ------------------------------------------------------------------


def _weather_calls(name: str, text: str) -> list[dict[str, str]]:
    """The weather tool calls asked for: Paris, and Rome too when "parallel" is in the
    text (``id`` tells parallel calls apart; empty for a lone call)."""
    if "parallel" not in text.lower():
        return [{"id": "", "name": name, "arguments": '{"city": "Paris"}'}]
    return [
        {"id": str(index), "name": name, "arguments": orjson.dumps({"city": city}).decode()}
        for index, city in enumerate(("Paris", "Rome"))
    ]


def _openai_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(p.get("text", "") for p in content if p.get("type") == "text")
    return ""


def _openai_words(content: Any) -> int:
    return len(_openai_text(content).split())


def _anthropic_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(b.get("text", "") for b in content if b.get("type") == "text")
    return ""


def _anthropic_words(content: Any) -> int:
    if isinstance(content, list):
        return sum(
            len((_tool_result_text([b]) or "").split())
            if b.get("type") == "tool_result"
            else len(b.get("text", "").split())
            for b in content
        )
    return len(_anthropic_text(content).split())


def _tool_result_text(content: Any) -> str | None:
    """The text of the first tool_result block, or ``None`` when there is none."""
    if not isinstance(content, list):
        return None
    for block in content:
        if block.get("type") == "tool_result":
            inner = block.get("content")
            if isinstance(inner, str):
                return inner
            return " ".join(b.get("text", "") for b in inner or () if b.get("type") == "text")
    return None


# -- writing responses -----------------------------------------------------------------


def _error(status: int, message: str, kind: str, anthropic: bool) -> web.Response:
    if anthropic:
        body = {"type": "error", "error": {"type": kind, "message": message}}
    else:
        body = {"error": {"message": message, "type": kind, "param": None, "code": None}}
    return web.Response(status=status, body=orjson.dumps(body), content_type=_JSON)


def text_completion(
    serial: str, body: dict[str, Any], default_model: str, prompt: str, reply: str
) -> dict[str, Any]:
    """A ``text_completion`` answering ``prompt`` with ``reply`` (usage counts words)."""
    completion = len(reply.split())
    return {
        "id": serial,
        "object": "text_completion",
        "created": CREATED,
        "model": body.get("model") or default_model,
        "choices": [{"index": 0, "text": reply, "logprobs": None, "finish_reason": "stop"}],
        "usage": {
            "prompt_tokens": len(prompt.split()),
            "completion_tokens": completion,
            "total_tokens": len(prompt.split()) + completion,
        },
    }


def completion_chunks(answer: dict[str, Any], words: list[str], with_usage: bool) -> list[bytes]:
    """``answer`` (a text_completion) as its stream: a chunk per word, the finish, the
    usage when asked for, ``[DONE]``."""
    base = {key: answer[key] for key in ("id", "object", "created", "model")}

    def chunk(text: str, finish: str | None) -> bytes:
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
        return b"data: " + orjson.dumps({**base, "choices": [choice]}) + b"\n\n"

    out = [chunk(word, None) for word in words] + [chunk("", "stop")]
    if with_usage:
        out.append(b"data: " + orjson.dumps({**base, "choices": [], "usage": answer["usage"]}))
        out[-1] += b"\n\n"
    return [*out, b"data: [DONE]\n\n"]


def embedding_vector(text: str, size: int) -> list[float]:
    """A deterministic unit-free vector of ``size`` floats from ``text``'s digest."""
    digest = hashlib.sha256(text.encode()).digest()
    return [round(digest[i % len(digest)] / 255.0, 4) for i in range(size)]


def embeddings_list(
    body: dict[str, Any], default_model: str, texts: list[str], size: int
) -> dict[str, Any]:
    """An embeddings ``list``: one vector per text, base64 when the body asks for it."""
    data: list[dict[str, Any]] = []
    for index, text in enumerate(texts):
        vector: Any = embedding_vector(text, size)
        if body.get("encoding_format") == "base64":
            vector = base64.b64encode(struct.pack(f"<{size}f", *vector)).decode()
        data.append({"object": "embedding", "index": index, "embedding": vector})
    tokens = sum(len(text.split()) for text in texts)
    return {
        "object": "list",
        "data": data,
        "model": body.get("model") or default_model,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }


def _sse_instead_of_json(answer: dict[str, Any]) -> web.Response:
    """A whole answer as one event: a server that streams whatever the request says."""
    body = b"data: " + orjson.dumps(answer) + b"\n\ndata: [DONE]\n\n"
    return web.Response(body=body, headers=_SSE_HEADERS)


def _unframed(piece: bytes) -> bytes:
    """An SSE event's data as a bare line, as an NDJSON server would send it."""
    lines = piece.split(b"\n")
    return b"".join(line[len(b"data: ") :] + b"\n" for line in lines if line.startswith(b"data: "))


def _drop(request: web.Request) -> None:
    transport = request.transport
    if transport is not None:
        transport.close()


def _models_list(models: tuple[str, ...]) -> dict[str, Any]:
    # One shape both SDKs accept: OpenAI's list plus Anthropic's paging fields.
    data = [
        {
            "id": name,
            "object": "model",
            "type": "model",
            "created": CREATED,
            "created_at": "2023-11-14T22:13:20Z",
            "owned_by": "fake",
            "display_name": name,
        }
        for name in models
    ]
    return {
        "object": "list",
        "data": data,
        "has_more": False,
        "first_id": models[0] if models else None,
        "last_id": models[-1] if models else None,
    }


async def _serve(host: str, port: int, **options: Any) -> None:
    fake = FakeUpstream(**options)
    await fake.start(host, port)
    print(f"fake upstream listening on {fake.base_url}", flush=True)
    try:
        await asyncio.Event().wait()
    finally:
        await fake.stop()


def main() -> None:
    """``python -m tests.fakes.upstream --port N [--model M] [--vllm-lora]``: serve until
    interrupted."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8001)
    parser.add_argument("--model", default="fake-model", help="the one model it serves")
    parser.add_argument(
        "--vllm-lora",
        action="store_true",
        help="vLLM's runtime LoRA API: load and unload adapters, list them in /v1/models, "
        "answer 404 for a model that is neither the model nor a loaded adapter",
    )
    parser.add_argument(
        "--reloads", choices=["vllm", "sglang"], help="reload weights in place as this server"
    )
    args = parser.parse_args()
    options: dict[str, Any] = {"models": (args.model,), "reloads": args.reloads}
    if args.vllm_lora:
        options.update(adapters=True, lists_adapters=True, strict_models=True)
    runner: Any = asyncio.run
    try:
        import uvloop

        runner = uvloop.run
    except ImportError:
        pass
    with contextlib.suppress(KeyboardInterrupt):
        runner(_serve(args.host, args.port, **options))


if __name__ == "__main__":
    main()
