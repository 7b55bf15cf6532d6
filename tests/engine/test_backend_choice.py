"""``--backend auto`` (``reef.engine.choice``) without the openvino extra: it resolves to
eager where OpenVINO cannot serve, the agreement check refuses a backend whose answers
differ (a tiny model with other seeded weights, probed through a real engine), and the
cached choice is reused until its key changes."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest
import torch

from reef.engine import choice
from reef.engine.models import LoadedModel, load_model
from reef.engine.openvino import CONVERTER_ENV
from reef.engine.process import EngineOptions
from reef.engine.runtime import Engine
from reef.engine.server import backend_candidates, openvino_engine
from reef.engine.tiny import build_tiny_model, build_tiny_tokenizer
from tests.engine.conftest import TINY
from tests.engine.lora_factory import PEFT_WRAP_WARNING

pytestmark = pytest.mark.filterwarnings(PEFT_WRAP_WARNING)


def other_tiny_model() -> Engine:
    """tiny-random's shape with other seeded weights: a model that answers differently."""
    tokenizer = build_tiny_tokenizer()
    model = build_tiny_model(tokenizer)
    generator = torch.Generator().manual_seed(99)
    with torch.no_grad():
        for parameter in model.parameters():
            if parameter.dim() == 2:
                parameter.normal_(0.0, 0.02, generator=generator)
    model.eval()
    eos = frozenset({int(tokenizer.eos_token_id)})
    return Engine(LoadedModel(model, tokenizer, TINY, eos), max_batch=8, threads=1)


@pytest.fixture(scope="module")
def calibrated(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The check run with the eager tiny model as reference and as a candidate, and the
    other-seeded model as a second candidate."""
    home = tmp_path_factory.mktemp("choice-home")

    def tiny() -> Engine:
        return Engine(load_model(TINY, home), max_batch=8, threads=1)

    return choice.calibrate(
        tiny,
        [
            choice.Candidate("other", "float32", other_tiny_model),
            choice.Candidate("eager", "float32", tiny),
            choice.Candidate("reference", "float32", None),  # the reference's own probe
            # OpenVINO cannot serve tiny-random (no model directory; in CI no extra either)
            choice.Candidate(
                "openvino",
                "float32",
                lambda: openvino_engine(TINY, home, EngineOptions(backend="openvino")),
            ),
        ],
    )


def test_auto_resolves_to_eager_where_openvino_cannot_serve(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # no converter (and, in CI, no openvino extra either): OpenVINO is not a candidate
    monkeypatch.setenv(CONVERTER_ENV, str(tmp_path / "missing" / "optimum-cli"))
    options = EngineOptions(backend="auto", dtype="float16", threads=1)
    with caplog.at_level(logging.INFO, logger="reef.engine"):
        resolved = choice.resolve_backend(
            TINY, tmp_path, options, lambda: backend_candidates(TINY, tmp_path, options)
        )
    assert resolved == EngineOptions(backend="eager", dtype="float16", threads=1)
    assert not (tmp_path / choice.CHOICE_FILE).exists()  # nothing calibrated
    assert "engine backend auto: eager (openvino is not a candidate" in caplog.text


def test_the_check_refuses_a_backend_whose_answers_differ(calibrated: dict[str, Any]) -> None:
    other, same, itself, unservable = calibrated["figures"]
    assert other["agreement"] < 0.5
    assert other["refused"].startswith("other float32: greedy answers agree with PEFT's on")
    assert f"of {2 * choice.PROBE_PROMPTS} prompts, under the 95% required" in other["refused"]
    assert same["agreement"] == 1.0 and "refused" not in same
    assert itself["agreement"] == 1.0 and "refused" not in itself
    assert unservable["refused"].startswith("cannot serve: ")
    assert "agreement" not in unservable
    # the fastest of those that agree (which one it is depends on timing, not asserted)
    fastest = min((same, itself), key=lambda figure: figure["ms_per_token"])
    assert calibrated["backend"] == fastest["backend"] and calibrated["dtype"] == "float32"
    line = choice.describe(calibrated)
    assert line.startswith(f"{fastest['backend']} float32 [other float32 ")
    assert "(refused: other float32: greedy answers agree" in line


def test_the_cached_choice_is_reused_until_its_key_changes(
    tmp_path: Path, calibrated: dict[str, Any]
) -> None:
    path = tmp_path / choice.CHOICE_FILE
    measured: list[int] = []

    def measure() -> dict[str, Any]:
        measured.append(1)
        return dict(calibrated)

    key = choice.choice_key("0123456789abcdef", EngineOptions(backend="auto"))
    first, cached = choice.choose(path, key, measure)
    assert not cached and len(measured) == 1
    assert json.loads(path.read_text())["key"] == key
    again, cached = choice.choose(path, key, measure)
    assert cached and len(measured) == 1 and again == first
    for changed in ({"source": "fedcba9876543210"}, {"cpu": "another CPU"}, {"dtype": "int8"}):
        _, cached = choice.choose(path, {**key, **changed}, measure)
        assert not cached
    assert len(measured) == 4
    assert json.loads(path.read_text())["key"]["dtype"] == "int8"
    path.write_text("{not json")
    _, cached = choice.choose(path, key, measure)
    assert not cached and len(measured) == 5


def test_the_key_names_this_cpu_and_the_versions_the_answers_depend_on() -> None:
    key = choice.choice_key("0123456789abcdef", EngineOptions(backend="auto", threads=2))
    assert key["versions"]["torch"] == torch.__version__
    assert set(key["versions"]) == set(choice.VERSIONED)
    assert "(flags " in key["cpu"] and key["threads"] == 2
