"""200 concurrent requests while adapters are loaded, replaced and unloaded 20 times."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

import openai
import pytest

from reef.engine.digest import adapter_digest
from reef.engine.server import ADAPTER_DIGEST_HEADER
from tests.engine.conftest import TINY, Admin
from tests.engine.lora_factory import PEFT_WRAP_WARNING
from tests.polling import eventually_async

pytestmark = pytest.mark.filterwarnings(PEFT_WRAP_WARNING)

HELLO = [{"role": "user", "content": "Hello there"}]
TOKENS = 12


async def test_200_requests_while_adapters_swap_20_times(
    client: openai.AsyncOpenAI, admin: Admin, letter_adapters: dict[str, Path]
) -> None:
    digests = {letter: adapter_digest(path) for letter, path in letter_adapters.items()}
    letter_of = {digest: letter for letter, digest in digests.items()}
    base = (
        (
            await client.chat.completions.create(
                model=TINY, messages=HELLO, max_tokens=TOKENS, temperature=0
            )
        )
        .choices[0]
        .message.content
    )
    # Stable names always mean the same weights; "slot" is swapped between a and b.
    for name, letter in (("alpha", "a"), ("beta", "b"), ("slot", "a")):
        assert (await admin.load(name, letter_adapters[letter]))[0] == 200

    async def swap(i: int) -> None:
        letter = "b" if i % 2 == 0 else "a"
        status, text = await admin.load("slot", letter_adapters[letter], load_inplace=True)
        assert status == 200, text
        # A name that comes and goes exercises unload while requests run.
        assert (await admin.load("gamma", letter_adapters[letter]))[0] == 200
        assert (await admin.unload("gamma"))[0] == 200

    async def request(model: str, stream: bool) -> tuple[str, str, str | None]:
        raw = await client.chat.completions.with_raw_response.create(
            model=model, messages=HELLO, max_tokens=TOKENS, temperature=0, stream=stream
        )
        digest = raw.headers.get(ADAPTER_DIGEST_HEADER)
        if stream:
            parsed = raw.parse()
            text = "".join([c.choices[0].delta.content or "" async for c in parsed if c.choices])
        else:
            text = raw.parse().choices[0].message.content or ""
        return model, text, digest

    rng = random.Random(3)
    models = [rng.choice(["alpha", "beta", "slot", "slot", TINY]) for _ in range(200)]
    tasks: list[asyncio.Task[tuple[str, str, str | None]]] = []
    in_flight_at_swaps = 0
    for wave in range(20):  # 10 new requests, then a swap, 20 times over
        batch = [
            asyncio.create_task(request(model, stream=rng.random() < 0.3))
            for model in models[wave * 10 : (wave + 1) * 10]
        ]
        tasks += batch
        # The swap lands at a different point of each wave: once a random few of its
        # requests have been answered, while the others are still being generated.
        answered = rng.randrange(5)
        await eventually_async(
            lambda: sum(task.done() for task in batch) >= answered,  # noqa: B023
            f"{answered} answers of wave {wave}",
        )
        await swap(wave)
        in_flight_at_swaps += sum(not task.done() for task in tasks)
    results = await asyncio.gather(*tasks, return_exceptions=True)
    failures = [r for r in results if isinstance(r, BaseException)]
    assert failures == []
    answers = [r for r in results if isinstance(r, tuple)]
    assert len(answers) == 200
    for model, text, digest in answers:
        if model == TINY:
            assert (text, digest) == (base, None)
        elif model in ("alpha", "beta"):
            letter = "a" if model == "alpha" else "b"
            assert (text, digest) == (letter * TOKENS, digests[letter])
        else:  # the version the request started on, all the way through
            assert digest in letter_of
            assert text == letter_of[digest] * TOKENS
    assert {text[0] for model, text, _ in answers if model == "slot"} == {"a", "b"}
    assert in_flight_at_swaps > 0  # the swaps really happened under traffic
