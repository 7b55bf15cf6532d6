"""A toy order-support shop: a toolset for the ``python`` environment (entry point
``orders`` in ``reef.environment_tools``).

Its state is a small order database, seeded per episode from the task's ``setup``
(``orders``, ``stock``; the defaults below otherwise). Tools: ``lookup_order``,
``check_stock``, ``open_return``. ``score`` checks the task's ``expected``:
``return_opened`` (an order id a return must have been opened for), ``no_return``
(true: no return may be opened) and ``answer_contains`` (strings the final answer
holds). It runs in the tool worker, a child process: it may keep module state.
"""

from __future__ import annotations

import copy
from typing import Any

DEFAULT_ORDERS: dict[str, dict[str, Any]] = {
    "A100": {"status": "delivered", "item": "kettle", "days_since_delivery": 5},
    "A101": {"status": "shipped", "item": "toaster", "days_since_delivery": None},
    "A102": {"status": "delivered", "item": "blender", "days_since_delivery": 45},
}
DEFAULT_STOCK: dict[str, int] = {"kettle": 3, "toaster": 0, "blender": 7}
RETURN_WINDOW_DAYS = 30

_state: dict[str, Any] = {}


def use_state(state: dict[str, Any]) -> None:
    """Make ``state`` the shop the tools read and change, in place (a caller that runs
    several shops in one process, as ``bench/rl.py`` does, binds each one's own)."""
    global _state
    _state = state


def reset(task: dict[str, Any]) -> None:
    """Seed the shop from ``task["setup"]`` (or the defaults)."""
    setup = task.get("setup") or {}
    _state["orders"] = copy.deepcopy(setup.get("orders", DEFAULT_ORDERS))
    _state["stock"] = dict(setup.get("stock", DEFAULT_STOCK))
    _state["returns"] = []


def lookup_order(order_id: str) -> dict[str, Any]:
    """Look up an order by its id: its status, item and days since delivery."""
    order = _state["orders"].get(order_id)
    if order is None:
        return {"error": f"no order {order_id}"}
    return {"order_id": order_id, **order}


def check_stock(item: str) -> dict[str, Any]:
    """How many of an item are in stock."""
    return {"item": item, "in_stock": _state["stock"].get(item, 0)}


def open_return(order_id: str, reason: str) -> dict[str, Any]:
    """Open a return for a delivered order within the return window."""
    order = _state["orders"].get(order_id)
    if order is None:
        return {"error": f"no order {order_id}"}
    if order["status"] != "delivered":
        return {"error": f"order {order_id} is not delivered yet"}
    if (order["days_since_delivery"] or 0) > RETURN_WINDOW_DAYS:
        return {"error": f"order {order_id} is past the {RETURN_WINDOW_DAYS}-day return window"}
    _state["returns"].append({"order_id": order_id, "reason": reason})
    return {"return_id": f"R-{order_id}", "order_id": order_id, "status": "opened"}


TOOLS = [lookup_order, check_stock, open_return]


def score(task: dict[str, Any], messages: list[dict[str, Any]]) -> tuple[float, str]:
    """1 when every check of ``task["expected"]`` holds, else 0 with the misses."""
    expected = task.get("expected") or {}
    opened = [r["order_id"] for r in _state["returns"]]
    misses = []
    wanted = expected.get("return_opened")
    if wanted is not None and wanted not in opened:
        misses.append(f"no return was opened for {wanted}")
    if expected.get("no_return") and opened:
        misses.append(f"a return was opened for {', '.join(opened)} though none should be")
    answer = next(
        (str(m.get("content") or "") for m in reversed(messages) if m.get("role") == "assistant"),
        "",
    )
    for text in expected.get("answer_contains") or ():
        if str(text).lower() not in answer.lower():
            misses.append(f"the answer lacks {text!r}")
    if misses:
        return 0.0, "; ".join(misses)
    return 1.0, "every expected check holds"
