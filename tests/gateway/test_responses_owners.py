"""Stored Responses-API state belongs to the key that created it: another key of the same
scenario gets 404 on read, continue, input items and delete; an admin key may read and
delete any. On SQLite and PostgreSQL, through the official SDK."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import openai
import pytest

from tests.fakes.upstream import FakeUpstreamThread
from tests.gateway.harness import GatewayThread, make_settings

KEYS: list[dict[str, Any]] = [
    {"id": "alice", "key": "sk-alice", "role": "inference", "scenarios": ["support"]},
    {"id": "bob", "key": "sk-bob", "role": "inference", "scenarios": ["support"]},
    {"id": "ops", "key": "sk-ops", "role": "admin"},
]


def _refused_to(client: openai.OpenAI, response_id: str) -> None:
    """Every use of ``response_id`` by ``client`` is a 404, as for an unknown id."""
    with pytest.raises(openai.NotFoundError) as read:
        client.responses.retrieve(response_id)
    assert read.value.body == {
        "message": f"response {response_id!r} not found",
        "type": "not_found_error",
        "param": None,
        "code": 404,
    }
    with pytest.raises(openai.NotFoundError) as continued:
        client.responses.create(
            model="reef/support", previous_response_id=response_id, input="what did they say?"
        )
    assert continued.value.body["message"] == (
        f"response {response_id!r} not found in scenario 'support'"
    )
    with pytest.raises(openai.NotFoundError):
        client.responses.input_items.list(response_id)
    with pytest.raises(openai.NotFoundError):
        client.responses.delete(response_id)


def test_another_key_gets_404_and_an_admin_key_may_read_and_delete(
    tmp_path: Path, fake: FakeUpstreamThread, shared_store: dict[str, str]
) -> None:
    settings = make_settings(tmp_path, fake.base_url, store=shared_store, auth={"keys": KEYS})
    with GatewayThread(settings) as gateway:
        alice, bob, ops = (gateway.openai(key) for key in ("sk-alice", "sk-bob", "sk-ops"))
        first = alice.responses.create(model="reef/support", input="my secret plan")
        _refused_to(bob, first.id)
        # bob's refused continuation stored nothing, and alice's response is whole
        assert len(list(gateway.store.iter_export("support"))) == 1
        second = alice.responses.create(
            model="reef/support", previous_response_id=first.id, input="and then?"
        )
        assert alice.responses.retrieve(second.id).output_text == "echo: and then?"
        assert len(list(alice.responses.input_items.list(second.id))) == 3
        _refused_to(bob, second.id)
        # an admin key reads and deletes anyone's
        assert ops.responses.retrieve(first.id).output_text == "echo: my secret plan"
        assert [item.id for item in ops.responses.input_items.list(second.id)] == [
            item.id for item in alice.responses.input_items.list(second.id)
        ]
        ops.responses.delete(first.id)
        with pytest.raises(openai.NotFoundError):
            alice.responses.retrieve(first.id)
        # the owner deletes its own
        alice.responses.delete(second.id)
        with pytest.raises(openai.NotFoundError):
            ops.responses.retrieve(second.id)


def test_a_response_stored_without_keys_is_for_admin_keys_once_keys_exist(
    tmp_path: Path, fake: FakeUpstreamThread, shared_store: dict[str, str]
) -> None:
    """With no keys every caller is the one anonymous principal; what it stored has no
    key to belong to, so once keys are configured only an admin key may use it."""
    open_settings = make_settings(tmp_path / "open", fake.base_url, store=shared_store)
    with GatewayThread(open_settings) as gateway:
        anonymous = gateway.openai()
        first = anonymous.responses.create(model="reef/support", input="before keys")
        follow = anonymous.responses.create(
            model="reef/support", previous_response_id=first.id, input="still no keys"
        )
        assert anonymous.responses.retrieve(follow.id).id == follow.id
    keyed = make_settings(
        tmp_path / "keyed", fake.base_url, store=shared_store, auth={"keys": KEYS}
    )
    with GatewayThread(keyed) as gateway:
        _refused_to(gateway.openai("sk-alice"), first.id)
        ops = gateway.openai("sk-ops")
        assert ops.responses.retrieve(first.id).output_text == "echo: before keys"
        again = ops.responses.create(
            model="reef/support", previous_response_id=follow.id, input="an admin continues"
        )
        assert again.output_text == "echo: an admin continues"
