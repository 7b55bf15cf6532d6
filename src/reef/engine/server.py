"""The HTTP face of the engine (aiohttp): OpenAI chat and text completions, vLLM's
adapter API.

Routes: ``POST /v1/chat/completions``, ``POST /v1/completions`` (``completions``),
``POST /v1/embeddings`` (a 501: no embedding model here), ``GET /v1/models``, ``POST
/v1/load_lora_adapter``, ``POST /v1/unload_lora_adapter``, ``POST
/v1/load_checkpoint`` and ``POST /v1/unload_checkpoint`` (Reef's: full-weight
checkpoints served by name, ``runtime``), ``POST /tokenize`` (vLLM's, at the root as
vLLM has it), ``GET /health``. A checkpoint that would not fit in memory is refused
with a 507 (Insufficient Storage), code ``insufficient_memory``. Errors are
OpenAI-shaped. A client that disconnects cancels its generation (aiohttp's handler
cancellation is on, and a failed stream write cancels too).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import socket
import threading
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import replace
from pathlib import Path
from typing import Any, TypeVar

import orjson
import torch
from aiohttp import web
from pydantic import BaseModel, ValidationError

from reef.core.chat_format import ToolCallStream, tool_names
from reef.core.errors import ConflictError, InvalidInputError, NotFoundError, ReefError
from reef.engine.bodies import (
    ADAPTER_DIGEST_HEADER,
    ChoiceAccumulator,
    ResponseShape,
    ToolParsing,
    error_body,
    usage,
)
from reef.engine.choice import OPENVINO_PRECISIONS, Candidate, resolve_backend
from reef.engine.completions import complete_text
from reef.engine.errors import (
    ADAPTER_ALREADY_LOADED,
    INSUFFICIENT_MEMORY,
    AdapterConflictError,
    InsufficientMemoryError,
    ModelSourceError,
)
from reef.engine.models import LoadedModel, load_model
from reef.engine.precision import apply_precision, can_fp16, load_dtype
from reef.engine.process import EngineDtype, EngineOptions, resolve_dtype
from reef.engine.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    LoadCheckpointRequest,
    LoadLoraAdapterRequest,
    TokenizeRequest,
    UnloadCheckpointRequest,
    UnloadLoraAdapterRequest,
)
from reef.engine.runtime import Engine, GenerationStream

logger = logging.getLogger("reef.engine")

ENGINE_KEY = web.AppKey("engine", Engine)
MAX_BODY_BYTES = 16 * 1024 * 1024
Body = TypeVar("Body", bound=BaseModel)
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _json(body: Any, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(
        body=orjson.dumps(body), status=status, content_type="application/json", headers=headers
    )


def _error(status: int, message: str, code: str | None = None) -> web.Response:
    return _json(error_body(status, message, code), status)


@web.middleware
async def _errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except NotFoundError as exc:
        return _error(404, exc.message, "model_not_found")
    except AdapterConflictError as exc:  # 400 as vLLM answers, with a code to tell it by
        return _error(400, exc.message, ADAPTER_ALREADY_LOADED)
    except (InvalidInputError, ConflictError) as exc:
        return _error(400, exc.message)
    except InsufficientMemoryError as exc:
        return _error(507, exc.message, INSUFFICIENT_MEMORY)
    except ReefError as exc:
        logger.error("engine error: %s", exc.message)
        return _error(503, exc.message)
    except web.HTTPException as exc:
        return _error(exc.status, exc.reason)
    except (asyncio.CancelledError, ConnectionError):
        raise
    except Exception:
        logger.exception("unhandled error on %s %s", request.method, request.path)
        return _error(500, "internal error")


async def _parse(request: web.Request, model: type[Body]) -> Body:
    try:
        raw = await request.read()
        return model.model_validate(orjson.loads(raw))
    except orjson.JSONDecodeError as exc:
        raise InvalidInputError(f"body is not valid JSON: {exc}") from exc
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or 'body'}: {e['msg']}" for e in exc.errors()
        )
        raise InvalidInputError(problems) from exc


async def health(request: web.Request) -> web.Response:
    """``GET /health``: 200 once the model is loaded (it is before the port opens), with
    the weights' dtype, the backend (eager, openvino), the worker's threads, its load
    (rows decoding, jobs waiting, the largest batch so far) and the prompt-prefix
    cache's figures."""
    engine = request.app[ENGINE_KEY]
    return _json(
        {
            "status": "ok",
            "model": engine.name,
            "dtype": engine.precision,
            "backend": engine.backend,
            "threads": engine.scheduler.threads,
            **engine.scheduler.stats(),
            "prefix_cache": engine.scheduler.prefix_stats(),
        }
    )


