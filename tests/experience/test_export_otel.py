"""``reef export --format otel``: OTLP/JSON as the Collector's file exporter writes it,
read back by ``reef import --format otel`` into the same conversations and feedback."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

from typer.testing import CliRunner

from reef.cli.main import app
from reef.experience import (
    FeedbackDraft,
    ImportOptions,
    ImportSummary,
    RecordView,
    SQLExperienceStore,
    import_file,
)
from reef.experience.importing.otel import attributes_of
from reef.telemetry.otlp_json import OtelFileOptions, export_otel
from reef.upstream import canonical_reply, canonical_request

DATA = Path(__file__).resolve().parents[1] / "data" / "import"


def _import(store: SQLExperienceStore, path: Path, tmp_path: Path, fmt: str) -> ImportSummary:
    summary = ImportSummary()
    options = ImportOptions(scenario="s", fmt=fmt, checkpoint_dir=tmp_path / "checkpoints")
    import_file(store, path, options, summary)
    return summary


def _source(tmp_path: Path) -> SQLExperienceStore:
    """Multi-turn conversations with tool calls (openai-chat), demonstrations
    (openai-finetune), plus feedback on two records at once with a text label, and
    one with an explanation and a tool-call correction."""
    store = SQLExperienceStore.from_url(f"sqlite:///{tmp_path / 'a.db'}", migrate=True)
    _import(store, DATA / "openai-chat.jsonl", tmp_path / "a", "openai-chat")
    _import(store, DATA / "openai-finetune.jsonl", tmp_path / "a", "openai-finetune")
    ids = [r.id for r in store.iter_export("s")]
    for record_ids, score, text, correction in (
        ((ids[0], ids[5]), 0.25, "thumbs_down", None),
        ((ids[1],), 0.0, "it should have looked the weather up in Celsius", _CALL),
    ):
        store.add_feedback(
            FeedbackDraft(
                scenario="s",
                record_ids=record_ids,
                score=score,
                feedback=text,
                correction=correction,
                metadata={},
                principal="grader",
                idempotency_key=None,
            )
        )
    return store


_CALL = {"tool_calls": [{"name": "get_current_weather", "arguments": {"unit": "celsius"}}]}


def _conversations(store: SQLExperienceStore) -> list[dict[str, Any]]:
    """Each record as what learning reads of it: its session's partition (by first
    record), conversation, answer, status, usage, time, and its feedback."""
    views = list(store.iter_export("s"))
    first_of: dict[str, int] = {}
    out = []
    for index, view in enumerate(views):
        out.append(
            {
                "session": first_of.setdefault(view.session_id, index),
                "conversation": canonical_request(view.api, view.request),
                "reply": _reply(view),
                "status": view.status,
                "created_at": view.created_at,
                "feedback": sorted(
                    (f.score, f.feedback, json.dumps(f.correction), len(f.record_ids))
                    for f in view.feedback
                ),
            }
        )
    return out


def _reply(view: RecordView) -> Any:
    if view.response is None:
        return None
    return canonical_reply(view.api, view.response, view.request)


def test_otel_export_round_trips_conversations_and_feedback(tmp_path: Path) -> None:
    source = _source(tmp_path)
    target = SQLExperienceStore.from_url(f"sqlite:///{tmp_path / 'b.db'}", migrate=True)
    try:
        dump = tmp_path / "spans.jsonl"
        assert export_otel(source, "s", dump, OtelFileOptions()) == 8
        summary = _import(target, dump, tmp_path / "b", "auto")
        assert summary.formats == {str(dump): "otel"}
        assert (summary.records, summary.feedback, summary.skipped) == (8, 6, 0)
        assert _conversations(target) == _conversations(source)
        # The source's session ids travel as gen_ai.conversation.id.
        assert [r.session_id for r in target.iter_export("s")] == [
            r.session_id for r in source.iter_export("s")
        ]
        again = _import(target, dump, tmp_path / "b", "otel")
        assert (again.records, again.duplicate_records, again.feedback) == (0, 8, 0)
        assert again.duplicate_feedback == 6
    finally:
        source.close()
        target.close()


def test_feedback_on_records_of_several_lines_is_written_with_the_last(
    tmp_path: Path, monkeypatch: Any
) -> None:
    """One record per ExportTraceServiceRequest: feedback on two records sits on the
    later one's line and names the earlier one by its span ids; it imports whole."""
    monkeypatch.setattr("reef.telemetry.otlp_json.SPANS_PER_LINE", 1)
    source = _source(tmp_path)
    target = SQLExperienceStore.from_url(f"sqlite:///{tmp_path / 'b.db'}", migrate=True)
    try:
        dump = tmp_path / "spans.jsonl"
        export_otel(source, "s", dump, OtelFileOptions())
        assert len(dump.read_text().splitlines()) == 8
        summary = _import(target, dump, tmp_path / "b", "otel")
        assert (summary.records, summary.feedback, summary.skipped) == (8, 6, 0)
        assert _conversations(target) == _conversations(source)
    finally:
        source.close()
        target.close()


