"""``bench/wrk_load.py``, the overhead benchmark's wrk loader: reading what its Lua
``done()`` prints (wrk's latency correction taken out), and a real wrk round against a
loopback server whose own counts the loader's must equal.

The real round needs Debian's ``wrk``; without it that test is skipped, except where
``REEF_TEST_REQUIRE_WRK=1`` (``.ci/run``), where it fails instead."""

from __future__ import annotations

import json
import os
import shutil
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from types import ModuleType

import pytest
from aiohttp import web

from tests.bench.scripts import bench_module

# Captured from wrk 4.1.0 (Debian) running the loader's script, -c2 -d1s, against a
# server that took 300 ms over its 20th answer: wrk's histogram holds 68 samples for
# the 60 answers it counted.
SAMPLE = Path(__file__).with_name("wrk_sample.txt")


@pytest.fixture(scope="module")
def wrk_load() -> ModuleType:
    return bench_module("wrk_load")


def wrk_stats_correct(histogram: dict[int, int], expected: int) -> dict[int, int]:
    """wrk 4.1.0's ``stats_correct`` (src/stats.c), line for line, on a dict."""
    data = dict(histogram)
    top = max(data)
    for n in range(expected * 2, top + 1):
        count = data.get(n, 0)
        m = n - expected
        while count and m > expected:
            data[m] = data.get(m, 0) + count
            m -= expected
    return data


def test_the_captured_summary_gives_one_latency_per_answer(wrk_load: ModuleType) -> None:
    text = SAMPLE.read_text()
    line = next(x for x in text.splitlines() if x.startswith(wrk_load.MARK))
    raw = json.loads(line[len(wrk_load.MARK) :])
    assert sum(count for _, count in raw["latency_us"]) == 68  # wrk's additions in it

    done = wrk_load.parse_output(text, connections=2)

    assert sum(done.latency_us.values()) == raw["wrk_requests"] == 60
    assert (done.sent, done.answered, done.ok, done.receipted) == (60, 60, 60, 60)
    assert max(done.latency_us) == 301178  # the slow answer, once
    assert done.seconds == pytest.approx((raw["last_us"] - raw["first_us"]) / 1e6)
    assert done.socket_errors == {}
    result = done.to_result("reef", 2)
    assert len(result.latencies_ms) == 60 and result.errors == []
    assert result.receipt_count == 60 and len(result.receipts) == 6
    assert result.percentile(1.0) == pytest.approx(301.178)


def test_uncorrected_undoes_wrks_correction_exactly(wrk_load: ModuleType) -> None:
    measured = {900: 50, 1000: 40, 1750: 3, 4100: 2, 9000: 1, 9350: 1, 12333: 1}
    duration_us, requests, connections = 80_000, 97, 4
    expected = duration_us // (requests // connections)  # 3333 µs, as wrk computes it
    corrected = wrk_stats_correct(measured, expected)
    assert sum(corrected.values()) > sum(measured.values())
    assert corrected[9000] == 2  # 12333's addition lands on a measured value

    back = wrk_load.uncorrected(corrected, connections, duration_us, requests)

    assert back == measured


def test_a_histogram_that_does_not_add_up_is_refused(wrk_load: ModuleType) -> None:
    text = SAMPLE.read_text().replace('"wrk_requests":60', '"wrk_requests":61')
    with pytest.raises(ValueError, match="61 answers"):
        wrk_load.parse_output(text, connections=2)
    with pytest.raises(ValueError, match="no summary line"):
        wrk_load.parse_output("Running 1s test @ http://127.0.0.1:1/\n", connections=2)


def test_lua_strings_escape_quotes_and_bytes(wrk_load: ModuleType) -> None:
    assert wrk_load.lua_string('say "hi"\\\n') == '"say \\034hi\\034\\092\\010"'
    assert wrk_load.lua_string("é") == '"\\195\\169"'


@pytest.fixture
async def loopback() -> AsyncIterator[tuple[str, list[bytes], list[str], list[str]]]:
    """A chat completions route that answers at once with a fresh receipt; yields its
    URL, the bodies it received, the receipts it gave and the User-Agents it saw."""
    bodies: list[bytes] = []
    receipts: list[str] = []
    agents: list[str] = []

    async def answer(request: web.Request) -> web.Response:
        bodies.append(await request.read())
        agents.append(request.headers.get("User-Agent", ""))
        receipts.append(str(uuid.uuid4()))
        return web.json_response({"ok": True}, headers={"x-reef-record-id": receipts[-1]})

    app = web.Application()
    app.router.add_post("/v1/chat/completions", answer)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    yield f"http://127.0.0.1:{port}/v1/chat/completions", bodies, receipts, agents
    await runner.cleanup()


async def test_a_wrk_round_counts_what_the_server_received(
    wrk_load: ModuleType, loopback: tuple[str, list[bytes], list[str], list[str]]
) -> None:
    if shutil.which("wrk") is None:
        if os.environ.get("REEF_TEST_REQUIRE_WRK") == "1":
            pytest.fail("REEF_TEST_REQUIRE_WRK=1 but wrk is not on PATH")
        pytest.skip("wrk is not on PATH (apt-get install wrk)")
    from load import CHAT_BODY, sdk_headers

    url, bodies, receipts, agents = loopback
    headers = sdk_headers("sk-test")
    result = await wrk_load.drive_wrk(url, headers, 4, 0.5, CHAT_BODY, "reef", threads=2)

    assert result.errors == []
    assert result.requests_sent == len(bodies) == len(result.latencies_ms) > 0
    assert result.receipt_count == len(receipts)
    assert result.receipts and set(result.receipts) <= set(receipts)
    assert len(set(bodies)) == len(bodies)  # the counter differs per request
    sent = [json.loads(body) for body in bodies]  # Content-Length right for every one
    assert {body["model"] for body in sent} == {"fake-model"}
    assert all(b["messages"][1]["content"].startswith("Say hello to request ") for b in sent)
    assert set(agents) == {headers["User-Agent"]}
    assert result.seconds > 0


def test_a_timed_warm_up_is_a_share_of_the_round_and_never_a_sliver(
    wrk_load: ModuleType,
) -> None:
    assert wrk_load.warmup_seconds(200, 2000, 10.0) == 1.0
    assert wrk_load.warmup_seconds(2000, 2000, None) == 2.0  # --warmup in ms
    assert wrk_load.warmup_seconds(50, 2000, 10.0) == 0.5
    assert wrk_load.warmup_seconds(0, 2000, 10.0) == 0.0
