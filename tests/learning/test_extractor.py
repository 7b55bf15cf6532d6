"""The signals' model extractor: complaints the rules found no value in, read by a model
(a fake extractor server on loopback answers the JSON), behind the gateway and its store."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from typer.testing import CliRunner

from reef.cli.main import app
from reef.evaluation import EvaluationStore
from reef.experience import FeedbackView, RecordFilter
from reef.jobs import JobQueue
from reef.learning.computed import SignalWriter
from reef.learning.extractor import guarded, parse_reply
from reef.learning.recipes import RecipeError, parse_recipe
from reef.learning.reflect import UpstreamModels
from reef.learning.selection import SelectionConfig, select_experience
from reef.learning.signals import ExtractorConfig, SignalsConfig
from reef.learning.signals_preview import preview_signals
from reef.learning.worker import Worker
from reef.releases import ReleaseChain, open_artifact_store
from tests.experience.agent import Agent, Sent
from tests.fakes.extractor import ExtractorUpstreamThread
from tests.fakes.upstream import FakeUpstreamThread
from tests.gateway.harness import GatewayThread, make_settings

KEYS = {"keys": [{"id": "ana", "key": "sk-ana", "role": "inference", "trust": "user"}]}
# two values of the answer's shape: the rules hear the complaint but pick neither
UNREAD = "That is wrong, check the form again, I put #48213 and #48214 there"
WITH_MODEL = SignalsConfig(enabled=("correction",), extractor=ExtractorConfig(confidence=0.4))


@pytest.fixture(scope="module")
def fake() -> Iterator[FakeUpstreamThread]:
    with FakeUpstreamThread() as server:
        yield server


@pytest.fixture
def extractor() -> Iterator[ExtractorUpstreamThread]:
    with ExtractorUpstreamThread(pattern=r"#\d+") as server:
        yield server


@pytest.fixture
def gateway(tmp_path: Path, fake: FakeUpstreamThread) -> Iterator[GatewayThread]:
    settings = make_settings(tmp_path, fake.base_url, auth=KEYS)
    with GatewayThread(settings) as gw:
        yield gw


def models(gateway: GatewayThread, extractor: ExtractorUpstreamThread) -> UpstreamModels:
    # the scenario's own upstream ("fake"), reached at the extractor fake's URL
    return UpstreamModels(gateway.settings, "support", {"fake": extractor.base_url})


@pytest.fixture
def now() -> datetime:
    """The writers' clock: a little after the traffic the test sends."""
    return datetime.now(UTC) + timedelta(minutes=5)


def complained(gateway: GatewayThread, question: str, follow_up: str = UNREAD) -> Sent:
    agent = Agent(gateway, "openai", key="sk-ana")
    asked = agent.user(question).ask(tools=False)
    agent.user(follow_up).ask(tools=False)
    return asked


def rows(gateway: GatewayThread, record_id: str) -> dict[str, FeedbackView]:
    return {fb.source: fb for fb in gateway.store.get_record(record_id).feedback}


def calls(gateway: GatewayThread) -> list[object]:
    page = gateway.store.list_records("support", RecordFilter(purpose="judge"), None, 100)
    return [r for r in page.records if r.tags.get("extractor") == "correction"]


def test_parse_and_guard() -> None:
    assert parse_reply('```json\n{"correction": "#48213"}\n```') == "#48213"
    assert parse_reply('{"correction": 42}') == "42"
    assert parse_reply('{"correction": null}') is None
    assert parse_reply("the right one is #48213") is None  # not JSON: no value
    assert parse_reply('{"correction": "  "}') is None
    said = "I put #48213 on the form"
    assert guarded("#48213", said, "Your order is #1.") == "#48213"
    assert guarded("#99999", said, "Your order is #1.") is None  # not in the message
    assert guarded("#48213", said, "#48213") is None  # the answer itself


