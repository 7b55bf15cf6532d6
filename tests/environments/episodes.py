"""What the episode tests share: the orders environment, a return task and the script
of a model that handles it."""

from __future__ import annotations

from typing import Any

from reef.environments import ChatEndpoint, Environment, Task, build_environment
from tests.fakes.scripted import calls, tool_call

RETURN = Task(
    "return-kettle",
    ({"role": "user", "content": "My kettle from order A100 is broken, I want to return it."},),
    {"return_opened": "A100", "answer_contains": ["R-A100"]},
)


def orders(**limits: Any) -> Environment:
    return build_environment({"type": "python", "toolset": "orders", "limits": limits})


def endpoint(base_url: str, **options: Any) -> ChatEndpoint:
    return ChatEndpoint(base_url=base_url, model="fake-model", **options)


SUPPORT_SCRIPT = [
    calls(tool_call("a", "lookup_order", {"order_id": "A100"})),
    calls(
        tool_call("b", "check_stock", {"item": "kettle"}),
        tool_call("c", "open_return", {"order_id": "A100", "reason": "broken"}),
    ),
    {"content": "Your return R-A100 is open; a new kettle is in stock."},
]
