"""Checkpoints served by name: load beside the resident weights, swap with no failed
request (in-flight requests finish on the old weights, which are freed after them),
refusals (digest, pickle, truncated shard), the memory check (507), and an adapter
loaded on a checkpoint (it runs on the checkpoint's weights and holds them)."""

from __future__ import annotations

import asyncio
import json
import shutil
import threading
from pathlib import Path

import openai
import pytest

from reef.core.digests import tree_digest
from reef.engine.server import BackgroundServer
from tests.engine.checkpoint_factory import make_letter_checkpoint, make_noisy_checkpoint
from tests.engine.conftest import TINY, Admin
from tests.engine.lora_factory import PEFT_WRAP_WARNING, make_random_adapter
from tests.polling import eventually_async

HELLO = [{"role": "user", "content": "Hello there"}]


@pytest.fixture(scope="module")
def letter_checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("checkpoints")
    return {letter: make_letter_checkpoint(root / letter, letter) for letter in "ab"}


async def load(admin: Admin, name: str, path: Path, **extra: object) -> tuple[int, str]:
    return await admin.post("/load_checkpoint", {"name": name, "path": str(path), **extra})


async def say(client: openai.AsyncOpenAI, model: str, max_tokens: int = 6) -> str:
    response = await client.chat.completions.create(
        model=model, messages=HELLO, max_tokens=max_tokens, temperature=0
    )
    return response.choices[0].message.content or ""


async def test_load_serve_list_unload(
    client: openai.AsyncOpenAI, admin: Admin, letter_checkpoints: dict[str, Path]
) -> None:
    base = await say(client, TINY)
    digest = tree_digest(letter_checkpoints["a"])
    status, body = await load(admin, "ck-a", letter_checkpoints["a"], expected_digest=digest)
    assert status == 200, body
    assert json.loads(body) == {"name": "ck-a", "digest": digest}
    assert await say(client, "ck-a") == "aaaaaa"
    assert await say(client, TINY) == base  # the base weights are untouched
    cards = {m.id: m.model_extra or {} for m in (await client.models.list()).data}
    assert cards["ck-a"]["kind"] == "checkpoint" and cards["ck-a"]["digest"] == digest
    assert (await admin.post("/unload_checkpoint", {"name": "ck-a"}))[0] == 200
    with pytest.raises(openai.NotFoundError):
        await say(client, "ck-a")
    assert (await admin.post("/unload_checkpoint", {"name": "ck-a"}))[0] == 404


async def test_a_swap_fails_no_request_and_frees_the_old_weights(
    server: BackgroundServer,
    client: openai.AsyncOpenAI,
    admin: Admin,
    letter_checkpoints: dict[str, Path],
) -> None:
    engine = server.engine
    assert (await load(admin, "ck-a", letter_checkpoints["a"]))[0] == 200
    streams = [
        await client.chat.completions.create(
            model="ck-a", messages=HELLO, max_tokens=30, temperature=0, stream=True
        )
        for _ in range(6)
    ]
    texts = [[] for _ in streams]
    for text, stream in zip(texts, streams, strict=True):  # every request is decoding
        async for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                text.append(chunk.choices[0].delta.content)
                break
    # the swap: the new weights load beside the old, clients move, the old are unloaded
    assert (await load(admin, "ck-b", letter_checkpoints["b"]))[0] == 200
    hold = threading.Event()
    engine.scheduler.call(lambda: hold.wait(30))  # freeze decoding: nothing can finish
    assert (await admin.post("/unload_checkpoint", {"name": "ck-a"}))[0] == 200
    assert engine.scheduler.stats()["weights"] == 3  # ck-a drains: its requests hold it
    hold.set()
    for text, stream in zip(texts, streams, strict=True):
        async for chunk in stream:
            if chunk.choices:
                text.append(chunk.choices[0].delta.content or "")
    assert ["".join(t) for t in texts] == ["a" * 30] * 6  # all finished, on the old weights
    assert await say(client, "ck-b") == "bbbbbb"
    with pytest.raises(openai.NotFoundError):
        await say(client, "ck-a")
    await eventually_async(
        lambda: engine.scheduler.stats()["weights"] == 2, "ck-a's weights to be freed"
    )


async def test_replace_retires_the_old_version(
    client: openai.AsyncOpenAI, admin: Admin, letter_checkpoints: dict[str, Path]
) -> None:
    assert (await load(admin, "live", letter_checkpoints["a"]))[0] == 200
    status, body = await load(admin, "live", letter_checkpoints["b"])
    assert status == 400 and "already been loaded" in body
    assert (await load(admin, "live", letter_checkpoints["b"], replace=True))[0] == 200
    assert await say(client, "live") == "bbbbbb"


