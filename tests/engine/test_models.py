"""Model sources: tiny-random, local directories, errors."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch

from reef.engine.errors import ModelSourceError
from reef.engine.models import TINY_MODEL, load_model
from reef.engine.tiny import CHAT_TEMPLATE


def test_tiny_random_is_deterministic_and_fast(tmp_path: Path) -> None:
    first = load_model(TINY_MODEL, tmp_path)
    second = load_model(TINY_MODEL, tmp_path)
    for (name, a), (_, b) in zip(
        first.model.state_dict().items(), second.model.state_dict().items(), strict=True
    ):
        assert torch.equal(a, b), name
    assert first.name == TINY_MODEL
    assert first.eos_token_ids == {first.tokenizer.convert_tokens_to_ids("<|im_end|>")}
    assert not any(tmp_path.iterdir())  # tiny-random writes nothing to the home


def test_tiny_tokenizer_round_trips_any_text(tmp_path: Path) -> None:
    tokenizer = load_model(TINY_MODEL, tmp_path).tokenizer
    text = "héllo wörld, 你好 🙂"
    assert tokenizer.decode(tokenizer.encode(text)) == text
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=False
    )
    assert prompt == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


def test_local_directory_loads_the_same_model(tmp_path: Path) -> None:
    tiny = load_model(TINY_MODEL, tmp_path)
    directory = tmp_path / "my-model"
    tiny.model.save_pretrained(directory)
    tiny.tokenizer.save_pretrained(directory)
    loaded = load_model(str(directory), tmp_path)
    assert loaded.name == str(directory)
    assert loaded.tokenizer.chat_template == CHAT_TEMPLATE
    for a, b in zip(
        tiny.model.state_dict().values(), loaded.model.state_dict().values(), strict=True
    ):
        assert torch.equal(a, b)


def test_a_directory_without_chat_template_gets_chatml(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    tiny = load_model(TINY_MODEL, tmp_path)
    directory = tmp_path / "no-template"
    tiny.model.save_pretrained(directory)
    tiny.tokenizer.chat_template = None
    tiny.tokenizer.save_pretrained(directory)
    for leftover in directory.glob("chat_template.*"):
        leftover.unlink()
    with caplog.at_level(logging.WARNING, logger="reef.engine"):
        loaded = load_model(str(directory), tmp_path)
    assert loaded.tokenizer.chat_template == CHAT_TEMPLATE
    assert "no chat template" in caplog.text


def test_unknown_source_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ModelSourceError, match="unknown model"):
        load_model("gpt-17", tmp_path)
    with pytest.raises(ModelSourceError):
        load_model(str(tmp_path / "missing"), tmp_path)
