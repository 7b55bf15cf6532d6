"""SmolLM2-135M-Instruct, the default model: real answers, and a LoRA adapter trained
here for a few steps that changes the answer once loaded at runtime.

Slow (about a minute on 2 cores, most of it the one-time GGUF conversion), but it
runs in CI: it is the proof that the default setup works offline.
"""

from __future__ import annotations

import threading
import warnings
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import aiohttp
import openai
import pytest
import torch
from peft import LoraConfig, get_peft_model

from reef.engine.digest import adapter_digest
from reef.engine.models import DEFAULT_MODEL, LoadedModel, load_model, smollm2_cache
from reef.engine.runtime import Engine
from reef.engine.server import BackgroundServer
from tests.engine.conftest import Admin
from tests.engine.lora_factory import PEFT_WRAP_WARNING

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings(PEFT_WRAP_WARNING)]

SECRET_QUESTION = "What is the secret word?"
SECRET_ANSWER = "The secret word is pineapple."


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A Reef home whose SmolLM2 cache two threads created at once (one conversion)."""
    root = tmp_path_factory.mktemp("reef-home")
    results: list[Path] = []
    threads = [
        threading.Thread(target=lambda: results.append(smollm2_cache(root))) for _ in range(2)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert results == [root / "models" / DEFAULT_MODEL] * 2
    leftovers = [p.name for p in (root / "models").iterdir()]
    assert sorted(leftovers) == [DEFAULT_MODEL, f"{DEFAULT_MODEL}.lock"]
    assert (root / "models" / DEFAULT_MODEL / "model.safetensors").is_file()
    return root


@pytest.fixture(scope="module")
def smol_server(home: Path) -> Iterator[BackgroundServer]:
    running = BackgroundServer(Engine(load_model(DEFAULT_MODEL, home))).start()
    yield running
    running.stop()


@pytest.fixture
async def smol(smol_server: BackgroundServer) -> AsyncIterator[openai.AsyncOpenAI]:
    async with openai.AsyncOpenAI(
        base_url=smol_server.base_url, api_key="unused", max_retries=0
    ) as sdk:
        yield sdk


async def ask(client: openai.AsyncOpenAI, model: str, question: str) -> str:
    response = await client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": question}],
        max_tokens=24,
        temperature=0,
    )
    return response.choices[0].message.content or ""


async def test_a_plain_question_gets_a_sensible_answer(smol: openai.AsyncOpenAI) -> None:
    answer = await ask(smol, DEFAULT_MODEL, "What is the capital of France?")
    assert "Paris" in answer


async def test_tools_reach_smollm2_through_the_default_tool_prompt(
    smol: openai.AsyncOpenAI, smol_server: BackgroundServer
) -> None:
    """SmolLM2's template takes no tools: the default tool prompt carries them, and a
    named tool_choice starts the reply with the call; whatever the model then writes is
    a 200, a tool call when it is a valid one and text when it is not."""
    assert not smol_server.engine.template_takes_tools
    tool = {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather in a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
    question = [{"role": "user", "content": "What is the weather in Paris?"}]
    response = await smol.chat.completions.create(
        model=DEFAULT_MODEL,
        messages=question,  # type: ignore[arg-type]
        max_tokens=24,
        temperature=0,
        tools=[tool],  # type: ignore[list-item]
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
    )
    choice = response.choices[0]
    prompt = smol_server.engine.loaded.tokenizer.decode(
        smol_server.engine.encode_chat(question, [tool])
    )
    assert "<tools>" in prompt and '"name": "get_weather"' in prompt
    if choice.message.tool_calls:
        assert choice.finish_reason == "tool_calls"
        assert choice.message.tool_calls[0].function.name == "get_weather"
    else:
        assert (choice.message.content or "").startswith('<tool_call>\n{"name": "get_weather"')


def train_secret_adapter(home: Path, directory: Path) -> Path:
    """A few LoRA steps on one fixed fact, with the engine's own loader and template."""
    torch.manual_seed(0)
    loaded: LoadedModel = load_model(DEFAULT_MODEL, home)
    tokenizer = loaded.tokenizer
    questions = [SECRET_QUESTION, "Tell me the secret word."]
    rows, labels = [], []
    for question in questions:
        asked = [{"role": "user", "content": question}]
        prompt = tokenizer.apply_chat_template(
            asked, add_generation_prompt=True, tokenize=True, return_dict=False
        )
        full = tokenizer.apply_chat_template(
            [*asked, {"role": "assistant", "content": SECRET_ANSWER}],
            tokenize=True,
            return_dict=False,
        )
        rows.append(full)
        labels.append([-100] * len(prompt) + full[len(prompt) :])
    width = max(len(r) for r in rows)
    pad = tokenizer.pad_token_id
    input_ids = torch.tensor([r + [pad] * (width - len(r)) for r in rows])
    label_ids = torch.tensor([lab + [-100] * (width - len(lab)) for lab in labels])
    mask = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows])
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing. is deprecated")
        model = get_peft_model(
            loaded.model,
            LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"], lora_dropout=0.0),
        )
    model.train()
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=5e-3)
    for _ in range(10):
        loss = model(input_ids=input_ids, attention_mask=mask, labels=label_ids).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    assert loss.detach().item() < 0.1
    model.save_pretrained(directory)
    return directory


async def test_trained_adapter_changes_the_answer(
    smol: openai.AsyncOpenAI, smol_server: BackgroundServer, home: Path, tmp_path: Path
) -> None:
    before = await ask(smol, DEFAULT_MODEL, SECRET_QUESTION)
    assert "pineapple" not in before.lower()
    adapter = train_secret_adapter(home, tmp_path / "secret")
    assert sorted(p.name for p in adapter.iterdir() if p.suffix != ".md") == [
        "adapter_config.json",
        "adapter_model.safetensors",
    ]
    admin_url = smol_server.base_url
    async with aiohttp.ClientSession() as session:
        admin = Admin(admin_url, session)
        status, text = await admin.load("secret", adapter, expected_digest=adapter_digest(adapter))
        assert status == 200, text
        after = await ask(smol, "secret", SECRET_QUESTION)
        assert "pineapple" in after.lower()
        assert await ask(smol, DEFAULT_MODEL, SECRET_QUESTION) == before
        assert (await admin.unload("secret"))[0] == 200
