"""Runtime LoRA adapters: vLLM's load/unload API, selection by name, refusals."""

from __future__ import annotations

import asyncio
import hashlib
import json
import shutil
from pathlib import Path

import openai
import pytest

from reef.config.models import UpstreamConfig
from reef.engine.digest import adapter_digest
from reef.engine.server import ADAPTER_DIGEST_HEADER
from reef.upstream import AdapterAlreadyLoadedError, HTTPUpstream, UpstreamRejectedError
from tests.engine.conftest import TINY, Admin
from tests.engine.lora_factory import PEFT_WRAP_WARNING

pytestmark = pytest.mark.filterwarnings(PEFT_WRAP_WARNING)

HELLO = [{"role": "user", "content": "Hello there"}]


async def say(client: openai.AsyncOpenAI, model: str, max_tokens: int = 6) -> str:
    response = await client.chat.completions.create(
        model=model, messages=HELLO, max_tokens=max_tokens, temperature=0
    )
    return response.choices[0].message.content or ""


async def test_load_select_list_unload(
    client: openai.AsyncOpenAI, admin: Admin, letter_adapters: dict[str, Path]
) -> None:
    base = await say(client, TINY)
    assert await admin.load("alpha", letter_adapters["a"]) == (
        200,
        "Success: LoRA adapter 'alpha' added successfully.",
    )
    assert (await admin.load("beta", letter_adapters["b"]))[0] == 200
    assert await say(client, "alpha") == "aaaaaa"
    assert await say(client, "beta") == "bbbbbb"
    assert await say(client, TINY) == base

    cards = {m.id: m for m in (await client.models.list()).data}
    assert list(cards) == [TINY, "alpha", "beta"]
    alpha = cards["alpha"].model_extra or {}
    assert alpha["parent"] == TINY and alpha["root"] == str(letter_adapters["a"])
    assert alpha["digest"] == adapter_digest(letter_adapters["a"])

    raw = await client.chat.completions.with_raw_response.create(
        model="alpha", messages=HELLO, max_tokens=1
    )
    assert raw.headers[ADAPTER_DIGEST_HEADER] == adapter_digest(letter_adapters["a"])

    assert (await admin.unload("alpha"))[0] == 200
    with pytest.raises(openai.NotFoundError):
        await say(client, "alpha")
    assert [m.id for m in (await client.models.list()).data] == [TINY, "beta"]
    assert (await admin.unload("beta"))[0] == 200
    assert await say(client, TINY) == base
    # Loading again after every adapter was dropped works.
    assert (await admin.load("beta", letter_adapters["b"]))[0] == 200
    assert await say(client, "beta") == "bbbbbb"


async def test_streaming_on_an_adapter(
    client: openai.AsyncOpenAI, admin: Admin, letter_adapters: dict[str, Path]
) -> None:
    await admin.load("alpha", letter_adapters["a"])
    stream = await client.chat.completions.create(
        model="alpha", messages=HELLO, max_tokens=5, temperature=0, stream=True
    )
    assert "".join([c.choices[0].delta.content or "" async for c in stream]) == "aaaaa"


async def test_duplicate_name_is_400_unless_inplace(
    client: openai.AsyncOpenAI, admin: Admin, letter_adapters: dict[str, Path]
) -> None:
    await admin.load("slot", letter_adapters["a"])
    status, text = await admin.load("slot", letter_adapters["b"])
    assert status == 400
    assert json.loads(text)["error"]["code"] == "adapter_already_loaded"
    assert await say(client, "slot") == "aaaaaa"
    assert (await admin.load("slot", letter_adapters["b"], load_inplace=True))[0] == 200
    assert await say(client, "slot") == "bbbbbb"
    assert (await admin.load(TINY, letter_adapters["a"]))[0] == 400


async def test_unload_unknown_is_404(admin: Admin) -> None:
    status, text = await admin.unload("ghost")
    assert status == 404 and "ghost" in json.loads(text)["error"]["message"]


async def test_digest_checked_before_anything_changes(
    client: openai.AsyncOpenAI, admin: Admin, letter_adapters: dict[str, Path]
) -> None:
    path = letter_adapters["a"]
    wrong = "sha256:" + "0" * 64
    status, text = await admin.load("alpha", path, expected_digest=wrong)
    assert status == 400 and "digest mismatch" in json.loads(text)["error"]["message"]
    assert [m.id for m in (await client.models.list()).data] == [TINY]
    with pytest.raises(openai.NotFoundError):
        await say(client, "alpha")
    assert (await admin.load("alpha", path, expected_digest="md5:abc"))[0] == 400
    assert (await admin.load("alpha", path, expected_digest=adapter_digest(path)))[0] == 200


@pytest.mark.parametrize("name", ["adapter_model.bin", "extra.pt", "x/y.pkl", "weights.pth"])
async def test_pickle_files_are_refused(
    admin: Admin, letter_adapters: dict[str, Path], tmp_path: Path, name: str
) -> None:
    adapter = shutil.copytree(letter_adapters["a"], tmp_path / "adapter")
    (adapter / name).parent.mkdir(parents=True, exist_ok=True)
    (adapter / name).write_bytes(b"\x80\x04K\x01.")  # a pickle
    status, text = await admin.load("alpha", adapter)
    assert status == 400 and "pickle" in json.loads(text)["error"]["message"]


