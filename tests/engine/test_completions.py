"""Legacy text completions (``/v1/completions``) on tiny-random through the official
OpenAI SDK: a raw continuation of the prompt's tokens, no chat template; and the 501 for
embeddings."""

from __future__ import annotations

import openai
import pytest

from reef.engine.server import BackgroundServer
from tests.engine.conftest import TINY


async def greedy(
    client: openai.AsyncOpenAI, prompt: str | list[int], max_tokens: int = 8, echo: bool = False
) -> str:
    answer = await client.completions.create(
        model=TINY, prompt=prompt, max_tokens=max_tokens, temperature=0, echo=echo
    )
    return answer.choices[0].text


async def test_a_prompt_is_continued_raw_with_usage(
    client: openai.AsyncOpenAI, server: BackgroundServer
) -> None:
    answer = await client.completions.create(
        model=TINY, prompt="Once upon a time", max_tokens=6, temperature=0
    )
    tokenizer = server.engine.loaded.tokenizer
    assert answer.object == "text_completion" and answer.id.startswith("cmpl-")
    assert answer.model == TINY
    choice = answer.choices[0]
    assert choice.finish_reason in {"stop", "length"}
    assert answer.usage is not None
    # the prompt's own tokens, not a chat template around them
    assert answer.usage.prompt_tokens == len(tokenizer.encode("Once upon a time"))
    assert 0 < answer.usage.completion_tokens <= 6
    assert answer.usage.total_tokens == answer.usage.prompt_tokens + answer.usage.completion_tokens
    # greedy: the same continuation again, and for the same prompt as token ids
    assert choice.text == await greedy(client, "Once upon a time", max_tokens=6)
    ids = tokenizer.encode("Once upon a time")
    assert await greedy(client, ids) == await greedy(client, "Once upon a time")


async def test_a_stream_sends_the_same_text_and_usage_when_asked(
    client: openai.AsyncOpenAI,
) -> None:
    whole = await greedy(client, "The cat")
    stream = await client.completions.create(
        model=TINY,
        prompt="The cat",
        max_tokens=8,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = [chunk async for chunk in stream]
    assert "".join(c.choices[0].text for c in chunks if c.choices) == whole
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] in {"stop", "length"}
    usages = [c.usage for c in chunks if c.usage is not None]
    assert len(usages) == 1 and usages[0].completion_tokens > 0


async def test_echo_puts_the_prompt_before_the_continuation(client: openai.AsyncOpenAI) -> None:
    plain = await greedy(client, "Hello")
    assert await greedy(client, "Hello", echo=True) == "Hello" + plain


async def test_several_prompts_and_logprobs_are_refused(client: openai.AsyncOpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as several:
        await client.completions.create(model=TINY, prompt=["a", "b"], max_tokens=2)
    assert "one prompt per request" in str(several.value)
    with pytest.raises(openai.BadRequestError) as logprobs:
        await client.completions.create(model=TINY, prompt="a", max_tokens=2, logprobs=2)
    assert "logprobs" in str(logprobs.value)


async def test_embeddings_are_a_501_saying_why(client: openai.AsyncOpenAI) -> None:
    with pytest.raises(openai.APIStatusError) as info:
        await client.embeddings.create(model=TINY, input="hello")
    assert info.value.status_code == 501
    assert "not an embedding model" in info.value.message
