"""Chat completions on tiny-random through the official OpenAI SDK."""

from __future__ import annotations

import asyncio
import json

import aiohttp
import openai
import pytest

from reef.engine.server import BackgroundServer
from tests.engine.conftest import TINY, Admin
from tests.polling import eventually_async

HELLO = [{"role": "user", "content": "Hello there"}]


async def greedy(client: openai.AsyncOpenAI, content: str, max_tokens: int = 12) -> str:
    response = await client.chat.completions.create(
        model=TINY,
        messages=[{"role": "user", "content": content}],
        max_tokens=max_tokens,
        temperature=0,
    )
    return response.choices[0].message.content or ""


async def test_non_streaming_answer_with_usage_and_token_ids(
    client: openai.AsyncOpenAI, server: BackgroundServer
) -> None:
    response = await client.chat.completions.create(
        model=TINY,
        messages=HELLO,
        max_tokens=10,
        temperature=0,
        extra_body={"return_token_ids": True},
    )
    extra = response.model_extra or {}
    choice = response.choices[0]
    token_ids = (choice.model_extra or {})["token_ids"]
    tokenizer = server.engine.loaded.tokenizer
    assert response.object == "chat.completion"
    assert response.model == TINY
    assert choice.message.role == "assistant"
    assert choice.finish_reason in {"stop", "length"}
    assert extra["prompt_token_ids"] == tokenizer.apply_chat_template(
        HELLO, add_generation_prompt=True, tokenize=True, return_dict=False
    )
    assert response.usage is not None
    assert response.usage.prompt_tokens == len(extra["prompt_token_ids"])
    assert response.usage.completion_tokens == len(token_ids) <= 10
    assert response.usage.total_tokens == response.usage.prompt_tokens + len(token_ids)
    assert choice.message.content == tokenizer.decode(token_ids, skip_special_tokens=True)


async def test_tokenize_counts_the_prompt_a_completion_is_charged_for(
    client: openai.AsyncOpenAI, server: BackgroundServer
) -> None:
    """vLLM's ``POST /tokenize`` (at the root): the tokens the chat template makes."""
    root = server.base_url.removesuffix("/v1")
    async with aiohttp.ClientSession() as session:
        answer = await session.post(root + "/tokenize", json={"model": TINY, "messages": HELLO})
        assert answer.status == 200, await answer.text()
        counted = await answer.json()
    response = await client.chat.completions.create(model=TINY, messages=HELLO, max_tokens=1)
    assert response.usage is not None
    assert counted["count"] == len(counted["tokens"]) == response.usage.prompt_tokens
    assert counted["max_model_len"] == server.engine.loaded.max_context


async def test_max_tokens_ends_with_length(client: openai.AsyncOpenAI) -> None:
    response = await client.chat.completions.create(
        model=TINY, messages=HELLO, max_tokens=3, temperature=0
    )
    assert response.choices[0].finish_reason == "length"
    assert response.usage is not None and response.usage.completion_tokens == 3


async def test_streaming_matches_non_streaming(client: openai.AsyncOpenAI) -> None:
    expected = await greedy(client, "Hello there", 16)
    stream = await client.chat.completions.create(
        model=TINY,
        messages=HELLO,
        max_tokens=16,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"return_token_ids": True},
    )
    chunks = [chunk async for chunk in stream]
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    streamed_ids = [
        token
        for c in chunks
        if c.choices
        for token in (c.choices[0].model_extra or {})["token_ids"]
    ]
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert text == expected
    assert finishes[-1] in {"stop", "length"} and all(f is None for f in finishes[:-1])
    usage = chunks[-1].usage
    assert chunks[-1].choices == [] and usage is not None
    assert usage.completion_tokens == len(streamed_ids)
    assert usage.prompt_tokens == len((chunks[0].model_extra or {})["prompt_token_ids"])


