"""``POST /v1/completions`` on the engine: OpenAI's legacy text completion, a raw
continuation of the prompt's tokens (no chat template), streaming (SSE) or not.

The prompt is encoded as vLLM encodes a completion prompt (the tokenizer's own special
tokens added, e.g. a BOS), or taken as token ids. One prompt per request; ``n``
sequences of it, on the base model or a loaded adapter, as chat completions are.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

import orjson
from aiohttp import web

from reef.core.errors import ReefError
from reef.engine.bodies import ADAPTER_DIGEST_HEADER, error_body, usage
from reef.engine.errors import BadRequestError
from reef.engine.protocol import CompletionRequest
from reef.engine.runtime import Engine, GenerationStream
from reef.engine.sequences import ChoiceDelta


class TextCompletionShape:
    """The names and the echoed prompt of one text completion's bodies."""

    def __init__(self, model: str, echoed: str, n: int, prompt_tokens: int) -> None:
        self.id = f"cmpl-{uuid.uuid4().hex}"
        self.model = model
        self.created = int(time.time())
        self.echoed = echoed  # the prompt's text, when ``echo`` asked for it
        self.n = n
        self.prompt_tokens = prompt_tokens

    def body(self, choices: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
        """A ``text_completion`` (a whole answer, or one chunk of a stream)."""
        return {
            "id": self.id,
            "object": "text_completion",
            "created": self.created,
            "model": self.model,
            "choices": choices,
            **extra,
        }

    @staticmethod
    def choice(index: int, text: str, finish_reason: str | None) -> dict[str, Any]:
        """One choice of a body or chunk."""
        return {"index": index, "text": text, "logprobs": None, "finish_reason": finish_reason}


def encode_prompt(engine: Engine, body: CompletionRequest) -> tuple[list[int], str]:
    """The prompt's token ids and its text. Raises ``BadRequestError`` for an empty
    prompt or a token id outside the vocabulary."""
    tokenizer = engine.loaded.tokenizer
    prompt = body.text_or_ids()
    if isinstance(prompt, str):
        ids = [int(i) for i in tokenizer.encode(prompt)]
        text = prompt
    else:
        vocabulary = len(tokenizer)
        if any(not 0 <= token < vocabulary for token in prompt):
            raise BadRequestError(f"prompt token ids must be from 0 to {vocabulary - 1}")
        ids, text = prompt, str(tokenizer.decode(prompt))
    if not ids:
        raise BadRequestError("prompt is empty: send at least one token")
    return ids, text


async def complete_text(
    request: web.Request, engine: Engine, body: CompletionRequest
) -> web.StreamResponse:
    """Answer ``POST /v1/completions`` (its parsed ``body``), streaming (SSE) or not."""
    lease = engine.lease(body.model)
    try:
        prompt, text = encode_prompt(engine, body)
        params = engine.sampling_params(
            len(prompt),
            body.max_tokens,
            temperature=body.temperature,
            top_p=body.top_p,
            seed=body.seed,
            stop=tuple(body.stop or ()),
        )
        stream = engine.generate(prompt, params, body.n, lease)
    except BaseException:
        if lease is not None:
            engine.release(lease)
        raise
    shape = TextCompletionShape(body.model, text if body.echo else "", body.n, len(prompt))
    headers = {ADAPTER_DIGEST_HEADER: lease.version.digest} if lease else {}
    try:
        if body.stream:
            options = body.stream_options
            include_usage = bool(options and options.include_usage)
            return await _stream(request, shape, stream, include_usage, headers)
        texts: list[list[str]] = [[shape.echoed] for _ in range(body.n)]
        finish: list[str | None] = [None] * body.n
        generated = 0
        async for delta in stream:
            texts[delta.index].append(delta.text)
            finish[delta.index] = delta.finish_reason or finish[delta.index]
            generated += len(delta.token_ids)
        choices = [shape.choice(i, "".join(texts[i]), finish[i]) for i in range(body.n)]
        answer = shape.body(choices, usage=usage(len(prompt), generated))
        return web.Response(
            body=orjson.dumps(answer), content_type="application/json", headers=headers
        )
    finally:
        stream.cancel()  # no-op when it finished; stops the rows when the client left


async def _stream(
    request: web.Request,
    shape: TextCompletionShape,
    stream: GenerationStream,
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

    generated = 0
    try:
        if shape.echoed:
            echoed = [shape.choice(i, shape.echoed, None) for i in range(shape.n)]
            await send(shape.body(echoed))
        try:
            async for delta in stream:
                generated += len(delta.token_ids)
                if _wanted(delta):
                    piece = shape.choice(delta.index, delta.text, delta.finish_reason)
                    await send(shape.body([piece]))
        except ReefError as exc:
            await send(error_body(503, exc.message))
        if include_usage:
            await send(shape.body([], usage=usage(shape.prompt_tokens, generated)))
        await send("[DONE]")
        await response.write_eof()
    except ConnectionError:
        pass  # the client left; generation is cancelled by the caller's ``finally``
    return response


def _wanted(delta: ChoiceDelta) -> bool:
    return bool(delta.text or delta.finish_reason)
