"""Admin reads, redaction, async durability, and the ops endpoints."""

from __future__ import annotations

from tests.gateway.harness import GatewayThread
from tests.gateway.rawhttp import call


def ask(gateway: GatewayThread, text: str, **headers: str) -> str:
    raw = gateway.openai(**headers).chat.completions.with_raw_response.create(
        model="reef/support", messages=[{"role": "user", "content": text}]
    )
    return raw.headers["x-reef-record-id"]


def test_records_page_with_cursor_and_filters(gateway: GatewayThread) -> None:
    ids = [ask(gateway, f"question {i}") for i in range(5)]
    call(gateway.port, "POST", "/reef/feedback", {"record_ids": [ids[1]], "score": 0.9})
    call(gateway.port, "POST", "/reef/feedback", {"record_ids": [ids[3]], "score": 0.1})

    seen: list[str] = []
    cursor = None
    while True:
        query = "?limit=2" + (f"&cursor={cursor}" if cursor else "")
        page = call(gateway.port, "GET", f"/reef/scenarios/support/records{query}").json()
        seen += [r["id"] for r in page["data"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert seen == list(reversed(ids))

    with_feedback = call(
        gateway.port, "GET", "/reef/scenarios/support/records?has_feedback=true"
    ).json()["data"]
    assert {r["id"] for r in with_feedback} == {ids[1], ids[3]}
    good = call(gateway.port, "GET", "/reef/scenarios/support/records?min_score=0.5").json()["data"]
    assert [r["id"] for r in good] == [ids[1]]
    bad = call(gateway.port, "GET", "/reef/scenarios/support/records?limit=0")
    assert bad.status == 400
    bad = call(gateway.port, "GET", "/reef/scenarios/support/records?has_feedback=maybe")
    assert bad.status == 400 and "has_feedback" in bad.json()["error"]["message"]


def test_session_endpoint_and_missing_things(gateway: GatewayThread) -> None:
    first = ask(gateway, "one", **{"x-reef-session": "s-1"})
    second = ask(gateway, "two", **{"x-reef-session": "s-1"})
    session = call(gateway.port, "GET", "/reef/scenarios/support/sessions/s-1").json()
    assert [t["id"] for t in session["turns"]] == [first, second]
    assert call(gateway.port, "GET", "/reef/scenarios/support/sessions/nope").status == 404
    missing = call(gateway.port, "GET", "/reef/records/not-a-record")
    assert missing.status == 404 and "not-a-record" in missing.json()["error"]["message"]


def test_redaction_runs_before_the_write(make_gateway) -> None:  # type: ignore[no-untyped-def]
    gateway = make_gateway(capture={"redact_patterns": [r"\b\d{4}-\d{4}-\d{4}-\d{4}\b"]})
    record_id = ask(gateway, "my card is 1234-5678-9012-3456")
    record = gateway.store.get_record(record_id)
    assert "1234-5678" not in str(record.request)
    assert "[REDACTED]" in record.request["messages"][0]["content"]
    assert record.response is not None and "1234-5678" not in str(record.response)


def test_async_durability_records_everything_by_shutdown(make_gateway) -> None:  # type: ignore[no-untyped-def]
    gateway = make_gateway(store={"url": None, "durability": "async"})
    ids = [ask(gateway, f"async {i}") for i in range(20)]
    gateway.__exit__(None, None, None)  # a clean stop drains the queue
    from reef.experience import open_store

    store = open_store(gateway.settings.store_url())
    try:
        assert all(store.get_record(i).status == "ok" for i in ids)
    finally:
        store.close()


def test_health_ready_and_metrics(gateway: GatewayThread) -> None:
    assert call(gateway.port, "GET", "/healthz").json() == {"status": "ok"}
    ready = call(gateway.port, "GET", "/readyz")
    assert ready.status == 200, ready.body
    assert ready.json()["checks"]["store"] == "ok"
    ask(gateway, "count me")
    metrics = call(gateway.port, "GET", "/metrics").body.decode()
    assert 'reef_requests_total{route="/v1/chat/completions",status="200"}' in metrics
    assert "reef_records_written_total" in metrics
    assert "reef_capture_queue_depth" in metrics
    assert "reef_request_duration_seconds_bucket" in metrics


def test_readyz_reports_an_unreachable_upstream(make_gateway) -> None:  # type: ignore[no-untyped-def]
    gateway = make_gateway(
        upstreams={
            "down": {"type": "openai", "base_url": "http://127.0.0.1:9/v1", "max_retries": 0}
        },
        scenarios={},
    )
    ready = call(gateway.port, "GET", "/readyz")
    assert ready.status == 503
    assert ready.json()["checks"]["upstream:down"] != "ok"