async def test_n_choices_with_seed_are_reproducible(client: openai.AsyncOpenAI) -> None:
    async def sample() -> list[str]:
        response = await client.chat.completions.create(
            model=TINY, messages=HELLO, max_tokens=8, temperature=1.0, top_p=0.9, seed=7, n=3
        )
        assert [c.index for c in response.choices] == [0, 1, 2]
        assert response.usage is not None
        assert response.usage.completion_tokens <= 3 * 8
        return [c.message.content or "" for c in response.choices]

    first = await sample()
    assert first == await sample()
    assert len(set(first)) > 1  # each choice draws from its own stream


async def test_streaming_n_choices_each_finish(client: openai.AsyncOpenAI) -> None:
    stream = await client.chat.completions.create(
        model=TINY, messages=HELLO, max_tokens=5, temperature=0, n=2, stream=True
    )
    finished = {c.choices[0].index: c.choices[0].finish_reason async for c in stream if c.choices}
    assert set(finished) == {0, 1} and all(finished.values())


async def test_stop_string_cuts_the_answer(client: openai.AsyncOpenAI) -> None:
    full = await greedy(client, "stop test", 24)
    visible = [i for i, ch in enumerate(full) if ch.isprintable() and ch != "\ufffd"]
    cut = visible[len(visible) // 2]
    stop = full[cut : cut + 2]
    expected = full[: full.find(stop)]
    response = await client.chat.completions.create(
        model=TINY,
        messages=[{"role": "user", "content": "stop test"}],
        max_tokens=24,
        temperature=0,
        stop=[stop, "never-seen-stop"],
    )
    assert response.choices[0].message.content == expected
    assert response.choices[0].finish_reason == "stop"
    stream = await client.chat.completions.create(
        model=TINY,
        messages=[{"role": "user", "content": "stop test"}],
        max_tokens=24,
        temperature=0,
        stop=stop,
        stream=True,
    )
    streamed = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
    assert streamed == expected


async def test_logprobs_in_openai_shape(client: openai.AsyncOpenAI) -> None:
    response = await client.chat.completions.create(
        model=TINY, messages=HELLO, max_tokens=6, temperature=0, logprobs=True, top_logprobs=3
    )
    choice = response.choices[0]
    assert choice.logprobs is not None and choice.logprobs.content is not None
    content = choice.logprobs.content
    assert response.usage is not None and len(content) == response.usage.completion_tokens
    for entry in content:
        assert entry.logprob <= 0.0
        assert entry.bytes == list(entry.token.encode("utf-8"))
        assert len(entry.top_logprobs) == 3
        # Greedy: the chosen token is the most likely one.
        assert entry.logprob == pytest.approx(entry.top_logprobs[0].logprob)
        ranked = [t.logprob for t in entry.top_logprobs]
        assert ranked == sorted(ranked, reverse=True)
    plain = await client.chat.completions.create(model=TINY, messages=HELLO, max_tokens=2)
    assert plain.choices[0].logprobs is None


async def test_streamed_logprobs_cover_every_token(client: openai.AsyncOpenAI) -> None:
    stream = await client.chat.completions.create(
        model=TINY, messages=HELLO, max_tokens=6, temperature=0, logprobs=True, stream=True
    )
    entries = [
        entry
        async for chunk in stream
        if chunk.choices and chunk.choices[0].logprobs
        for entry in chunk.choices[0].logprobs.content or []
    ]
    assert 1 <= len(entries) <= 6


async def test_concurrent_requests_batch_and_match_solo_results(
    client: openai.AsyncOpenAI, admin: Admin
) -> None:
    prompts = [f"prompt number {i} " + "x" * (i * 7) for i in range(6)]
    solo = [await greedy(client, p, 30) for p in prompts]
    together = await asyncio.gather(*(greedy(client, p, 30) for p in prompts))
    assert list(together) == solo  # padding and cache merging change nothing
    status, body = await admin.get("/../health")
    assert status == 200
    assert json.loads(body)["peak_batch"] >= 2


async def test_tools_reach_the_prompt(client: openai.AsyncOpenAI) -> None:
    tool = {
        "type": "function",
        "function": {"name": "lookup", "parameters": {"type": "object", "properties": {}}},
    }
    with_tools = await client.chat.completions.create(
        model=TINY,
        messages=HELLO,
        max_tokens=1,
        tools=[tool],  # type: ignore[list-item]
    )
    without = await client.chat.completions.create(model=TINY, messages=HELLO, max_tokens=1)
    assert with_tools.usage is not None and without.usage is not None
    assert with_tools.usage.prompt_tokens > without.usage.prompt_tokens


async def test_content_parts_and_developer_role(client: openai.AsyncOpenAI) -> None:
    response = await client.chat.completions.create(
        model=TINY,
        messages=[
            {"role": "developer", "content": "be brief"},
            {"role": "user", "content": [{"type": "text", "text": "hi"}]},
        ],
        max_tokens=2,
    )
    assert response.choices[0].message.role == "assistant"


async def test_unknown_model_is_404(client: openai.AsyncOpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as caught:
        await client.chat.completions.create(model="no-such-model", messages=HELLO)
    assert caught.value.status_code == 404
    assert isinstance(caught.value.body, dict) and "no-such-model" in caught.value.body["message"]


@pytest.mark.parametrize(
    "body",
    [
        {"model": TINY},
        {"model": TINY, "messages": []},
        {"model": TINY, "messages": HELLO, "temperature": 5},
        {"model": TINY, "messages": HELLO, "n": 0},
        {"model": TINY, "messages": [{"role": "wizard", "content": "x"}]},
        {"model": TINY, "messages": HELLO, "top_logprobs": 2},
    ],
)
async def test_bad_bodies_are_400_in_openai_shape(admin: Admin, body: object) -> None:
    status, text = await admin.post("/chat/completions", body)
    assert status == 400
    error = json.loads(text)["error"]
    assert error["type"] == "invalid_request_error" and error["message"]


async def test_invalid_json_and_unknown_route(admin: Admin) -> None:
    async with admin.session.post(
        admin.base_url + "/chat/completions", data=b"{not json"
    ) as response:
        assert response.status == 400
        assert "error" in await response.json()
    status, text = await admin.get("/no/such/route")
    assert status == 404 and "error" in json.loads(text)


async def test_prompt_longer_than_context_is_400(client: openai.AsyncOpenAI) -> None:
    with pytest.raises(openai.BadRequestError):
        await client.chat.completions.create(
            model=TINY, messages=[{"role": "user", "content": "x" * 3000}], max_tokens=1
        )


async def test_models_and_health(client: openai.AsyncOpenAI, admin: Admin) -> None:
    models = await client.models.list()
    assert [m.id for m in models.data] == [TINY]
    status, text = await admin.get("/../health")
    assert status == 200 and json.loads(text)["status"] == "ok"


async def test_client_disconnect_stops_generation(
    client: openai.AsyncOpenAI, server: BackgroundServer
) -> None:
    stream = await client.chat.completions.create(
        model=TINY, messages=HELLO, max_tokens=1500, temperature=0, stream=True
    )
    received = 0
    async for _chunk in stream:
        received += 1
        if received == 3:
            break
    await stream.close()
    scheduler = server.engine.scheduler
    await eventually_async(
        lambda: scheduler.stats()["running"] == 0, "generation to stop", timeout_seconds=5
    )


async def test_non_streaming_cancel_stops_generation(
    client: openai.AsyncOpenAI, server: BackgroundServer
) -> None:
    # Greedy: a sampled reply can draw the end token within a few steps and finish
    # before anything sees it run; the greedy one runs its 1500 tokens (as the stream's).
    request = asyncio.create_task(
        client.chat.completions.create(model=TINY, messages=HELLO, max_tokens=1500, temperature=0)
    )
    scheduler = server.engine.scheduler
    await eventually_async(
        lambda: scheduler.stats()["running"] > 0, "generation to start", timeout_seconds=5
    )
    request.cancel()
    with pytest.raises(asyncio.CancelledError):
        await request
    await eventually_async(
        lambda: scheduler.stats()["running"] == 0, "generation to stop", timeout_seconds=2
    )