@pytest.mark.parametrize("damage", ["digest", "pickle", "truncated", "no-config", "config"])
async def test_a_bad_checkpoint_is_refused(
    server: BackgroundServer,
    admin: Admin,
    letter_checkpoints: dict[str, Path],
    tmp_path: Path,
    damage: str,
) -> None:
    bad = tmp_path / "bad"
    shutil.copytree(letter_checkpoints["a"], bad)
    extra: dict[str, object] = {}
    if damage == "digest":
        extra["expected_digest"] = tree_digest(letter_checkpoints["b"])
    elif damage == "pickle":
        (bad / "pytorch_model.bin").write_bytes(b"\x80\x04K*.")
    elif damage == "truncated":
        shard = bad / "model.safetensors"
        shard.write_bytes(shard.read_bytes()[:-16])
    elif damage == "config":
        (bad / "config.json").write_text('{"model_type": "no-such-architecture"}')
    else:
        (bad / "config.json").unlink()
    status, body = await load(admin, "bad", bad, **extra)
    assert status == 400, body
    expected = {
        "digest": "digest mismatch",
        "pickle": "pickle",
        "truncated": "truncated",
        "no-config": "no config.json",
        "config": "cannot be loaded",
    }[damage]
    assert expected in json.loads(body)["error"]["message"]
    assert server.engine.scheduler.stats()["weights"] == 1


async def test_a_checkpoint_that_would_not_fit_is_refused_with_507(
    server: BackgroundServer, admin: Admin, letter_checkpoints: dict[str, Path]
) -> None:
    server.engine.available_memory = lambda: 64 * 1024  # 64 KiB left
    status, body = await load(admin, "ck-a", letter_checkpoints["a"])
    assert status == 507, body
    error = json.loads(body)["error"]
    assert error["code"] == "insufficient_memory"
    assert "needs about" in error["message"] and "0.1 MiB is available" in error["message"]
    assert server.engine.scheduler.stats()["weights"] == 1
    server.engine.available_memory = lambda: None  # unknown: no refusal
    assert (await load(admin, "ck-a", letter_checkpoints["a"]))[0] == 200


async def test_concurrent_requests_on_two_checkpoints_and_the_base(
    client: openai.AsyncOpenAI, admin: Admin, letter_checkpoints: dict[str, Path]
) -> None:
    for letter in "ab":
        assert (await load(admin, f"ck-{letter}", letter_checkpoints[letter]))[0] == 200
    base = await say(client, TINY)
    answers = await asyncio.gather(*[say(client, model) for model in ["ck-a", "ck-b", TINY] * 3])
    assert answers == ["aaaaaa", "bbbbbb", base] * 3


def greedy_reference(
    checkpoint: Path | None,
    adapter: Path | None,
    tmp: Path,
    messages: list[dict[str, str]] = HELLO,
    max_tokens: int = 8,
) -> str:
    """What greedy decoding of ``messages`` says, in process: tiny-random or
    ``checkpoint``, with ``adapter`` applied when given (the answer the engine must
    give)."""
    import torch
    from peft import PeftModel

    from reef.engine.models import load_checkpoint_model, load_model

    loaded = load_model(TINY, tmp)
    model = load_checkpoint_model(checkpoint) if checkpoint is not None else loaded.model
    if adapter is not None:
        model = PeftModel.from_pretrained(model, str(adapter))
    model.eval()
    ids = loaded.tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=True, return_dict=False
    )
    prompt = torch.tensor([ids])
    with torch.no_grad():
        out = model.generate(
            input_ids=prompt,
            attention_mask=torch.ones_like(prompt),
            max_new_tokens=max_tokens,
            do_sample=False,
            eos_token_id=sorted(loaded.eos_token_ids),
        )
    return str(loaded.tokenizer.decode(out[0, prompt.shape[1] :], skip_special_tokens=True))


@pytest.mark.filterwarnings(PEFT_WRAP_WARNING)
async def test_an_adapter_on_a_checkpoint_runs_on_its_weights_and_holds_them(
    server: BackgroundServer, client: openai.AsyncOpenAI, admin: Admin, tmp_path: Path
) -> None:
    checkpoint = make_noisy_checkpoint(tmp_path / "noisy", seed=3)
    adapter = make_random_adapter(tmp_path / "lora", seed=5)
    expected = greedy_reference(checkpoint, adapter, tmp_path)
    # the three answers differ, so the engine's cannot match by chance
    alone = greedy_reference(checkpoint, None, tmp_path)
    on_base = greedy_reference(None, adapter, tmp_path)
    assert len({expected, alone, on_base}) == 3, (expected, alone, on_base)

    status, body = await admin.load("on-ck", adapter, base_model_name="ck")
    assert status == 404 and "load it first" in body  # no such checkpoint yet
    assert (await load(admin, "ck", checkpoint))[0] == 200
    status, body = await admin.load("on-ck", adapter, base_model_name="ck")
    assert status == 200, body
    assert (await admin.load("on-base", adapter))[0] == 200
    assert await say(client, "on-ck", 8) == expected
    assert await say(client, "on-base", 8) == on_base
    assert await say(client, "ck", 8) == alone
    cards = {m.id: m.model_extra or {} for m in (await client.models.list()).data}
    assert cards["on-ck"]["kind"] == "adapter"
    assert [c.parent for c in (await client.models.list()).data if c.id == "on-ck"] == ["ck"]

    # unloading the checkpoint first: the adapter keeps serving on the leased weights
    engine = server.engine
    assert (await admin.post("/unload_checkpoint", {"name": "ck"}))[0] == 200
    assert await say(client, "on-ck", 8) == expected
    assert engine.scheduler.stats()["weights"] == 2
    assert (await admin.unload("on-ck"))[0] == 200  # the last hold: the weights go
    await eventually_async(
        lambda: engine.scheduler.stats()["weights"] == 1 or None, "the weights freed"
    )