async def list_models(request: web.Request) -> web.Response:
    """``GET /v1/models``: the base model, then every loaded adapter (vLLM's cards)."""
    engine = request.app[ENGINE_KEY]
    cards = [
        {
            "id": engine.name,
            "object": "model",
            "created": engine.created,
            "owned_by": "reef",
            "root": engine.name,
            "parent": None,
            "max_model_len": engine.loaded.max_context,
        }
    ]
    for version in [*engine.adapters.listed(), *engine.checkpoints.listed()]:
        cards.append(
            {
                "id": version.name,
                "object": "model",
                "created": version.created,
                "owned_by": "reef",
                "root": str(version.path),
                "parent": version.base.version.name if version.base else engine.name,
                "max_model_len": engine.loaded.max_context,
                "digest": version.digest,
                "kind": version.kind,
            }
        )
    return _json({"object": "list", "data": cards})


async def load_lora_adapter(request: web.Request) -> web.Response:
    """``POST /v1/load_lora_adapter``: 200 with vLLM's success text, 400 when refused,
    404 when ``base_model_name`` names no loaded checkpoint."""
    body = await _parse(request, LoadLoraAdapterRequest)
    engine = request.app[ENGINE_KEY]
    await engine.load_adapter(
        body.lora_name,
        Path(body.lora_path),
        body.expected_digest,
        body.load_inplace,
        body.base_model_name,
    )
    return web.Response(text=f"Success: LoRA adapter '{body.lora_name}' added successfully.")


async def unload_lora_adapter(request: web.Request) -> web.Response:
    """``POST /v1/unload_lora_adapter``: 200, or 404 for an unknown name."""
    body = await _parse(request, UnloadLoraAdapterRequest)
    request.app[ENGINE_KEY].unload_adapter(body.lora_name)
    return web.Response(text=f"Success: LoRA adapter '{body.lora_name}' removed successfully.")


async def load_checkpoint(request: web.Request) -> web.Response:
    """``POST /v1/load_checkpoint``: 200 once the checkpoint serves under its name; 400
    when refused (pickle, truncated shard, digest mismatch, name taken), 507 when it
    would not fit in memory."""
    body = await _parse(request, LoadCheckpointRequest)
    engine = request.app[ENGINE_KEY]
    version = await engine.load_checkpoint(
        body.name, Path(body.path), body.expected_digest, body.replace
    )
    return _json({"name": version.name, "digest": version.digest})


async def unload_checkpoint(request: web.Request) -> web.Response:
    """``POST /v1/unload_checkpoint``: 200, or 404 for an unknown name."""
    body = await _parse(request, UnloadCheckpointRequest)
    request.app[ENGINE_KEY].unload_checkpoint(body.name)
    return _json({"name": body.name, "unloaded": True})


async def tokenize(request: web.Request) -> web.Response:
    """``POST /tokenize``: ``{count, max_model_len, tokens}`` for a chat conversation,
    as vLLM answers it (adapters share the base model's tokenizer)."""
    body = await _parse(request, TokenizeRequest)
    engine = request.app[ENGINE_KEY]
    messages = [m.for_template() for m in body.messages]
    tokens, _ = engine.encode_tool_chat(messages, body.tool_dicts, body.tool_choice_value)
    return _json(
        {"count": len(tokens), "max_model_len": engine.loaded.max_context, "tokens": tokens}
    )


