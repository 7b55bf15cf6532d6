"""The engine's precisions: ``auto`` reads the CPU's flags (and whether fbgemm's float16
product runs), the command line and the ``type: local`` upstream pass the dtype on, and
an engine in bfloat16 (plain, packed or int8 layers) or float16 serves the base model, a
float32-trained LoRA adapter and a checkpoint (loaded in the engine's precision)."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.request
from pathlib import Path

import aiohttp
import openai
import pytest

from reef.engine.models import load_model
from reef.engine.precision import (
    PackedLinear,
    apply_precision,
    can_fp16,
    can_pack,
    load_dtype,
    precision_of,
)
from reef.engine.process import EngineOptions, cpu_has_bf16, engine_command, resolve_dtype
from reef.engine.runtime import Engine
from reef.engine.server import BackgroundServer
from tests.engine.checkpoint_factory import make_letter_checkpoint
from tests.engine.lora_factory import PEFT_WRAP_WARNING, make_letter_adapter

pytestmark = pytest.mark.filterwarnings(PEFT_WRAP_WARNING)


def test_auto_picks_float16_then_native_bfloat16_then_float32(tmp_path: Path) -> None:
    with_amx = tmp_path / "amx"
    with_amx.write_text("processor: 0\nflags\t\t: fpu sse2 avx512f amx_bf16 amx_tile\n")
    plain = tmp_path / "plain"
    plain.write_text("processor: 0\nflags\t\t: fpu sse2 avx2\n")
    assert cpu_has_bf16(with_amx) and not cpu_has_bf16(plain)
    assert not cpu_has_bf16(tmp_path / "missing")
    assert resolve_dtype("float32") == "float32" and resolve_dtype("bfloat16") == "bfloat16"
    assert resolve_dtype("auto", cuda=True) == "bfloat16"
    assert resolve_dtype("auto", cuda=True, fp16=True) == "bfloat16"
    assert resolve_dtype("auto") == ("bfloat16" if cpu_has_bf16() else "float32")
    # on a CPU, float16 wherever fbgemm runs (faster and closer to float32 than bfloat16)
    assert resolve_dtype("auto", fp16=True) == "float16"
    assert resolve_dtype("float32", fp16=True) == "float32"


def test_the_dtype_reaches_the_engine_command_line(tmp_path: Path) -> None:
    command = engine_command("tiny-random", tmp_path, options=EngineOptions(dtype="bfloat16"))
    assert command[command.index("--dtype") + 1] == "bfloat16"
    refused = subprocess.run(
        [sys.executable, "-m", "reef.engine", "serve", "--dtype", "float8"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert refused.returncode == 2 and "invalid choice: 'float8'" in refused.stderr


@pytest.mark.parametrize("dtype", ["bfloat16", "auto"])
def test_a_local_upstreams_dtype_and_threads_reach_its_engine(tmp_path: Path, dtype: str) -> None:
    from reef.cli.local_engine import start_local_upstreams
    from reef.config import UpstreamConfig

    expected = dtype
    if dtype == "auto":  # decided in the engine's process, for its machine
        expected = "float16" if can_fp16() is None else "bfloat16" if cpu_has_bf16() else "float32"
    config = UpstreamConfig(type="local", model="tiny-random", dtype=dtype, threads=1)
    resolved, engines = start_local_upstreams({"local": config}, tmp_path)
    try:
        base_url = resolved["local"].base_url
        assert base_url is not None
        with urllib.request.urlopen(base_url.removesuffix("/v1") + "/health") as reply:
            health = json.load(reply)
        assert (health["dtype"], health["threads"]) == (expected, 1)
    finally:
        for engine in engines:
            engine.stop()
    with pytest.raises(ValueError, match="float32"):
        UpstreamConfig(type="local", dtype="float8")  # type: ignore[arg-type]


@pytest.mark.parametrize("precision", [None, "bfloat16", "int8", "float16"])
async def test_a_bfloat16_engine_serves_the_base_an_adapter_and_a_checkpoint(
    tmp_path: Path, precision: str | None
) -> None:
    """Plain bfloat16 layers (``None``), packed ones, int8 ones and float16 ones
    (reef.engine.precision)."""
    if precision == "float16" and can_fp16() is not None:
        pytest.skip(f"float16 layers need fbgemm: {can_fp16()}")
    dtype = load_dtype(precision or "bfloat16")
    loaded = load_model("tiny-random", tmp_path, dtype=dtype)
    assert next(loaded.model.parameters()).dtype == dtype
    if precision is not None:
        apply_precision(loaded.model, precision)
    adapter = make_letter_adapter(tmp_path / "adapter-b", "b")  # trained in float32
    checkpoint = make_letter_checkpoint(tmp_path / "ckpt-c", "c")
    engine = Engine(loaded, max_batch=4, threads=1)
    server = BackgroundServer(engine).start()
    try:
        async with (
            openai.AsyncOpenAI(base_url=server.base_url, api_key="x", max_retries=0) as client,
            aiohttp.ClientSession() as http,
        ):
            async with http.get(server.base_url.removesuffix("/v1") + "/health") as answer:
                assert (await answer.json())["dtype"] == (precision or "bfloat16")

            async def say(model: str) -> str:
                reply = await client.chat.completions.create(
                    model=model,
                    messages=[{"role": "user", "content": "hi"}],
                    max_tokens=6,
                    temperature=0,
                    logprobs=True,
                )
                content = reply.choices[0].logprobs
                assert content is not None and content.content
                assert all(entry.logprob <= 0.0 for entry in content.content)
                return reply.choices[0].message.content or ""

            assert len(await say("tiny-random")) > 0
            body = {"lora_name": "b", "lora_path": str(adapter)}
            async with http.post(server.base_url + "/load_lora_adapter", json=body) as answer:
                assert answer.status == 200, await answer.text()
            assert await say("b") == "bbbbbb"
            body = {"name": "c", "path": str(checkpoint)}
            async with http.post(server.base_url + "/load_checkpoint", json=body) as answer:
                assert answer.status == 200, await answer.text()
            assert await say("c") == "cccccc"
        [checkpoint_weights] = [
            b.runner.base for k, b in engine.scheduler.batches.items() if k != "base"
        ]
        assert precision_of(checkpoint_weights) == (precision or "bfloat16"), "loaded as the engine"
        if precision is not None and can_pack(checkpoint_weights):
            assert any(isinstance(m, PackedLinear) for m in checkpoint_weights.modules())
    finally:
        server.stop()
