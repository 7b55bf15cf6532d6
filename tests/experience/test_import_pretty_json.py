"""JSON objects written over several lines (``json.dumps(indent=...)``, ``jq .``) are
read as one entry each: the OpenTelemetry Python SDK's ``ConsoleSpanExporter`` output,
written by the SDK itself, and a downloaded Langfuse trace pretty-printed. An object
never closed, or larger than the bound, is skipped with its first line's number."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import ConsoleSpanExporter, SimpleSpanProcessor
from opentelemetry.trace import SpanKind

from reef.experience import (
    SOURCE_TAG,
    ImportLineError,
    SQLExperienceStore,
)
from reef.experience.importing import resolve_format
from tests.experience.importing_helpers import run_import

DATA = Path(__file__).resolve().parents[1] / "data" / "import"
CONVERSATIONS = 30


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SQLExperienceStore]:
    opened = SQLExperienceStore.from_url(f"sqlite:///{tmp_path / 'reef.db'}", migrate=True)
    yield opened
    opened.close()


def console_exporter_file(path: Path) -> list[tuple[str, str]]:
    """GenAI chat spans, each with an evaluation event, exported by the SDK's
    ``ConsoleSpanExporter`` with its default formatter (indented JSON); returns each
    span's (trace id, span id) in hex."""
    out = io.StringIO()
    provider = TracerProvider(resource=Resource.create({"service.name": "support-app"}))
    provider.add_span_processor(SimpleSpanProcessor(ConsoleSpanExporter(out=out)))
    tracer = provider.get_tracer("support-app")
    ids = []
    for i in range(CONVERSATIONS):
        question = [{"role": "user", "parts": [{"type": "text", "content": f"parcel {i}?"}]}]
        answer = [
            {
                "role": "assistant",
                "parts": [{"type": "text", "content": f"Parcel {i} ships today."}],
                "finish_reason": "stop",
            }
        ]
        with tracer.start_as_current_span("chat gpt-4o-mini", kind=SpanKind.CLIENT) as span:
            span.set_attribute("gen_ai.operation.name", "chat")
            span.set_attribute("gen_ai.request.model", "gpt-4o-mini")
            span.set_attribute("gen_ai.conversation.id", f"conv-{i}")
            span.set_attribute("gen_ai.input.messages", json.dumps(question))
            span.set_attribute("gen_ai.output.messages", json.dumps(answer))
            span.set_attribute("gen_ai.usage.input_tokens", 12)
            span.set_attribute("gen_ai.usage.output_tokens", 5)
            span.add_event(
                "gen_ai.evaluation.result",
                {"gen_ai.evaluation.name": "helpful", "gen_ai.evaluation.score.value": 1.0},
            )
            context = span.get_span_context()
            ids.append((f"{context.trace_id:032x}", f"{context.span_id:016x}"))
    provider.shutdown()
    path.write_text(out.getvalue())
    return ids


def test_the_python_sdks_console_exporter_output_imports_as_written(
    store: SQLExperienceStore, tmp_path: Path
) -> None:
    path = tmp_path / "console.txt"
    ids = console_exporter_file(path)
    text = path.read_text()
    assert text.startswith("{\n") and text.count("\n}\n") == CONVERSATIONS  # indented
    assert resolve_format(path, "auto").name == "otel"
    summary = run_import(store, path, tmp_path)
    assert (summary.records, summary.feedback, summary.skipped) == (
        CONVERSATIONS,
        CONVERSATIONS,
        0,
    ), summary.as_dict()
    assert summary.lines == len(text.splitlines())
    records = {r.tags[SOURCE_TAG]: r for r in store.iter_export("s")}
    assert set(records) == {trace + span for trace, span in ids}
    first = records[ids[0][0] + ids[0][1]]
    assert first.session_id == "conv-0"
    assert first.request["messages"] == [{"role": "user", "content": "parcel 0?"}]
    assert first.response is not None
    assert first.response["choices"][0]["message"]["content"] == "Parcel 0 ships today."
    assert [f.score for f in first.feedback] == [1.0]
    again = run_import(store, path, tmp_path)
    assert (again.records, again.duplicate_records) == (0, CONVERSATIONS)


def test_a_pretty_printed_langfuse_trace_reads_as_its_compact_line(
    store: SQLExperienceStore, tmp_path: Path
) -> None:
    compact = (DATA / "langfuse.jsonl").read_text().splitlines()
    pretty = tmp_path / "traces.json"
    # as `jq .` writes each downloaded trace, one after the other
    pretty.write_text("".join(json.dumps(json.loads(line), indent=2) + "\n" for line in compact))
    summary = run_import(store, pretty, tmp_path)
    assert summary.formats == {str(pretty): "langfuse"}
    assert (summary.records, summary.feedback, summary.skipped, summary.sessions) == (4, 3, 0, 2)


def test_an_object_never_closed_is_skipped_with_its_first_line(
    store: SQLExperienceStore, tmp_path: Path
) -> None:
    good = (DATA / "openai-finetune.jsonl").read_text().splitlines()[0]
    path = tmp_path / "cut.jsonl"
    opened = json.dumps(json.loads(good), indent=2).splitlines()[:-3]  # cut short
    path.write_text("\n".join([good, *opened]) + "\n")
    summary = run_import(store, path, tmp_path, fmt="openai-finetune")
    assert summary.records == 1
    assert [(line, reason) for _, line, reason in summary.skips] == [
        (2, "object opened by a '{' line is not closed by a '}' line")
    ]
    with pytest.raises(ImportLineError, match=r"cut.jsonl:2: object opened"):
        run_import(store, path, tmp_path, fmt="openai-finetune", strict=True)


def test_an_object_over_the_bound_is_skipped_and_the_next_one_read(
    store: SQLExperienceStore, tmp_path: Path
) -> None:
    lines = (DATA / "openai-finetune.jsonl").read_text().splitlines()
    big = json.loads(lines[0])
    big["messages"][0]["content"] = "x" * 5000
    path = tmp_path / "big.json"
    path.write_text(json.dumps(big, indent=2) + "\n" + json.dumps(json.loads(lines[1]), indent=2))
    summary = run_import(store, path, tmp_path, fmt="openai-finetune", max_object_bytes=4096)
    assert summary.records == 1
    ((_, line, reason),) = summary.skips
    assert line == 1 and "larger than 4096" in reason