def test_the_extractor_reads_a_complaint_the_rules_could_not(
    gateway: GatewayThread, extractor: ExtractorUpstreamThread, now: datetime
) -> None:
    asked = complained(gateway, "which order did I place last week?")
    writer = SignalWriter(gateway.store, gateway.settings.trust_of)
    # without the extractor: a complaint without a value, nothing asked
    assert writer.run("support", SignalsConfig(enabled=("correction",)), now).written == 1
    assert extractor.calls == 0
    done = SignalWriter(gateway.store, gateway.settings.trust_of).run(
        "support", WITH_MODEL, now, models(gateway, extractor)
    )
    assert (done.extractor_calls, done.extracted, done.extractor_error) == (1, 1, None)
    found = rows(gateway, asked.record_id)
    assert found["signal:correction"].correction is None  # the rules' row, unchanged
    model = found["signal:correction/model"]
    assert (model.correction, model.score, model.confidence) == ("#48213", 0.0, 0.4)
    assert (model.principal, model.trust, model.feedback) == ("ana", "user", UNREAD)
    assert model.idempotency_key == f"signal:correction/model:{asked.record_id}"
    # the call is a record of purpose judge, on the scenario's own model
    (call,) = calls(gateway)
    assert call.tags["judged"] == asked.record_id and extractor.models == ["fake-model"]
    # selection trains on the extracted value, never on the call
    batch = select_experience(
        gateway.store, ReleaseChain(gateway.database), "support",
        SelectionConfig(holdout_fraction=0, max_per_principal=None),
    )  # fmt: skip
    (example,) = [e for e in batch.train if e.record_id == asked.record_id]
    assert example.correction == "#48213"
    assert call.id not in {e.record_id for e in batch.train}
    assert batch.stats.get("complaint_without_value", 0) == 0
    # a second pass asks nothing again
    again = SignalWriter(gateway.store, gateway.settings.trust_of).run(
        "support", WITH_MODEL, now, models(gateway, extractor)
    )
    assert (again.extractor_calls, extractor.calls) == (0, 1)


def test_a_value_not_in_the_message_or_equal_to_the_answer_is_not_written(
    gateway: GatewayThread, extractor: ExtractorUpstreamThread, now: datetime
) -> None:
    asked = complained(gateway, "which order is mine?")
    extractor.answer = '{"correction": "#55555"}'  # a value the user never wrote
    done = SignalWriter(gateway.store, gateway.settings.trust_of).run(
        "support", WITH_MODEL, now, models(gateway, extractor)
    )
    assert (done.extractor_calls, done.extracted) == (1, 0)
    assert set(rows(gateway, asked.record_id)) == {"signal:correction"}


def test_the_hourly_cap_and_a_model_that_is_down(
    gateway: GatewayThread, extractor: ExtractorUpstreamThread, now: datetime
) -> None:
    first = complained(gateway, "which order is the first?")
    second = complained(gateway, "which order is the second?")
    capped = SignalsConfig(enabled=("correction",), extractor=ExtractorConfig(max_calls_per_hour=1))
    done = SignalWriter(gateway.store, gateway.settings.trust_of).run(
        "support", capped, now, models(gateway, extractor)
    )
    assert (done.extractor_calls, done.extracted, done.extractor_skipped_budget) == (1, 1, 1)
    # within the same hour the budget is spent
    later = now + timedelta(minutes=30)
    again = SignalWriter(gateway.store, gateway.settings.trust_of).run(
        "support", capped, later, models(gateway, extractor)
    )
    assert (again.extractor_calls, again.extractor_skipped_budget) == (0, 1)
    # an hour on, the other complaint is read; a model that is down ends the pass
    extractor.failing = True
    hour_on = now + timedelta(minutes=61)
    down = SignalWriter(gateway.store, gateway.settings.trust_of).run(
        "support", capped, hour_on, models(gateway, extractor)
    )
    assert down.extractor_calls == 0 and "extractor down" in (down.extractor_error or "")
    extractor.failing = False
    up = SignalWriter(gateway.store, gateway.settings.trust_of).run(
        "support", capped, hour_on, models(gateway, extractor)
    )
    assert (up.extractor_calls, up.extracted) == (1, 1)
    sources = [set(rows(gateway, r.record_id)) for r in (first, second)]
    assert all("signal:correction/model" in s for s in sources)


