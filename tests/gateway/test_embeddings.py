"""``POST /v1/embeddings`` through the official OpenAI SDK: relayed to an OpenAI-compatible
upstream under the client's model name and recorded without the vectors (unless
``capture.embedding_vectors: keep``); refused (501, not recorded) for an Anthropic
upstream."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import openai
import pytest

from reef.experience import RecordFilter, canonical_exchange
from tests.fakes.upstream import FakeUpstreamThread, embedding_vector
from tests.gateway.harness import GatewayThread, make_settings


def _records(gateway: GatewayThread, scenario: str) -> int:
    return len(gateway.store.list_records(scenario, RecordFilter(), None, 100).records)


def test_embeddings_are_relayed_and_recorded_without_the_vectors(
    gateway: GatewayThread, fake: FakeUpstreamThread
) -> None:
    raw = gateway.openai(**{"x-reef-scenario": "support"}).embeddings.with_raw_response.create(
        model="text-embedding-3-small", input="hello world"
    )
    answer = raw.parse()
    assert answer.data[0].embedding == pytest.approx(embedding_vector("hello world", 8))
    assert fake.last_request_path == "/v1/embeddings"
    assert fake.last_request_body["model"] == "text-embedding-3-small"  # the client's own
    assert fake.last_request_body["encoding_format"] == "base64"  # the SDK's default
    record = gateway.store.get_record(raw.headers["x-reef-record-id"])
    assert record.api == "openai.embeddings" and record.status == "ok"
    assert record.scenario == "support"
    assert record.request["input"] == "hello world"
    assert record.response == {
        "object": "list",
        "model": "text-embedding-3-small",
        "data": [{"object": "embedding", "index": 0, "dimensions": 8}],
        "usage": {"prompt_tokens": 2, "total_tokens": 2},
        "vectors": "omitted",
    }
    assert record.usage == {"prompt_tokens": 2, "total_tokens": 2}
    exchange = canonical_exchange(record)
    assert exchange.messages == [{"role": "user", "content": "hello world"}]
    assert exchange.reply is None  # nothing to learn from


def test_several_float_inputs_and_the_scenario_model(
    gateway: GatewayThread, fake: FakeUpstreamThread
) -> None:
    raw = gateway.openai().embeddings.with_raw_response.create(
        model="reef/support", input=["one", "two"], encoding_format="float", dimensions=4
    )
    assert [item.embedding for item in raw.parse().data] == [
        pytest.approx(embedding_vector(text, 4)) for text in ("one", "two")
    ]
    assert fake.last_request_body["model"] == "fake-model"  # reef/<scenario>: its model
    record = gateway.store.get_record(raw.headers["x-reef-record-id"])
    assert record.response is not None
    assert [item["dimensions"] for item in record.response["data"]] == [4, 4]
    assert canonical_exchange(record).messages == [{"role": "user", "content": "one\ntwo"}]


def test_vectors_are_kept_when_configured_and_then_replayed_by_key(
    make_gateway: Callable[..., GatewayThread], fake: FakeUpstreamThread
) -> None:
    gateway = make_gateway(capture={"embedding_vectors": "keep"})
    client = gateway.openai(**{"x-reef-idempotency-key": "embed-1"})
    before = fake.requests_received("/v1/embeddings")
    raws = [
        client.embeddings.with_raw_response.create(
            model="reef/support", input="keep me", encoding_format="float"
        )
        for _ in range(2)
    ]
    assert fake.requests_received("/v1/embeddings") == before + 1  # the retry is replayed
    assert raws[0].headers["x-reef-record-id"] == raws[1].headers["x-reef-record-id"]
    assert raws[0].parse().data[0].embedding == raws[1].parse().data[0].embedding
    record = gateway.store.get_record(raws[0].headers["x-reef-record-id"])
    assert record.response is not None and "vectors" not in record.response
    assert record.response["data"][0]["embedding"] == pytest.approx(embedding_vector("keep me", 8))


def test_without_vectors_a_retry_by_key_is_answered_afresh(
    gateway: GatewayThread, fake: FakeUpstreamThread
) -> None:
    client = gateway.openai(**{"x-reef-idempotency-key": "embed-2"})
    before = fake.requests_received("/v1/embeddings")
    answers = [
        client.embeddings.create(model="reef/support", input="again").data[0].embedding
        for _ in range(2)
    ]
    assert answers[0] == answers[1]
    assert fake.requests_received("/v1/embeddings") == before + 2
    assert _records(gateway, "support") == 2


def test_an_anthropic_upstream_has_no_embeddings_and_says_so(
    gateway: GatewayThread, fake: FakeUpstreamThread
) -> None:
    before = fake.requests_received("/v1/embeddings")
    with pytest.raises(openai.APIStatusError) as info:
        gateway.openai().embeddings.create(model="reef/claude", input="hello")
    assert info.value.status_code == 501
    assert "Anthropic upstream 'claude'" in info.value.message
    assert "/v1/embeddings" in info.value.message
    assert fake.requests_received("/v1/embeddings") == before
    assert _records(gateway, "claude") == 0


def test_the_embedded_engine_has_no_embeddings_and_nothing_is_recorded(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    from reef.engine.models import load_model
    from reef.engine.runtime import Engine
    from reef.engine.server import BackgroundServer

    engine = BackgroundServer(Engine(load_model("tiny-random", tmp_path), threads=1)).start()
    try:
        settings = make_settings(
            tmp_path,
            engine.base_url,
            upstreams={
                "engine": {"type": "openai", "base_url": engine.base_url, "model": "tiny-random"}
            },
            scenarios={"tiny": {"upstream": "engine"}},
        )
        with GatewayThread(settings) as gateway:
            with pytest.raises(openai.APIStatusError) as info:
                gateway.openai().embeddings.create(model="reef/tiny", input="hello")
            assert info.value.status_code == 501
            assert "upstream 'engine' does not implement POST /embeddings" in info.value.message
            assert "not an embedding model" in info.value.message
            assert _records(gateway, "tiny") == 0
    finally:
        engine.stop()
