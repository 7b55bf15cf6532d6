"""``POST /v1/completions`` (legacy text completions) through the official OpenAI SDK:
relayed to an OpenAI-compatible upstream, plain and streamed, recorded with its receipt
like a chat completion; refused (501, not recorded) for an Anthropic upstream."""

from __future__ import annotations

from pathlib import Path

import openai
import pytest

from reef.experience import RecordFilter, canonical_exchange
from reef.releases import ReleaseChain
from tests.fakes.upstream import FakeUpstreamThread
from tests.gateway.harness import GatewayThread, make_settings


def _recorded(gateway: GatewayThread, scenario: str) -> int:
    return len(gateway.store.list_records(scenario, RecordFilter(), None, 100).records)


def test_a_completion_is_relayed_and_recorded_with_its_receipt(
    gateway: GatewayThread, fake: FakeUpstreamThread
) -> None:
    raw = gateway.openai().completions.with_raw_response.create(
        model="reef/support", prompt="Once upon a time", max_tokens=8, temperature=0.5
    )
    completion = raw.parse()
    assert completion.object == "text_completion"
    assert completion.choices[0].text == "echo: Once upon a time"
    assert fake.last_request_path == "/v1/completions"
    assert fake.last_request_body["model"] == "fake-model"  # the scenario's model
    assert fake.last_request_body["prompt"] == "Once upon a time"
    record = gateway.store.get_record(raw.headers["x-reef-record-id"])
    assert record.api == "openai.completions"
    assert record.status == "ok" and record.scenario == "support"
    assert record.session_id == raw.headers["x-reef-session-id"]
    head = ReleaseChain(gateway.database).head("support")
    assert head is not None and raw.headers["x-reef-release-id"] == head.id == record.release_id
    assert record.request["prompt"] == "Once upon a time"
    assert record.request["model"] == "reef/support"  # as the client sent it
    assert record.response is not None
    assert record.response["choices"][0]["text"] == "echo: Once upon a time"
    assert completion.usage is not None and record.usage is not None
    assert record.usage["total_tokens"] == completion.usage.total_tokens
    exchange = canonical_exchange(record)  # what selection, learners and export read
    assert exchange.messages == [{"role": "user", "content": "Once upon a time"}]
    assert exchange.reply == {"role": "assistant", "content": "echo: Once upon a time"}


def test_a_streamed_completion_is_relayed_and_recorded_whole(gateway: GatewayThread) -> None:
    client = gateway.openai()
    with client.completions.with_streaming_response.create(
        model="reef/support", prompt="tell a story", stream=True
    ) as response:
        record_id = response.headers["x-reef-record-id"]
        chunks = list(response.parse())
    text = "".join(chunk.choices[0].text for chunk in chunks if chunk.choices)
    assert text == "echo: tell a story"
    assert chunks[-1].choices[0].finish_reason == "stop"
    assert all(chunk.usage is None for chunk in chunks)  # asked for by Reef, not the client
    record = gateway.store.get_record(record_id)
    assert record.api == "openai.completions" and record.status == "ok"
    assert record.response is not None
    assert record.response["object"] == "text_completion"
    assert record.response["choices"][0]["text"] == "echo: tell a story"
    assert record.response["choices"][0]["finish_reason"] == "stop"
    assert record.usage is not None and record.usage["completion_tokens"] == 4
    assert canonical_exchange(record).reply == {
        "role": "assistant",
        "content": "echo: tell a story",
    }


@pytest.mark.parametrize("stream", [False, True])
def test_an_echoed_prompt_is_not_part_of_the_recorded_reply(
    gateway: GatewayThread, stream: bool
) -> None:
    client = gateway.openai()
    with client.completions.with_streaming_response.create(
        model="reef/support", prompt="Say:", echo=True, stream=stream
    ) as response:
        record_id = response.headers["x-reef-record-id"]
        if stream:
            text = "".join(c.choices[0].text for c in response.parse() if c.choices)
        else:
            text = response.parse().choices[0].text
    assert text == "Say:echo: Say:"  # the client gets what the upstream sent
    record = gateway.store.get_record(record_id)
    assert record.response is not None
    assert canonical_exchange(record).reply == {"role": "assistant", "content": "echo: Say:"}


def test_a_client_that_asks_for_usage_gets_it_in_the_stream(gateway: GatewayThread) -> None:
    stream = gateway.openai().completions.create(
        model="reef/support",
        prompt="count me",
        stream=True,
        stream_options={"include_usage": True},
    )
    usages = [chunk.usage for chunk in stream if chunk.usage is not None]
    assert len(usages) == 1 and usages[0].total_tokens == 5  # words: 2 + 3


