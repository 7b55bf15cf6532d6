"""Two gateways on one store against one budget (``budgets.ledger: store``), 32 clients
at once: the window's spend ends within the documented bound, ``limit + R`` (``R`` the
largest reservation; ``reef.gateway.budgets``), and the ledger settles to the records'
costs. (It may end under the limit: a refusal counts the reservations in flight.)"""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import openai
import pytest

from reef.config.spend import BudgetLimit
from reef.core.prices import Price, Tokens
from reef.experience import Line, StoreLedger, window_start
from reef.gateway.budgets import BYTES_PER_TOKEN
from tests.fakes.upstream import FakeUpstreamThread
from tests.gateway.harness import GatewayThread, make_settings

LIMIT = 300.0
MAX_TOKENS = 8
CLIENTS = 32
PRICE = Price("fake-model", input_per_mtok=1e6, output_per_mtok=2e6)  # $1 and $2 a token
MAX_REQUEST_BYTES = 400  # the upstream body of the requests below is shorter


def settings(tmp_path: Path, store: dict[str, str], fake: FakeUpstreamThread) -> Any:
    upstream = {
        "type": "openai",
        "base_url": fake.base_url,
        "model": "fake-model",
        "prices": {"fake-model": {"input_per_mtok": 1e6, "output_per_mtok": 2e6}},
        "read_timeout_seconds": 5,
        "total_timeout_seconds": 10,
    }
    return make_settings(
        tmp_path,
        fake.base_url,
        store=store,
        upstreams={"fake": upstream},
        scenarios={"support": {"upstream": "fake"}},
        budgets={"ledger": "store", "global": [{"window": "month", "money": LIMIT}]},
    )


def test_two_gateways_overshoot_one_budget_by_at_most_one_reservation(
    tmp_path: Path, shared_store: dict[str, str], fake: FakeUpstreamThread
) -> None:
    with (
        GatewayThread(settings(tmp_path / "a", shared_store, fake)) as first,
        GatewayThread(settings(tmp_path / "b", shared_store, fake)) as second,
    ):
        clients = [first.openai(), second.openai()]
        record_ids: list[str] = []
        refusals: list[int] = []
        errors: list[BaseException] = []
        lock = threading.Lock()

        def client(number: int) -> None:
            api = clients[number % 2]
            for turn in range(100):
                try:
                    raw = api.chat.completions.with_raw_response.create(
                        model="reef/support",
                        max_tokens=MAX_TOKENS,
                        messages=[{"role": "user", "content": f"client {number} turn {turn}"}],
                    )
                except openai.APIStatusError as exc:
                    with lock:
                        refusals.append(exc.status_code)
                    return
                except BaseException as exc:
                    with lock:
                        errors.append(exc)
                    return
                with lock:
                    record_ids.append(raw.headers["x-reef-record-id"])

        threads = [threading.Thread(target=client, args=(n,)) for n in range(CLIENTS)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=120)
        assert not errors
        assert refusals == [402] * CLIENTS  # every client ran until the budget refused it
        costs = [first.store.get_record(record_id).cost for record_id in record_ids]
        assert all(cost is not None and cost > 0 for cost in costs)
        spent = sum(cost for cost in costs if cost is not None)
        # the largest reservation any of these requests can take
        largest = PRICE.cost(Tokens(MAX_REQUEST_BYTES // BYTES_PER_TOKEN + 1, 0, MAX_TOKENS))
        assert spent <= LIMIT + largest  # the overshoot bound
        # refused while the reservations of the requests in flight filled the rest
        assert spent >= LIMIT - (CLIENTS - 1) * largest
        # what both gateways counted is what the records cost (reservations settled)
        limit = BudgetLimit(window="month", money=LIMIT)
        line = Line("global", limit, window_start("month", first.app.state.reef.spend.clock()))
        _, counted = asyncio.run(StoreLedger(first.database).spent(line))
        assert counted == pytest.approx(spent)