async def chat_completions(request: web.Request) -> web.StreamResponse:
    """``POST /v1/chat/completions``, streaming (SSE) or not."""
    body = await _parse(request, ChatCompletionRequest)
    engine = request.app[ENGINE_KEY]
    choice = body.tool_choice_value
    lease = engine.lease(body.model)
    try:
        messages = [m.for_template() for m in body.messages]
        prompt, prefill = engine.encode_tool_chat(messages, body.tool_dicts, choice)
        params = engine.sampling_params(
            len(prompt),
            body.token_limit,
            temperature=body.temperature,
            top_p=body.top_p,
            seed=body.seed,
            stop=tuple(body.stop_strings),
            logprobs=body.logprobs,
            top_logprobs=body.top_logprobs or 0,
        )
        stream = engine.generate(prompt, params, body.n, lease)
    except BaseException:
        if lease is not None:
            engine.release(lease)
        raise
    tools = (
        ToolParsing(tool_names(body.tool_dicts or []), prefill, body.parallel_tool_calls)
        if body.tools and choice.calls_allowed
        else None
    )
    shape = ResponseShape.new(
        body.model, body.logprobs, body.return_token_ids, engine.token_text, tools
    )
    headers = {ADAPTER_DIGEST_HEADER: lease.version.digest} if lease else {}
    try:
        if body.stream:
            include_usage = bool(body.stream_options and body.stream_options.include_usage)
            return await _stream(request, shape, stream, prompt, body.n, include_usage, headers)
        choices = [ChoiceAccumulator() for _ in range(body.n)]
        parsers = _single_call_parsers(shape, body.n)
        async for delta in stream:
            choices[delta.index].add(delta)
            if parsers and _all_done(parsers, delta.index, delta.text):
                break  # every choice has made its one call: stop generating
        return _json(shape.completion(choices, prompt), headers=headers)
    finally:
        stream.cancel()  # no-op when it finished; stops the rows when the client left


async def text_completions(request: web.Request) -> web.StreamResponse:
    """``POST /v1/completions``: a raw continuation of one prompt (``completions``)."""
    body = await _parse(request, CompletionRequest)
    return await complete_text(request, request.app[ENGINE_KEY], body)


async def embeddings(request: web.Request) -> web.Response:
    """``POST /v1/embeddings``: 501. The engine serves a generative chat model, and a
    vector from it (mean-pooled hidden states) would pass for an embedding without being
    one."""
    engine = request.app[ENGINE_KEY]
    return _error(
        501,
        f"the embedded engine serves no embeddings: {engine.name} is a generative chat "
        "model, not an embedding model; serve embeddings from an upstream that has one "
        "(vLLM --task embed, OpenAI)",
    )


async def _stream(  # noqa: PLR0913
    request: web.Request,
    shape: ResponseShape,
    stream: GenerationStream,
    prompt: list[int],
    n: int,
    include_usage: bool,
    headers: dict[str, str],
) -> web.StreamResponse:
    response = web.StreamResponse(
        headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache", **headers}
    )
    await response.prepare(request)

    async def send(payload: dict[str, Any] | str) -> None:
        data = payload if isinstance(payload, str) else orjson.dumps(payload).decode()
        await response.write(f"data: {data}\n\n".encode())

    completion_tokens = 0
    try:
        await send(shape.role_chunk(n, prompt))
        parsers = [shape.tools.stream() for _ in range(n)] if shape.tools else None
        try:
            async for delta in stream:
                completion_tokens += len(delta.token_ids)
                if parsers is not None:
                    for chunk in shape.tool_chunks(delta, parsers[delta.index]):
                        await send(chunk)
                    if all(parser.done for parser in parsers):
                        break  # every choice has made its one call: stop generating
                elif shape.wants(delta):
                    await send(shape.delta_chunk(delta))
        except ReefError as exc:
            await send(error_body(503, exc.message))
        if include_usage:
            await send(shape.chunk([], usage=usage(len(prompt), completion_tokens)))
        await send("[DONE]")
        await response.write_eof()
    except ConnectionError:
        logger.info("client left during a stream; generation cancelled")
    return response


def _single_call_parsers(shape: ResponseShape, n: int) -> list[ToolCallStream]:
    """Parsers that watch for each choice's first call, when parallel calls are off
    (nothing after it is kept, so generation stops there); else none."""
    if shape.tools is None or shape.tools.parallel:
        return []
    return [shape.tools.stream() for _ in range(n)]


