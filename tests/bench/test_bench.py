"""``python -m bench``, the one way in to the benchmarks: lists every benchmark script,
runs them in order, reports success, failure, timeout and skip without stopping the run.
``reef`` has no ``bench`` command (the scripts are in a checkout, not in the wheel)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from bench.__main__ import app
from typer.testing import CliRunner

from bench import registry, runner
from reef.cli.main import app as reef_app

REPO = Path(__file__).resolve().parents[2]
LOG = "calls.jsonl"
_RECORD = (
    "import json, sys, pathlib\n"
    "with pathlib.Path({log!r}).open('a') as log:\n"
    "    log.write(json.dumps({{'script': {name!r}, 'argv': sys.argv[1:]}}) + '\\n')\n"
)
OK = "print('working'); sys.exit(0)\n"
WRITE_JSON = (
    "out = sys.argv[sys.argv.index('--output') + 1]\n"
    "pathlib.Path(out).write_text('{\"fake\": true}')\n"
)
READ_JSON = "assert json.loads(pathlib.Path(sys.argv[1]).read_text()) == {'fake': True}\n"


def fake_checkout(tmp_path: Path, bodies: dict[str, str]) -> Path:
    """A checkout whose bench/ holds fake scripts that log their argv (relative to the
    checkout, so the log also proves the working directory) and run ``bodies[name]``."""
    bench_dir = tmp_path / "repo" / "bench"
    bench_dir.mkdir(parents=True)
    for script in sorted({s.script for b in registry.BENCHES for s in b.steps}):
        body = bodies.get(script, OK)
        (bench_dir / script).write_text(_RECORD.format(log=LOG, name=script) + body)
    return bench_dir


def calls(bench_dir: Path) -> list[dict[str, Any]]:
    log = bench_dir.parent / LOG
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def run(*args: str) -> Any:
    return CliRunner().invoke(app, list(args))


def python_m_bench(*args: str) -> subprocess.CompletedProcess[str]:
    """``python -m bench`` as a developer runs it: from the repository root."""
    return subprocess.run(
        [sys.executable, "-m", "bench", *args],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def test_python_m_bench_help_works_from_a_checkout() -> None:
    done = python_m_bench("--help")
    assert done.returncode == 0, done.stderr
    for option in ("--only", "--quick", "--list", "--write", "--bench-dir"):
        assert option in done.stdout


def test_the_product_cli_has_no_bench_command() -> None:
    shown = CliRunner().invoke(reef_app, ["--help"])
    assert shown.exit_code == 0, shown.output
    assert "quickstart" in shown.output  # the listing is there, without bench
    assert " bench " not in shown.output
    assert CliRunner().invoke(reef_app, ["bench", "--help"]).exit_code != 0


def test_list_names_every_script_of_the_checkout() -> None:
    done = python_m_bench("--list")
    assert done.returncode == 0, done.stderr
    registered = {step.script for b in registry.BENCHES for step in b.steps}
    for script in (REPO / "bench").glob("*.py"):
        if script.name == "__main__.py":
            continue
        assert script.name in registered | set(registry.HELPERS), (
            f"bench/{script.name} is neither run by python -m bench nor listed as a helper"
        )
        assert script.name in done.stdout
    for b in registry.BENCHES:
        assert f"  {b.name} " in done.stdout


def test_every_flag_passed_exists_in_its_script() -> None:
    for b in registry.BENCHES:
        for step in b.steps:
            source = (REPO / "bench" / step.script).read_text(encoding="utf-8")
            for flag in {a for a in (*step.full, *step.quick, *step.write) if a.startswith("--")}:
                assert f'"{flag}"' in source, f"bench/{step.script} has no {flag} option"
        first = (REPO / "bench" / b.steps[0].script).read_text(encoding="utf-8")
        for contender in b.optional:  # their flags go to the first step
            for flag in contender.missing_args:
                assert f'"{flag}"' in first, f"bench/{b.steps[0].script} has no {flag} option"


def test_runs_in_order_and_skips_what_cannot_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bench_dir = fake_checkout(tmp_path, {"engine_vs_vllm.py": WRITE_JSON})
    monkeypatch.setattr(runner, "module_available", lambda name: name not in runner.LOCAL_MODULES)
    result = run("--bench-dir", str(bench_dir), "--no-write")
    assert result.exit_code == 0, result.output
    assert [c["script"] for c in calls(bench_dir)] == [
        "gateway_overhead.py",
        "record_writes.py",
        "import_export.py",
        "faults.py",
        "signals.py",
        "otel_export.py",
        "otel_export_cpu.py",
        "spend_overhead.py",
        "shadow_overhead.py",
        "gate_validity.py",
    ]
    argv = calls(bench_dir)[0]["argv"]
    assert "--skip-litellm" in argv  # no bench/.venv-litellm in the fake checkout
    assert "--output" not in argv  # --no-write
    assert "working" in result.output
    assert "LiteLLM left out" in result.output
    for name in ("engine", "activation", "training", "gate"):
        assert f"{name:<18} skipped" in result.output
    assert "needs the `local` extra" in result.output


def test_write_passes_each_script_its_section_flags(tmp_path: Path) -> None:
    bench_dir = fake_checkout(
        tmp_path, {"engine_vs_vllm.py": WRITE_JSON, "engine_report.py": READ_JSON}
    )
    (bench_dir / ".venv-litellm" / "bin").mkdir(parents=True)
    (bench_dir / ".venv-litellm" / "bin" / "litellm").touch()
    result = run("--bench-dir", str(bench_dir), "--only", "engine", "--only", "gateway_overhead")
    assert result.exit_code == 0, result.output
    done = calls(bench_dir)
    assert [c["script"] for c in done] == [
        "gateway_overhead.py", "engine_vs_vllm.py", "engine_report.py",
    ]  # fmt: skip
    assert done[0]["argv"][-2:] == ["--output", "docs/benchmarks.md"]
    assert "--skip-litellm" not in done[0]["argv"]
    assert done[2]["argv"][-2:] == ["--output", "docs/benchmarks.md"]
    assert "rewrote the sections gateway_overhead, engine" in result.output


def test_a_failure_is_reported_and_the_run_goes_on(tmp_path: Path) -> None:
    bench_dir = fake_checkout(
        tmp_path,
        {"gateway_overhead.py": "print('boom'); sys.exit(3)\n", "activation.py": OK},
    )
    result = run("--bench-dir", str(bench_dir), "--quick", "--only", "gateway_overhead",
                 "--only", "activation")  # fmt: skip
    assert result.exit_code == 1, result.output
    assert [c["script"] for c in calls(bench_dir)] == ["gateway_overhead.py", "activation.py"]
    assert "gateway_overhead   failed" in result.output and "exit 3; last line: boom" in (
        result.output
    )
    assert "activation         ok" in result.output
    quick_argv = calls(bench_dir)[1]["argv"]
    assert "tiny-random" in quick_argv and "--no-vllm" in quick_argv
    assert "left unchanged" in result.output  # --quick writes nothing by default


def test_a_bench_that_runs_too_long_is_stopped(tmp_path: Path) -> None:
    bench_dir = fake_checkout(tmp_path, {"gateway_overhead.py": "import time; time.sleep(60)\n"})
    result = run("--bench-dir", str(bench_dir), "--only", "gateway_overhead",
                 "--timeout-seconds", "1")  # fmt: skip
    assert result.exit_code == 1, result.output
    assert "gateway_overhead   timeout" in result.output


def test_unknown_names_and_missing_directories_are_errors(tmp_path: Path) -> None:
    unknown = python_m_bench("--only", "nope", "--list")
    assert unknown.returncode == 2
    assert "unknown benchmark 'nope'; known: gateway_overhead" in unknown.stderr
    missing = python_m_bench("--bench-dir", str(tmp_path / "nowhere"))
    assert missing.returncode == 3
    assert "is not a directory" in missing.stderr


def test_a_failing_benchmark_is_the_exit_status(tmp_path: Path) -> None:
    bench_dir = fake_checkout(tmp_path, {"activation.py": "print('boom'); sys.exit(3)\n"})
    done = python_m_bench("--bench-dir", str(bench_dir), "--quick", "--only", "activation")
    assert "activation" in done.stdout and "failed" in done.stdout, done.stdout
    assert done.returncode == 1, done.stdout + done.stderr