def test_the_recipe_names_the_extractor_and_the_worker_passes_its_model(
    gateway: GatewayThread, extractor: ExtractorUpstreamThread
) -> None:
    asked = complained(gateway, "which order was refunded?")
    recipe = parse_recipe(
        {
            "learners": [{"type": "fewshot"}],
            "signals": {"enabled": ["correction"], "extractor": {"max_calls_per_hour": 5}},
        }
    )
    assert recipe.signals.extractor == ExtractorConfig(max_calls_per_hour=5)
    with pytest.raises(RecipeError, match="max_calls_per_hour"):
        parse_recipe(
            {"learners": [{"type": "fewshot"}], "signals": {"extractor": {"max_calls_per_hour": 0}}}
        )
    worker = Worker(
        gateway.settings, gateway.store, ReleaseChain(gateway.database),
        open_artifact_store(str(gateway.settings.home / "artifacts")),
        queue=JobQueue(gateway.database), evaluations=EvaluationStore(gateway.database),
        recipes={"support": recipe}, upstream_base_urls={"fake": extractor.base_url},
    )  # fmt: skip
    worker.compute_feedback()
    assert rows(gateway, asked.record_id)["signal:correction/model"].correction == "#48213"


def test_preview_shows_what_the_extractor_would_add_and_writes_nothing(
    gateway: GatewayThread, extractor: ExtractorUpstreamThread, now: datetime
) -> None:
    asked = complained(gateway, "which order is late?")
    found = preview_signals(
        gateway.store, "support", WITH_MODEL, now - timedelta(hours=1), 100, now=now,
        models=models(gateway, extractor),
    )  # fmt: skip
    assert (found.complaints_without_value, found.extractor_calls, found.extracted) == (1, 1, 1)
    (row,) = found.samples["extractor"]
    assert (row["record_id"], row["correction"]) == (asked.record_id, "#48213")
    assert found.as_dict()["extractor"] == {"calls": 1, "extracted": 1, "error": None}
    # the model was called, but nothing was recorded or written
    assert extractor.calls == 1 and calls(gateway) == []
    assert rows(gateway, asked.record_id) == {}
    extractor.failing = True
    down = preview_signals(
        gateway.store, "support", WITH_MODEL, now - timedelta(hours=1), 100, now=now,
        models=models(gateway, extractor),
    )  # fmt: skip
    assert down.extracted == 0 and "extractor down" in (down.extractor_error or "")


def test_the_preview_command_runs_the_recipes_extractor_dry(
    gateway: GatewayThread, extractor: ExtractorUpstreamThread, tmp_path: Path
) -> None:
    asked = complained(gateway, "which order was lost?")
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(
        "learners: [{type: fewshot}]\n"
        "signals: {enabled: [correction], extractor: {max_calls_per_hour: 3}}\n"
    )
    config = tmp_path / "reef.yaml"
    config.write_text(
        f"home: {tmp_path / 'home'}\nstore: {{url: '{gateway.settings.store_url()}'}}\n"
        f"upstreams: {{fake: {{type: openai, base_url: '{extractor.base_url}', model: m}}}}\n"
        f"scenarios: {{support: {{upstream: fake, recipe: '{recipe}'}}}}\n"
    )
    args = ["signals", "preview", "--scenario", "support", "-c", str(config), "--since", "1h"]
    shown = CliRunner().invoke(app, [*args, "--json"])
    assert shown.exit_code == 0, shown.output
    found = json.loads(shown.output)
    assert found["extractor"] == {"calls": 1, "extracted": 1, "error": None}
    assert found["samples"]["extractor"][0]["record_id"] == asked.record_id
    assert extractor.models == ["m"] and calls(gateway) == []
    text = CliRunner().invoke(app, args)
    assert "extractor (dry run): 1 calls, 1 values it would add" in text.output