def _all_done(parsers: list[ToolCallStream], index: int, text: str) -> bool:
    if not parsers[index].done:
        parsers[index].feed(text)
    return all(parser.done for parser in parsers)


def build_app(engine: Engine) -> web.Application:
    """The aiohttp application serving ``engine``."""
    app = web.Application(middlewares=[_errors], client_max_size=MAX_BODY_BYTES)
    app[ENGINE_KEY] = engine
    app.router.add_get("/health", health)
    app.router.add_get("/v1/models", list_models)
    app.router.add_post("/v1/chat/completions", chat_completions)
    app.router.add_post("/v1/completions", text_completions)
    app.router.add_post("/v1/embeddings", embeddings)
    app.router.add_post("/v1/load_lora_adapter", load_lora_adapter)
    app.router.add_post("/v1/unload_lora_adapter", unload_lora_adapter)
    app.router.add_post("/v1/load_checkpoint", load_checkpoint)
    app.router.add_post("/v1/unload_checkpoint", unload_checkpoint)
    app.router.add_post("/tokenize", tokenize)
    return app


def _bind(host: str, port: int) -> socket.socket:
    family, kind, proto, _, address = socket.getaddrinfo(
        host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )[0]
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(address)
    sock.listen(1024)
    sock.setblocking(False)
    return sock


@contextlib.asynccontextmanager
async def serving(engine: Engine, host: str, port: int) -> AsyncIterator[int]:
    """Serve ``engine`` on ``host:port`` in the running loop; yields the bound port."""
    runner = web.AppRunner(build_app(engine), handler_cancellation=True, access_log=None)
    await runner.setup()
    sock = _bind(host, port)
    try:
        await web.SockSite(runner, sock).start()
        yield int(sock.getsockname()[1])
    finally:
        await runner.cleanup()
        sock.close()


def load_for_serving(model: str, home: Path, dtype: EngineDtype, cuda: bool) -> LoadedModel:
    """``model`` loaded and made ready for ``dtype`` (``auto``: :func:`resolve_dtype`).
    Where ``auto`` chose float16 and a weight does not fit in it, the model loads again
    in what ``auto`` would choose without float16, with a warning; a dtype asked for by
    name is served as asked or refused (``ModelSourceError`` with the reason)."""
    fp16 = dtype == "auto" and not cuda and can_fp16() is None
    precision = resolve_dtype(dtype, cuda, fp16)
    loaded = load_model(model, home, dtype=load_dtype(precision))
    try:
        apply_precision(loaded.model, precision)
    except ValueError as exc:  # float16 without fbgemm, or weights beyond its range
        if dtype != "auto":
            raise ModelSourceError(f"{model} cannot be served in {precision}: {exc}") from exc
        fallback = resolve_dtype(dtype, cuda, fp16=False)
        logger.warning(
            "%s cannot be served in %s (%s); serving it in %s", model, precision, exc, fallback
        )
        loaded = load_model(model, home, dtype=load_dtype(fallback))
        apply_precision(loaded.model, fallback)
    return loaded


def openvino_engine(model: str, home: Path, options: EngineOptions) -> Engine:
    """An engine on the OpenVINO backend (``reef.engine.openvino``): ``model`` converted
    once into OpenVINO IR in ``options.dtype`` (``auto``: float32), served by OpenVINO
    GenAI. Raises ``ModelSourceError`` when the extra is missing or conversion fails."""
    from reef.engine import openvino
    from reef.engine.models import DEFAULT_MODEL, smollm2_cache

    missing = openvino.available()
    if missing is not None:
        raise ModelSourceError(missing)
    source = smollm2_cache(home) if model == DEFAULT_MODEL else Path(model)
    if not (source / "config.json").is_file():
        raise ModelSourceError(
            f"the openvino backend serves {DEFAULT_MODEL!r} or a Hugging Face model directory, "
            f"not {model!r}"
        )
    precision = "float32" if options.dtype == "auto" else options.dtype
    directory = openvino.converted(source, home, precision)
    loaded = openvino.meta_loaded(source, model)
    worker = openvino.OpenVINOWorker(
        directory, loaded, options.max_batch, options.threads, precision
    )
    engine = Engine(loaded, max_batch=options.max_batch, worker=worker)
    engine.precision = precision  # the IR's, not the (weightless) model's
    return engine