def test_an_idempotent_retry_of_a_stream_replays_the_same_text(gateway: GatewayThread) -> None:
    client = gateway.openai(**{"x-reef-idempotency-key": "story-1"})
    texts, receipts = [], []
    for _ in range(2):
        with client.completions.with_streaming_response.create(
            model="reef/support", prompt="retry me", stream=True
        ) as response:
            receipts.append(response.headers["x-reef-record-id"])
            texts.append("".join(c.choices[0].text for c in response.parse() if c.choices))
    assert texts == ["echo: retry me"] * 2
    assert receipts[0] == receipts[1]
    assert _recorded(gateway, "support") == 1


def test_an_anthropic_upstream_has_no_completions_and_says_so(
    gateway: GatewayThread, fake: FakeUpstreamThread
) -> None:
    before = fake.requests_received("/v1/completions") + fake.requests_received("/v1/messages")
    with pytest.raises(openai.APIStatusError) as info:
        gateway.openai().completions.create(model="reef/claude", prompt="hello")
    assert info.value.status_code == 501
    body = info.value.body
    assert isinstance(body, dict)
    assert body["type"] == "not_implemented_error"  # the SDK unwraps {"error": ...}
    assert "Anthropic upstream 'claude'" in body["message"], body["message"]
    assert "/v1/completions" in body["message"]
    assert "x-reef-record-id" not in info.value.response.headers
    after = fake.requests_received("/v1/completions") + fake.requests_received("/v1/messages")
    assert after == before
    assert _recorded(gateway, "claude") == 0


def test_a_prompt_of_the_wrong_type_is_a_400_naming_it(gateway: GatewayThread) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        gateway.openai().completions.create(model="reef/support", prompt=[[1, "x"]])  # type: ignore[list-item]
    assert "prompt[0]" in str(info.value)
    assert _recorded(gateway, "support") == 0


def test_an_upstream_answering_501_is_relayed_and_not_recorded(
    gateway: GatewayThread, fake: FakeUpstreamThread
) -> None:
    before = fake.requests_received("/v1/completions")
    with pytest.raises(openai.APIStatusError) as info:
        gateway.openai().completions.create(model="reef/support", prompt="fail-501 now")
    assert info.value.status_code == 501
    assert "upstream 'fake' does not implement POST /completions" in info.value.message
    assert fake.requests_received("/v1/completions") == before + 1  # never retried
    assert "x-reef-record-id" not in info.value.response.headers
    assert _recorded(gateway, "support") == 0


def test_the_embedded_engine_continues_the_prompt_and_it_is_recorded(tmp_path: Path) -> None:
    """On the tiny model: the answer through Reef equals the engine's own greedy
    continuation, and the record holds it."""
    pytest.importorskip("torch")
    from reef.engine.models import load_model
    from reef.engine.runtime import Engine
    from reef.engine.server import BackgroundServer

    engine = BackgroundServer(Engine(load_model("tiny-random", tmp_path), threads=1)).start()
    try:
        direct = openai.OpenAI(base_url=engine.base_url, api_key="none", max_retries=0)
        expected = direct.completions.create(
            model="tiny-random", prompt="Once upon a time", max_tokens=6, temperature=0
        )
        direct.close()
        settings = make_settings(
            tmp_path,
            engine.base_url,
            upstreams={
                "engine": {"type": "openai", "base_url": engine.base_url, "model": "tiny-random"}
            },
            scenarios={"tiny": {"upstream": "engine"}},
        )
        with GatewayThread(settings) as gateway:
            client = gateway.openai()
            raw = client.completions.with_raw_response.create(
                model="reef/tiny", prompt="Once upon a time", max_tokens=6, temperature=0
            )
            text = raw.parse().choices[0].text
            assert text == expected.choices[0].text
            record = gateway.store.get_record(raw.headers["x-reef-record-id"])
            assert record.api == "openai.completions" and record.status == "ok"
            assert canonical_exchange(record).reply == {"role": "assistant", "content": text}
            streamed = client.completions.create(
                model="reef/tiny",
                prompt="Once upon a time",
                max_tokens=6,
                temperature=0,
                stream=True,
            )
            assert "".join(c.choices[0].text for c in streamed if c.choices) == text
            assert _recorded(gateway, "tiny") == 2
    finally:
        engine.stop()