async def test_incomplete_or_missing_adapters_are_refused(
    admin: Admin, letter_adapters: dict[str, Path], tmp_path: Path
) -> None:
    adapter = shutil.copytree(letter_adapters["a"], tmp_path / "adapter")
    (adapter / "adapter_model.safetensors").unlink()
    assert (await admin.load("alpha", adapter))[0] == 400
    assert (await admin.load("alpha", tmp_path / "nowhere"))[0] == 400
    assert (await admin.post("/load_lora_adapter", {"lora_name": "x"}))[0] == 400


async def test_weights_that_do_not_fit_are_refused_and_nothing_changes(
    client: openai.AsyncOpenAI, admin: Admin, letter_adapters: dict[str, Path], tmp_path: Path
) -> None:
    adapter = shutil.copytree(letter_adapters["a"], tmp_path / "adapter")
    config = json.loads((adapter / "adapter_config.json").read_text())
    config["r"] = 5  # the saved tensors have rank 2
    (adapter / "adapter_config.json").write_text(json.dumps(config))
    await admin.load("beta", letter_adapters["b"])
    status, _ = await admin.load("alpha", adapter)
    assert status == 400
    assert [m.id for m in (await client.models.list()).data] == [TINY, "beta"]
    assert await say(client, "beta") == "bbbbbb"


async def test_in_flight_request_finishes_on_the_adapter_it_started_with(
    client: openai.AsyncOpenAI, admin: Admin, letter_adapters: dict[str, Path]
) -> None:
    await admin.load("slot", letter_adapters["a"])
    stream = await client.chat.completions.create(
        model="slot", messages=HELLO, max_tokens=200, temperature=0, stream=True
    )
    text: list[str] = []
    swapped = False
    async for chunk in stream:
        text.append(chunk.choices[0].delta.content or "")
        if len(text) == 3 and not swapped:
            assert (await admin.load("slot", letter_adapters["b"], load_inplace=True))[0] == 200
            assert (await admin.unload("slot"))[0] == 200
            swapped = True
    assert swapped and "".join(text) == "a" * 200
    with pytest.raises(openai.NotFoundError):
        await say(client, "slot")


async def test_requests_during_load_all_succeed(
    client: openai.AsyncOpenAI, admin: Admin, letter_adapters: dict[str, Path]
) -> None:
    await admin.load("alpha", letter_adapters["a"])
    requests = [say(client, "alpha", 20) for _ in range(8)]
    loads = [admin.load(f"extra-{i}", letter_adapters["b"]) for i in range(4)]
    results = await asyncio.gather(*requests, *loads)
    assert results[:8] == ["a" * 20] * 8
    assert all(status == 200 for status, _ in results[8:])  # type: ignore[misc]


def test_digest_follows_the_documented_algorithm(tmp_path: Path) -> None:
    root = tmp_path / "adapter"
    (root / "sub").mkdir(parents=True)
    files = {"b.txt": b"second", "a.json": b"{}", "sub/c.safetensors": b"\x00\x01"}
    for name, data in files.items():
        (root / name).write_bytes(data)
    stream = hashlib.sha256()
    for name in sorted(files, key=lambda n: n.encode()):
        stream.update(name.encode() + b"\0" + str(len(files[name])).encode() + b"\0")
        stream.update(files[name])
    assert adapter_digest(root) == "sha256:" + stream.hexdigest()

    copy = shutil.copytree(root, tmp_path / "elsewhere")
    assert adapter_digest(copy) == adapter_digest(root)  # location does not count
    (copy / "b.txt").write_bytes(b"secone")
    assert adapter_digest(copy) != adapter_digest(root)
    (copy / "b.txt").write_bytes(b"second")
    (copy / "b.txt").rename(copy / "d.txt")
    assert adapter_digest(copy) != adapter_digest(root)  # names count


def test_digest_refuses_symlinks(tmp_path: Path) -> None:
    root = tmp_path / "adapter"
    root.mkdir()
    (root / "link").symlink_to(tmp_path)
    with pytest.raises(Exception, match="symbolic link"):
        adapter_digest(root)


async def test_the_gateways_client_tells_an_adapter_served_already_by_its_code(
    admin: Admin, letter_adapters: dict[str, Path], tmp_path: Path
) -> None:
    upstream = HTTPUpstream(
        "engine", UpstreamConfig(type="openai", base_url=admin.base_url, max_retries=0)
    )
    try:
        await upstream.load_adapter("dup", str(letter_adapters["a"]), None)
        with pytest.raises(AdapterAlreadyLoadedError):
            await upstream.load_adapter("dup", str(letter_adapters["a"]), None)
        with pytest.raises(UpstreamRejectedError) as other:  # another refusal stays itself
            await upstream.load_adapter("other", str(letter_adapters["a"]), "sha256:" + "0" * 64)
        assert not isinstance(other.value, AdapterAlreadyLoadedError)
    finally:
        await upstream.aclose()
