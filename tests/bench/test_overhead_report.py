"""``bench/overhead_report.py``: the figures the gateway overhead benchmark derives from
its rounds, on rounds made up here: issue 45's tail target and the split of Reef's cost
into capture and the rest (``--capture-off``)."""

from __future__ import annotations

import argparse
from types import ModuleType
from typing import Any

import pytest

from tests.bench.scripts import bench_module


@pytest.fixture(scope="module")
def report_module() -> ModuleType:
    return bench_module("overhead_report")


def rounds(load: ModuleType, target: str, p99s: list[float], cpu_us: list[float]) -> list[object]:
    """One round per run at c=32: 100 answers, 98 of 1 ms and two of ``p99`` ms (the
    nearest-rank p99 is the 99th), and ``cpu_us`` of the server's CPU per answer."""
    made = []
    for p99, cpu in zip(p99s, cpu_us, strict=True):
        latencies = [1.0] * 98 + [p99, p99]
        made.append(
            load.LoadResult(
                target, 32, seconds=1.0, latencies_ms=latencies, cpu_seconds=cpu * 100 / 1e6
            )
        )
    return made


def report(module: ModuleType, results: list[object]) -> Any:
    args = argparse.Namespace(
        concurrency=[32], runs=2, requests=100, warmup=0, loader="python", capture_off=True
    )
    check = module.RecordCheck(sent=400, receipts=400, records=400, sampled=0, sample_found=0)
    return module.Report("cmd", args, results, check, None)


def test_the_tail_target_and_the_capture_split_come_from_paired_runs(
    report_module: ModuleType,
) -> None:
    load = bench_module("load")
    results = [
        *rounds(load, "passthrough", [10.0, 8.0], [100.0, 110.0]),
        *rounds(load, "reef", [18.0, 12.0], [230.0, 240.0]),
        *rounds(load, "reef-capture-off", [11.0, 8.8], [130.0, 125.0]),
    ]
    lines = report(report_module, results).derived()
    text = "\n".join(lines)
    # per run 1.8x and 1.5x: the median of two is their mean, 1.65x, over 1.5x
    assert (
        "p99 ≤ 1.5x the passthrough's at c=32 in the same run: **missed** (1.65 (1.50..1.80)x)"
        in text
    )
    assert "p99 1.10 (1.10..1.10)x the passthrough's in the same run, against 1.65" in text
    # capture: 230-130 and 240-125 µs; the rest: 130-100 and 125-110 µs
    assert "capture 108 (100..115) µs; Reef without it +22 (+15..+30) µs beside the" in text


def test_without_capture_off_rounds_there_is_no_split(report_module: ModuleType) -> None:
    load = bench_module("load")
    results = [
        *rounds(load, "passthrough", [10.0, 10.0], [100.0, 100.0]),
        *rounds(load, "reef", [14.0, 15.0], [150.0, 150.0]),
    ]
    text = "\n".join(report(report_module, results).derived())
    assert "**met** (1.45 (1.40..1.50)x)" in text
    assert "Capture off" not in text
