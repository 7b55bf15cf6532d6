"""Every receipt a client ever receives names a stored record.

A property over random workloads: concurrent streams and non-streams through both
official SDKs (OpenAI; Anthropic on the Anthropic fake and translated onto the
OpenAI-compatible one), without keys, with keys, and with one key repeated by many
clients at once. Whatever interleaves, each receipt resolves through the store to an ok
record holding exactly the answer its client got; all requests under one key share one
receipt; and the upstream is called once per key and once per request without one.
"""

from __future__ import annotations

import random
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import pytest

from tests.fakes.upstream import FakeUpstreamThread
from tests.gateway.harness import GatewayThread
from tests.gateway.sdk_calls import Reply, turn

PATHS = ("/v1/chat/completions", "/v1/messages")
ROUTES = [("openai", "support"), ("anthropic", "claude"), ("anthropic", "support")]
REQUESTS = 96
CLIENTS = 24


@dataclass(frozen=True)
class Request:
    dialect: str
    scenario: str
    stream: bool
    text: str
    key: str | None


def workload(seed: int) -> list[Request]:
    """Requests in random order: about a third without a key, the rest spread over a
    few keys, each key always naming the same request (route, stream or not, text)."""
    rng = random.Random(seed)
    keyed = []
    for number in range(rng.randint(4, 10)):
        dialect, scenario = rng.choice(ROUTES)
        keyed.append(
            Request(dialect, scenario, rng.random() < 0.5, f"keyed {number}", f"k{number}")
        )
    requests = []
    for number in range(REQUESTS):
        if rng.random() < 0.35:
            dialect, scenario = rng.choice(ROUTES)
            requests.append(Request(dialect, scenario, rng.random() < 0.5, f"free {number}", None))
        else:
            requests.append(rng.choice(keyed))
    return requests


def record_text(record_response: dict[str, object], dialect: str) -> str:
    if dialect == "openai":
        choices: list[dict[str, dict[str, str]]] = record_response["choices"]  # type: ignore[assignment]
        return choices[0]["message"]["content"]
    blocks: list[dict[str, str]] = record_response["content"]  # type: ignore[assignment]
    return "".join(block["text"] for block in blocks if block["type"] == "text")


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_every_receipt_names_a_stored_record(
    gateway: GatewayThread, fake: FakeUpstreamThread, seed: int
) -> None:
    fake.reset()
    clients = {"openai": gateway.openai(), "anthropic": gateway.anthropic()}
    requests = workload(seed)

    def send(request: Request) -> Reply:
        headers = {"x-reef-scenario": request.scenario}
        if request.key is not None:
            headers["x-reef-idempotency-key"] = f"{seed}-{request.key}"
        return turn(clients[request.dialect], request.text, stream=request.stream, headers=headers)

    with ThreadPoolExecutor(CLIENTS) as pool:
        replies = list(pool.map(send, requests))

    by_key: dict[str, set[str | None]] = defaultdict(set)
    for request, reply in zip(requests, replies, strict=True):
        assert reply.status == 200, (request, reply)
        assert reply.receipt is not None and request.text in reply.text
        record = gateway.store.get_record(reply.receipt)  # raises if it names nothing
        assert record.status == "ok" and record.scenario == request.scenario
        assert record.response is not None
        assert record_text(record.response, request.dialect) == reply.text
        if request.key is not None:
            by_key[request.key].add(reply.receipt)
    assert all(len(receipts) == 1 for receipts in by_key.values()), by_key
    unkeyed = sum(1 for request in requests if request.key is None)
    assert sum(fake.requests_received(path) for path in PATHS) == unkeyed + len(by_key)
