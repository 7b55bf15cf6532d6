"""Third-party deprecation notices are hidden by Reef's process entries, narrowly."""

from __future__ import annotations

import subprocess
import sys
import warnings

import pytest

from reef.core.third_party import filter_third_party_warnings


def _shown(category: type[Warning], module: str) -> bool:
    """Whether a warning of ``category`` raised from ``module`` shows once the filter is on."""
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        filter_third_party_warnings()
        warnings.warn_explicit("notice", category, "lib.py", 1, module=module)
    return bool(seen)


@pytest.mark.parametrize(
    "module", ["transformers", "transformers.configuration_utils", "peft.tuners", "trl.trainer"]
)
def test_a_libraries_future_warning_is_hidden(module: str) -> None:
    assert not _shown(FutureWarning, module)


@pytest.mark.parametrize(
    ("category", "module"),
    [
        (FutureWarning, "reef.engine.models"),  # Reef's own: shown
        (FutureWarning, "transformers_helpers"),  # another package, only a similar name
        (UserWarning, "transformers.configuration_utils"),  # another category
        (RuntimeWarning, "torch.nn"),  # torch is not on the list
    ],
)
def test_other_warnings_still_show(category: type[Warning], module: str) -> None:
    assert _shown(category, module)


# Runs an entry as its process would (``--help``: it installs the filter, then exits),
# then raises a transformers FutureWarning in that process.
ENTRY = """
import runpy, sys, warnings
sys.argv = [{module!r}, "--help"]
try:
    runpy.run_module({module!r}, run_name="__main__", alter_sys=True)
except SystemExit:
    pass
warnings.warn_explicit("rope_scaling is deprecated", FutureWarning, "c.py", 1,
                       module="transformers.configuration_utils")
warnings.warn_explicit("reef's own notice", FutureWarning, "m.py", 1, module="reef.x")
"""


@pytest.mark.parametrize("module", ["reef", "reef.engine", "reef.learning.trainers"])
def test_the_process_entries_install_the_filter(module: str) -> None:
    result = subprocess.run(
        [sys.executable, "-W", "default", "-c", ENTRY.format(module=module)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert "rope_scaling" not in result.stderr, result.stderr
    assert "reef's own notice" in result.stderr, result.stderr