def backend_candidates(model: str, home: Path, options: EngineOptions) -> list[Candidate]:
    """What ``--backend auto`` chooses from (``reef.engine.choice``): the eager engine at
    ``options.dtype`` (in float32: the reference engine itself), then OpenVINO at that
    dtype, or at float32, float16 and int8 when it is ``auto``."""
    from reef.engine.openvino import PRECISIONS

    def eager() -> Engine:
        loaded = load_for_serving(model, home, options.dtype, torch.cuda.is_available())
        return Engine(loaded, max_batch=options.max_batch, threads=options.threads)

    def on_openvino(dtype: str) -> Callable[[], Engine]:
        chosen = replace(options, backend="openvino", dtype=dtype)  # type: ignore[arg-type]
        return lambda: openvino_engine(model, home, chosen)

    found = [Candidate("eager", options.dtype, None if options.dtype == "float32" else eager)]
    precisions = OPENVINO_PRECISIONS if options.dtype == "auto" else (options.dtype,)
    found += [Candidate("openvino", p, on_openvino(p)) for p in precisions if p in PRECISIONS]
    return found


def run_server(
    model: str,
    host: str = "127.0.0.1",
    port: int = 8601,
    home: Path = Path(".reef"),
    ready_callback: Callable[[int], None] | None = None,
    *,
    options: EngineOptions | None = None,
) -> None:
    """Load ``model``, serve it until SIGINT/SIGTERM, then stop cleanly (blocking).

    ``ready_callback`` receives the bound port once the server accepts connections
    (useful with ``port=0``). ``options``: the batch, torch's threads (default: all
    cores but one) and the weights' dtype. Raises ``ModelSourceError`` when the model
    cannot load, or cannot run in the dtype asked for.
    """
    options = options or EngineOptions()
    if options.backend == "auto":
        chosen = options
        options = resolve_backend(
            model, home, options, lambda: backend_candidates(model, home, chosen)
        )
    if options.backend == "openvino":
        engine = openvino_engine(model, home, options)
    else:
        loaded = load_for_serving(model, home, options.dtype, torch.cuda.is_available())
        engine = Engine(
            loaded,
            max_batch=options.max_batch,
            threads=options.threads,
            prefix_cache_bytes=options.prefix_cache_mb * 2**20,
        )
    engine.start()
    try:
        asyncio.run(_serve_until_signal(engine, host, port, ready_callback))
    finally:
        engine.stop()


async def _serve_until_signal(
    engine: Engine, host: str, port: int, ready_callback: Callable[[int], None] | None
) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(signum, stop.set)
    async with serving(engine, host, port) as bound:
        logger.info("engine serving %s on http://%s:%d/v1", engine.name, host, bound)
        if ready_callback is not None:
            ready_callback(bound)
        await stop.wait()
    logger.info("engine stopped")


class BackgroundServer:
    """An engine server on its own event loop in a daemon thread (tests, benches).

    ``start`` returns once it listens; ``base_url`` is then ``http://host:port/v1``.
    """

    def __init__(self, engine: Engine, host: str = "127.0.0.1", port: int = 0) -> None:
        self.engine = engine
        self.host = host
        self.port = port
        self._loop = asyncio.new_event_loop()
        self._stop: asyncio.Event | None = None
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name="reef-engine-http", daemon=True)

    @property
    def base_url(self) -> str:
        """The OpenAI base URL of the running server."""
        return f"http://{self.host}:{self.port}/v1"

    def start(self) -> BackgroundServer:
        """Start the engine's worker and the HTTP server; wait until it listens."""
        self.engine.start()
        self._thread.start()
        if not self._ready.wait(30):
            raise RuntimeError("engine server did not start")
        return self

    def stop(self) -> None:
        """Stop the HTTP server and the engine."""
        if self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)
        self.engine.stop()

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_until_complete(self._main())
        self._loop.close()

    async def _main(self) -> None:
        self._stop = asyncio.Event()
        async with serving(self.engine, self.host, self.port) as bound:
            self.port = bound
            self._ready.set()
            await self._stop.wait()
