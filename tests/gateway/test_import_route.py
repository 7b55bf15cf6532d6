"""``POST /reef/scenarios/{scenario}/import``: a JSON Lines upload streamed into the
import loop, over real HTTP (chunked, split mid-line) against a real gateway."""

from __future__ import annotations

import http.client
import json
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from tests.gateway.harness import GatewayThread
from tests.gateway.rawhttp import RawResponse, call

DATA = Path(__file__).resolve().parents[1] / "data" / "import"
FINETUNE = (DATA / "openai-finetune.jsonl").read_bytes()
CHAT = (DATA / "openai-chat.jsonl").read_bytes()
NDJSON = {"content-type": "application/x-ndjson"}


def upload_chunks(
    port: int, path: str, chunks: Iterable[bytes], headers: dict[str, str] | None = None
) -> RawResponse:
    """POST ``chunks`` as a chunked body (no Content-Length: the gateway cannot size it
    up front), each chunk sent as it is produced."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request("POST", path, iter(chunks), {**NDJSON, **(headers or {})}, encode_chunked=True)
        response = conn.getresponse()
        return RawResponse(
            response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()
        )
    finally:
        conn.close()


def upload(port: int, query: str, body: bytes, **headers: str) -> RawResponse:
    return call(port, "POST", f"/reef/scenarios/support/import{query}", body, {**NDJSON, **headers})


def listing(port: int, query: str = "", **headers: str) -> list[dict[str, Any]]:
    answer = call(port, "GET", f"/reef/scenarios/support/records?limit=100{query}", None, headers)
    assert answer.status == 200, answer.body
    return list(answer.json()["data"])


def test_an_upload_imports_once_and_says_what_it_did(gateway: GatewayThread) -> None:
    first = upload(gateway.port, "?format=openai-finetune", FINETUNE)
    assert first.status == 200, first.body
    summary = first.json()
    assert summary["format"] == "openai-finetune" and summary["dry_run"] is False
    assert (summary["lines"], summary["records"], summary["feedback"]) == (4, 4, 4)
    assert (summary["skipped"], summary["skips"]) == (0, [])
    stored = listing(gateway.port)
    assert len(stored) == 4
    assert {r["tags"]["reef.origin"] for r in stored} == {"import:openai-finetune"}

    again = upload(gateway.port, "", FINETUNE).json()  # auto tells the format again
    assert again["format"] == "openai-finetune"
    assert (again["records"], again["duplicate_records"]) == (0, 4)
    assert (again["feedback"], again["duplicate_feedback"]) == (0, 4)
    assert len(listing(gateway.port)) == 4


def test_a_streamed_upload_split_mid_line_reads_every_line(gateway: GatewayThread) -> None:
    body = CHAT + b"{not json\n\n" + b'{"messages": []}'  # no newline at the end
    pieces = [body[i : i + 7] for i in range(0, len(body), 7)]
    path = "/reef/scenarios/support/import?format=openai-chat"
    answer = upload_chunks(gateway.port, path, pieces)
    assert answer.status == 200, answer.body
    summary = answer.json()
    assert summary["records"] == 4
    assert summary["lines"] == 7
    assert [s["line"] for s in summary["skips"]] == [5, 7]
    assert summary["skips"][0]["reason"].startswith("not JSON")


def test_pretty_printed_objects_upload_with_the_format_told_from_the_first(
    gateway: GatewayThread,
) -> None:
    # Langfuse traces as `jq .` writes them: the format is told from the whole first
    # object, however the chunks split it; an object cut short at the end is listed.
    traces = [json.loads(line) for line in (DATA / "langfuse.jsonl").read_text().splitlines()]
    body = "".join(json.dumps(trace, indent=2) + "\n" for trace in traces).encode()
    cut = json.dumps(traces[0], indent=2).encode().splitlines()[:4]
    body += b"\n".join(cut)
    pieces = [body[i : i + 13] for i in range(0, len(body), 13)]
    answer = upload_chunks(gateway.port, "/reef/scenarios/support/import", pieces)
    assert answer.status == 200, answer.body
    summary = answer.json()
    assert summary["format"] == "langfuse"
    assert (summary["records"], summary["feedback"], summary["sessions"]) == (4, 3, 2)
    opened = len(body.splitlines()) - len(cut) + 1
    assert summary["skips"] == [
        {"line": opened, "reason": "object opened by a '{' line is not closed by a '}' line"}
    ]


def test_a_line_longer_than_the_body_limit_is_skipped_and_listed(
    make_gateway: Callable[..., GatewayThread],
) -> None:
    gateway = make_gateway(server={"max_body_bytes": 2048})
    lines = FINETUNE.splitlines(keepends=True)
    huge = json.dumps({"messages": [{"role": "user", "content": "x" * 5000}]}).encode() + b"\n"
    chunks = [lines[0], huge[:1000], huge[1000:3000], huge[3000:], lines[1]]
    answer = upload_chunks(gateway.port, "/reef/scenarios/support/import", chunks)
    assert answer.status == 200, answer.body
    summary = answer.json()
    assert (summary["lines"], summary["records"], summary["skipped"]) == (3, 2, 1)
    assert summary["skips"][0]["line"] == 2
    assert "server.max_body_bytes (2048 bytes)" in summary["skips"][0]["reason"]


def test_strict_and_dry_run(gateway: GatewayThread) -> None:
    dry = upload(gateway.port, "?dry_run=true", FINETUNE)
    assert dry.status == 200 and dry.json()["records"] == 4 and dry.json()["dry_run"] is True
    assert listing(gateway.port) == []
    strict = upload(gateway.port, "?strict=true", FINETUNE + b"{broken\n")
    assert strict.status == 400
    assert "upload:5: not JSON" in strict.json()["error"]["message"]
    # Sent again without the bad line, it imports everything once.
    fixed = upload(gateway.port, "?strict=true", FINETUNE).json()
    assert fixed["records"] + fixed["duplicate_records"] == 4
    assert len(listing(gateway.port)) == 4


def test_bad_requests_name_what_to_fix(gateway: GatewayThread) -> None:
    unknown = upload(gateway.port, "?format=csv", FINETUNE)
    assert unknown.status == 400
    assert "reef, otel, openai-chat, openai-finetune" in unknown.json()["error"]["message"]
    odd = upload(gateway.port, "", b'{"hello": "world"}\n')
    assert odd.status == 400 and "cannot tell the format" in odd.json()["error"]["message"]
    empty = upload(gateway.port, "", b"\n\n")
    assert empty.status == 400 and "the upload is empty" in empty.json()["error"]["message"]
    flag = upload(gateway.port, "?dry_run=maybe", FINETUNE)
    assert flag.status == 400 and "dry_run" in flag.json()["error"]["message"]
    text = upload(gateway.port, "", FINETUNE, **{"content-type": "text/plain"})
    assert text.status == 415
    assert "application/x-ndjson" in text.json()["error"]["message"]
    jsonl = upload(gateway.port, "?dry_run=1", FINETUNE, **{"content-type": "application/jsonl"})
    assert jsonl.status == 200 and jsonl.json()["records"] == 4
    assert listing(gateway.port) == []
    # A named format of which no line reads (every line skipped): nothing written, a 400.
    wrong = upload(gateway.port, "?format=otel", b"1e-08\n" + FINETUNE)
    assert wrong.status == 400, wrong.body
    message = wrong.json()["error"]["message"]
    assert "none of the upload's 5 line(s) could be read as otel" in message
    assert "nothing was written; line 1: " in message
    assert listing(gateway.port) == []


def test_only_an_admin_of_the_scenario_may_upload(
    make_gateway: Callable[..., GatewayThread],
) -> None:
    keys = [
        {"id": "app", "key": "sk-app", "role": "inference"},
        {"id": "other", "key": "sk-other", "role": "admin", "scenarios": ["claude"]},
        {"id": "ops", "key": "sk-ops", "role": "admin"},
    ]
    gateway = make_gateway(auth={"keys": keys})
    assert upload(gateway.port, "", FINETUNE).status == 401
    inference = upload(gateway.port, "", FINETUNE, authorization="Bearer sk-app")
    assert inference.status == 403
    other = upload(gateway.port, "", FINETUNE, authorization="Bearer sk-other")
    assert other.status == 403 and "support" in other.json()["error"]["message"]
    admin = upload(gateway.port, "", FINETUNE, authorization="Bearer sk-ops")
    assert admin.status == 200 and admin.json()["records"] == 4
    assert len(listing(gateway.port, authorization="Bearer sk-ops")) == 4


def test_the_records_listing_filters_by_origin(gateway: GatewayThread) -> None:
    live = gateway.openai().chat.completions.with_raw_response.create(
        model="reef/support", messages=[{"role": "user", "content": "hello"}]
    )
    live_id = live.headers["x-reef-record-id"]
    upload(gateway.port, "", FINETUNE)
    upload(gateway.port, "", CHAT)
    assert [r["id"] for r in listing(gateway.port, "&origin=live")] == [live_id]
    finetune = listing(gateway.port, "&origin=import:openai-finetune")
    chat = listing(gateway.port, "&origin=import:openai-chat")
    assert len(finetune) == 4 and len(chat) == 4
    assert {r["tags"]["reef.origin"] for r in chat} == {"import:openai-chat"}
    assert listing(gateway.port, "&origin=import:reef") == []
    assert len(listing(gateway.port)) == 9
    bad = call(gateway.port, "GET", "/reef/scenarios/support/records?origin=somewhere")
    assert bad.status == 400 and "import:openai-finetune" in bad.json()["error"]["message"]


def test_imported_feedback_is_written_at_most_at_the_uploading_keys_trust(
    make_gateway: Callable[..., GatewayThread],
) -> None:
    keys = [
        {"id": "ops", "key": "sk-ops", "role": "admin"},
        {"id": "helper", "key": "sk-helper", "role": "admin", "trust": "user"},
    ]
    gateway = make_gateway(auth={"keys": keys})
    ops, helper = "Bearer sk-ops", "Bearer sk-helper"

    def trusts() -> list[str]:
        return sorted(f.trust for r in gateway.store.iter_export("support") for f in r.feedback)

    # An operator asking for more than a user-trust key has is refused before any line.
    refused = upload(gateway.port, "?demo_trust=operator", FINETUNE, authorization=helper)
    assert refused.status == 403 and "above this key's trust" in refused.json()["error"]["message"]
    assert trusts() == []
    bad = upload(gateway.port, "?demo_trust=admin", FINETUNE, authorization=ops)
    assert bad.status == 400 and "demo_trust" in bad.json()["error"]["message"]
    # By default the rows take the uploading key's trust; lower may be asked for.
    assert upload(gateway.port, "", FINETUNE, authorization=helper).status == 200
    assert trusts() == ["user"] * 4
    # Reef's own lines keep their rows' levels, but never above the uploader's.
    reef_lines = [
        {
            "id": record.id,
            "scenario": "support",
            "session_id": record.session_id,
            "api": record.api,
            "request": record.request,
            "response": record.response,
            "prompt_hash": record.prompt_hash,
            "content_hash": record.content_hash,
            "idempotency_key": record.idempotency_key,
            "feedback": [
                {
                    "id": f"again-{record.id}",
                    "record_ids": [record.id],
                    "score": 0.5,
                    "trust": "operator",
                }
            ],
        }
        for record in gateway.store.iter_export("support")
    ]
    body = "".join(json.dumps(line) + "\n" for line in reef_lines).encode()
    answer = upload(gateway.port, "?format=reef", body, authorization=helper)
    assert answer.status == 200, answer.body
    assert answer.json()["feedback"] == 4
    assert trusts() == ["user"] * 8
    # An operator key's upload is at operator trust unless it asks for less.
    langsmith = (DATA / "langsmith.jsonl").read_bytes()
    lower = upload(gateway.port, "?demo_trust=untrusted", langsmith, authorization=ops)
    assert lower.status == 200 and lower.json()["feedback"] == 3
    full = upload(gateway.port, "", (DATA / "tensorzero.jsonl").read_bytes(), authorization=ops)
    assert full.status == 200 and full.json()["feedback"] == 4
    assert trusts() == ["operator"] * 3 + ["untrusted"] * 3 + ["user"] * 8
