"""The engine's ``--backend`` option and the agreement check, without the openvino extra
or without using it (tests/engine/test_openvino.py serves through the backend itself)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from reef.engine import openvino
from reef.engine.process import EngineOptions


def test_the_backend_travels_to_the_child_only_when_not_eager() -> None:
    assert "--backend" not in EngineOptions().argv()
    for backend in ("openvino", "auto"):
        argv = EngineOptions(backend=backend).argv()  # type: ignore[arg-type]
        assert argv[argv.index("--backend") + 1] == backend


def test_the_agreement_check_passes_at_the_threshold_and_refuses_under_it() -> None:
    reference = [[1, 2, 3]] * 19 + [[4, 5, 6]]
    same_but_one = [[1, 2, 3]] * 19 + [[4, 5, 7]]  # 95%
    assert openvino.check_agreement(same_but_one, reference, "int8") == 0.95
    with pytest.raises(openvino.BackendDisagreesError, match=r"int8: .* on 90% of 20 prompts"):
        openvino.check_agreement([[9], *same_but_one[1:]], reference, "int8")


def test_without_the_extra_the_backend_is_refused_naming_it(tmp_path: Path) -> None:
    # where the extra is installed, a package of the same name first on the path that
    # fails to import stands for its absence
    shadow = tmp_path / "shadow" / "openvino_genai"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ImportError('No module named openvino_genai')\n")
    path = os.pathsep.join(filter(None, [str(shadow.parent), os.environ.get("PYTHONPATH")]))
    done = subprocess.run(
        [sys.executable, "-m", "reef.engine", "serve", "--backend", "openvino", "--port", "0",
         "--home", str(tmp_path)],
        capture_output=True, text=True, timeout=120, check=False,
        env={**os.environ, "PYTHONPATH": path},
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert "pip install 'reef-agent[openvino]'" in done.stderr
