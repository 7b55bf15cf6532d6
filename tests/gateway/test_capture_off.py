"""``x-reef-capture: off`` (and a scenario with ``capture: false``) persists nothing: no
record, no stored response, no session, no scenario row, no file. A Responses request
that asks for ``store: true`` then is refused with the reason. On SQLite and PostgreSQL,
through the official SDKs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import openai
import pytest
from sqlalchemy import func, inspect, select, table

from tests.fakes.upstream import FakeUpstreamThread
from tests.gateway.harness import GatewayThread, make_settings

OFF = {"x-reef-capture": "off"}
SCENARIOS = {
    "support": {"upstream": "fake"},
    "claude": {"upstream": "claude"},
    "quiet": {"upstream": "fake", "capture": False},
}


def _rows(gateway: GatewayThread) -> dict[str, int]:
    """The row count of every table in the store (not only the ones Reef's schema
    names)."""
    engine = gateway.database.engine
    names = inspect(engine).get_table_names()
    with engine.connect() as conn:
        return {
            name: int(conn.scalar(select(func.count()).select_from(table(name))) or 0)
            for name in names
        }


def _files(root: Path) -> dict[str, int]:
    """Every file under ``root`` (the gateway's home and, on SQLite, its database) with
    its size."""
    return {
        str(path.relative_to(root)): path.stat().st_size
        for path in sorted(root.rglob("*"))
        if path.is_file()
    }


def _uncaptured_traffic(gateway: GatewayThread, kept_id: str) -> None:
    """One call of each inference route with capture off, Responses state included."""
    client = gateway.openai(**OFF)
    chat = [{"role": "user", "content": "off the record"}]
    client.chat.completions.create(model="reef/support", messages=chat)  # type: ignore[arg-type]
    streamed = client.chat.completions.create(
        model="reef/support",
        messages=chat,  # type: ignore[arg-type]
        stream=True,
    )
    assert "".join(c.choices[0].delta.content or "" for c in streamed if c.choices)
    client.completions.create(model="reef/support", prompt="off the record")
    client.embeddings.create(model="reef/support", input="off the record")
    gateway.anthropic(**OFF).messages.create(
        model="reef/claude", max_tokens=20, messages=[{"role": "user", "content": "off"}]
    )
    answer = client.responses.create(model="reef/support", input="not kept")
    assert answer.store is False  # without store, an uncaptured response is not kept
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(answer.id)
    events = list(client.responses.create(model="reef/support", input="streamed", stream=True))
    assert events[-1].type == "response.completed"
    assert events[-1].response.store is False
    # continuing a captured response reads it, and keeps nothing of the new turn
    follow = client.responses.create(
        model="reef/support", previous_response_id=kept_id, input="off from here"
    )
    assert follow.output_text == "echo: off from here"
    client.responses.create(model="reef/support", input="explicitly not kept", store=False)
    # a scenario that captures nothing keeps no Responses state either
    quiet = gateway.openai()
    quiet.chat.completions.create(model="reef/quiet", messages=chat)  # type: ignore[arg-type]
    assert quiet.responses.create(model="reef/quiet", input="quiet").store is False


def test_capture_off_leaves_no_row_or_file_behind(
    tmp_path: Path, fake: FakeUpstreamThread, shared_store: dict[str, str]
) -> None:
    settings = make_settings(tmp_path, fake.base_url, store=shared_store, scenarios=SCENARIOS)
    with GatewayThread(settings) as gateway:
        kept = gateway.openai().responses.create(model="reef/support", input="kept")
        rows, files = _rows(gateway), _files(tmp_path)
        assert rows["records"] == 1 and rows["responses"] == 1

        _uncaptured_traffic(gateway, kept.id)

        assert _rows(gateway) == rows
        assert _files(tmp_path) == files
        # the counts can move: one captured call adds its record and its response
        gateway.openai().responses.create(model="reef/support", input="captured")
        after = _rows(gateway)
        assert (after["records"], after["responses"]) == (2, 2)


def test_store_true_with_capture_off_is_refused_with_the_reason(make_gateway: Any) -> None:
    gateway = make_gateway(scenarios=SCENARIOS)
    before = gateway.writer_stats.written_total
    for headers, scenario in ((OFF, "support"), ({}, "quiet")):
        client = gateway.openai(**headers)
        with pytest.raises(openai.BadRequestError) as info:
            client.responses.create(model=f"reef/{scenario}", input="keep me", store=True)
        body: Any = info.value.body
        assert body["param"] == "store"
        assert "capture is off" in body["message"]
        assert f"scenarios.{scenario}.capture" in body["message"]
        assert "store: false" in body["message"]
    assert gateway.writer_stats.written_total == before


def test_a_native_responses_upstream_is_asked_not_to_store_either(
    make_gateway: Any, fake: FakeUpstreamThread
) -> None:
    upstream = {
        "type": "openai",
        "base_url": fake.base_url,
        "model": "fake-model",
        "responses": "native",
        "read_timeout_seconds": 2,
        "total_timeout_seconds": 5,
    }
    gateway = make_gateway(upstreams={"native": upstream}, scenarios={"agent": {}})
    gateway.openai().responses.create(model="reef/agent", input="captured")
    assert "store" not in fake.last_request_body  # passed through as the client sent it
    answer = gateway.openai(**OFF).responses.create(model="reef/agent", input="not kept")
    assert fake.last_request_path == "/v1/responses"
    assert fake.last_request_body["store"] is False
    with pytest.raises(openai.NotFoundError):
        gateway.openai().responses.retrieve(answer.id)