def _spans(payload: bytes) -> list[dict[str, Any]]:
    return [
        span
        for line in payload.splitlines()
        for resource in json.loads(line)["resourceSpans"]
        for scope in resource["scopeSpans"]
        for span in scope["spans"]
    ]


def test_the_spans_carry_the_live_exports_attributes(tmp_path: Path) -> None:
    source = _source(tmp_path)
    try:
        out = io.BytesIO()
        export_otel(source, "s", out, OtelFileOptions())
        spans = _spans(out.getvalue())
        records = [s for s in spans if s["kind"] == 3]
        first = attributes_of(records[0]["attributes"])
        assert records[0]["name"] == "chat gpt-4o-mini"
        assert first["gen_ai.operation.name"] == "chat"
        assert first["gen_ai.conversation.id"] == first["reef.session.id"] == "conv-1"
        assert first["gen_ai.usage.input_tokens"] == 19
        assert "gen_ai.input.messages" in first and "gen_ai.output.messages" in first
        (labelled,) = [
            attributes_of(s["events"][0]["attributes"])
            for s in spans
            if s["kind"] == 1 and len(s["links"]) == 2
        ]
        assert labelled["gen_ai.evaluation.score.label"] == "thumbs_down"
        assert labelled["gen_ai.evaluation.score.value"] == 0.25
        # Without content: no messages and no corrections.
        bare = io.BytesIO()
        export_otel(source, "s", bare, OtelFileOptions(capture_content=False))
        text = bare.getvalue().decode()
        assert "gen_ai.input.messages" not in text and "reef.feedback.correction" not in text
        assert "Boston" not in text
    finally:
        source.close()


def test_cli_writes_otel(tmp_path: Path) -> None:
    home = tmp_path / "home"
    config = tmp_path / "reef.yaml"
    config.write_text(f'home: {home}\nstore: {{url: "sqlite:///{tmp_path / "r.db"}"}}\n')
    runner = CliRunner()
    loaded = runner.invoke(
        app, ["import", str(DATA / "openai-chat.jsonl"), "--scenario", "s", "-c", str(config)]
    )
    assert loaded.exit_code == 0, loaded.output
    out = tmp_path / "spans.jsonl"
    result = runner.invoke(
        app, ["export", "--scenario", "s", "--format", "otel", "-o", str(out), "-c", str(config)]
    )
    assert result.exit_code == 0, result.output
    assert len([s for s in _spans(out.read_bytes()) if s["kind"] == 3]) == 4
    bare = tmp_path / "bare.jsonl"
    flags = ["-f", "otel", "-o", str(bare), "--no-capture-content", "-c", str(config)]
    result = runner.invoke(app, ["export", "--scenario", "s", *flags])
    assert result.exit_code == 0, result.output
    assert "gen_ai.input.messages" not in bare.read_text()
    wrong = runner.invoke(app, ["export", "--scenario", "s", "-f", "csv", "-c", str(config)])
    assert wrong.exit_code != 0 and "otel" in str(wrong.exception)
