"""The quickstart's second task (``--task agent``): an order-support agent with tools.

The world is a shop generated from a seed: orders (an id, a status, the return id a
return of it would get) and stock (a count per SKU). The agent is offered three tools —
``lookup_order(order_id)``, ``check_stock(sku)``, ``open_return(order_id, reason)`` with
``reason`` one of ``damaged``, ``wrong_item``, ``unwanted`` — and each customer request
needs exactly one of them:

- "Where is my order A-10432?" → ``lookup_order`` → the answer names the status;
- "Is the KB-220 in stock?" → ``check_stock`` → the answer names the count;
- "Order A-10432 arrived broken, I want to return it." → ``open_return`` with reason
  ``damaged`` → the answer names the return id the tool gave.

**An episode succeeds** when the agent's first turn makes exactly the right call (the
right tool, arguments equal as JSON values) and its next turn, after the tool's result,
answers in plain text (no calls, no tool markup such as ``<tool_response>``) naming the
fact that result holds (the status, the count, the return id; a whole word, case
folded). Anything else fails, and the application knows which turn went wrong and what
it should have been: the first turn (the right call) or the answer (a sentence naming
the fact) — the correction it posts.

Requests are written from phrasing templates; every fourth template of each intent is
**reserved for the held-out set**, and every request names an order (or asks about a
SKU) drawn for it alone, so held-out success measures phrasings and orders the traffic
never showed. Torch- and SDK-free: the tests import it as it is.
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from reef.quickstart.errors import QuickstartError

SYSTEM_PROMPT = (
    "You are the order-support agent of a shop. Use a tool to answer, then tell the "
    "customer the result in one sentence."
)
REASONS: tuple[str, ...] = ("damaged", "wrong_item", "unwanted")
STATUSES: tuple[str, ...] = ("processing", "shipped", "delivered", "cancelled")
MAX_TURNS = 3  # model calls per episode: a call, the answer, one spare


def _tool(name: str, description: str, parameters: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {
                "type": "object",
                "properties": parameters,
                "required": list(parameters),
            },
        },
    }


# Short on purpose: the engine writes every tool into every prompt, and on two CPU cores
# every prompt token is paid for by every request and every training step.
TOOLS: list[dict[str, Any]] = [
    _tool("lookup_order", "Status of an order.", {"order_id": {"type": "string"}}),
    _tool("check_stock", "Units in stock of a product.", {"sku": {"type": "string"}}),
    _tool(
        "open_return",
        "Open a return of an order.",
        {"order_id": {"type": "string"}, "reason": {"type": "string", "enum": list(REASONS)}},
    ),
]

PRODUCTS: dict[str, str] = {
    "KB-220": "keyboard",
    "MS-310": "mouse",
    "HD-450": "headset",
    "CM-120": "webcam",
    "SP-700": "speaker",
    "MN-240": "monitor",
    "CH-550": "charger",
    "DK-810": "docking station",
    "TB-330": "tablet",
    "RT-160": "router",
    "LS-905": "laptop stand",
    "MC-215": "microphone",
}

# Intent -> phrasing templates ({order}, {sku}, {product}). Every fourth is held out.
_TEMPLATES: dict[str, tuple[str, ...]] = {
    "status": (
        "Where is my order {order}?",
        "What is the status of order {order}?",
        "Has my order {order} shipped yet?",
        "Can you check on order {order} for me?",
        "I ordered something last week, order number {order}. Any news?",
        "Is order {order} on its way?",
        "Please look up my order {order}.",
        "Order {order}: what's happening with it?",
    ),
    "stock": (
        "Is the {product} {sku} in stock?",
        "Do you have any {sku} left?",
        "How many {product}s ({sku}) do you have?",
        "Can I still buy the {sku} {product}?",
        "Is {sku} available right now?",
        "Check stock for {sku}, please.",
        "Are there units of the {product} {sku} in your warehouse?",
        "I want the {sku}. Do you have it?",
    ),
    "damaged": (
        "My order {order} arrived broken. I want to return it.",
        "Order {order} came damaged, please start a return.",
        "The item in order {order} is cracked, I'd like to send it back.",
        "I need to return order {order}, it was damaged in shipping.",
    ),
    "wrong_item": (
        "You sent me the wrong item in order {order}. I want to return it.",
        "Order {order} is not what I ordered, please open a return.",
        "I got a different product than I bought in order {order}; return it please.",
        "Wrong item delivered for order {order}, I need a return.",
    ),
    "unwanted": (
        "I changed my mind about order {order}, please open a return.",
        "I no longer need order {order}. Can I return it?",
        "Please return order {order}, I don't want it anymore.",
        "I'd like to send back order {order}, I don't need it after all.",
    ),
}
# The traffic's mix: a third each of status, stock and returns (the returns split).
_MIX: tuple[str, ...] = ("status", "stock", "damaged", "status", "stock", "wrong_item")
_MIX += ("status", "stock", "unwanted")


@dataclass(frozen=True)
class Call:
    """A tool call: the function's ``name`` and its ``arguments`` (a JSON value; an
    object when the model wrote one)."""

    name: str
    arguments: Any

    def to_openai(self, index: int = 0) -> dict[str, Any]:
        """The call as an item of an OpenAI message's ``tool_calls``."""
        return {
            "id": f"call_{index}",
            "type": "function",
            "function": {"name": self.name, "arguments": json.dumps(self.arguments)},
        }


@dataclass(frozen=True)
class Order:
    """One order of the shop."""

    order_id: str
    status: str
    return_id: str


@dataclass(frozen=True)
class World:
    """The shop: its orders and its stock. Tools read it and never change it (a return's
    id is fixed per order), so an episode's grade depends on its calls alone."""

    orders: Mapping[str, Order]
    stock: Mapping[str, int]

    def execute(self, call: Call) -> dict[str, Any]:
        """What the tool answers to ``call`` (an ``error`` for bad arguments)."""
        args = call.arguments if isinstance(call.arguments, dict) else {}
        order = self.orders.get(str(args.get("order_id", "")))
        if call.name == "lookup_order":
            if order is None:
                return {"error": "no such order"}
            return {"order_id": order.order_id, "status": order.status}
        if call.name == "check_stock":
            sku = str(args.get("sku", ""))
            if sku not in self.stock:
                return {"error": "no such sku"}
            return {"sku": sku, "in_stock": self.stock[sku]}
        if call.name == "open_return":
            if order is None:
                return {"error": "no such order"}
            if args.get("reason") not in REASONS:
                return {"error": f"reason must be one of {', '.join(REASONS)}"}
            return {"return_id": order.return_id, "order_id": order.order_id}
        return {"error": f"unknown tool {call.name}"}


@dataclass(frozen=True)
class Request:
    """One customer request: its text, the call that serves it, the fact the answer
    must name, the answer a good agent gives, and the template it was written from."""

    text: str
    intent: str
    call: Call
    fact: str
    answer: str
    template: str = ""


@dataclass(frozen=True)
class Turn:
    """One model turn of an episode: the reply's text, its calls, its record."""

    text: str
    calls: tuple[Call, ...] = ()
    record_id: str | None = None


@dataclass(frozen=True)
class Verdict:
    """An episode's grade: ``success``, else the index of the turn that went wrong and
    what it should have been (``{"tool_calls": [...]}`` or the answer's text)."""

    success: bool
    wrong_turn: int | None = None
    correction: Any = None
    why: str = ""


def grade(request: Request, turns: Sequence[Turn]) -> Verdict:
    """The application's rule (module docstring)."""
    if not turns or turns[0].calls != (request.call,):
        made = ", ".join(c.name for c in turns[0].calls) if turns and turns[0].calls else "none"
        return Verdict(
            False, 0, {"tool_calls": [request.call.to_openai()]}, f"first turn called {made}"
        )
    if len(turns) < 2 or turns[1].calls:
        return Verdict(False, 1, request.answer, "no answer after the tool's result")
    if not answers(turns[1].text, request.fact):
        return Verdict(False, 1, request.answer, f"the answer does not say {request.fact!r}")
    return Verdict(True)


def answers(text: str, fact: str) -> bool:
    """Whether ``text`` is a plain-text answer (no tool markup) naming ``fact``."""
    return "<tool" not in text.casefold() and names(text, fact)


def answer_pattern(fact: str) -> str:
    """``answers`` as a pattern for the gate's ``regex`` scorer (IGNORECASE)."""
    return rf"^(?![\s\S]*<tool)[\s\S]*(?<![\w-]){re.escape(fact)}(?![\w-])"


def names(text: str, fact: str) -> bool:
    """Whether ``text`` holds ``fact`` as a whole word, case folded."""
    pattern = rf"(?<![\w-]){re.escape(fact.casefold())}(?![\w-])"
    return re.search(pattern, text.casefold()) is not None


def parse_arguments(text: str | None) -> Any:
    """A call's arguments as a JSON value (the raw text when it is not JSON)."""
    try:
        return json.loads(text or "{}")
    except ValueError:
        return text


def _reserved(index: int) -> bool:
    """Every fourth template of an intent is reserved for the held-out set."""
    return index % 4 == 3


@dataclass
class RequestGenerator:
    """Draws distinct requests over one world. ``held_out=True`` draws only from the
    reserved templates, ``False`` only from the others; every order serves one request
    at most, so the sets share no order (stock requests share the dozen SKUs)."""

    seed: int
    world: World = field(init=False)
    _rng: random.Random = field(init=False, repr=False)
    _free: list[str] = field(init=False, repr=False)
    _seen: set[str] = field(init=False, repr=False, default_factory=set)

    def __post_init__(self) -> None:
        self._rng = random.Random(self.seed)  # noqa: S311 (seeded or non-secret randomness)
        orders: dict[str, Order] = {}
        while len(orders) < 3000:
            order_id = f"{self._rng.choice('ABCDEFGH')}-{self._rng.randint(10000, 99999)}"
            return_id = f"R-{self._rng.randint(1000, 9999)}"
            orders[order_id] = Order(order_id, self._rng.choice(STATUSES), return_id)
        stock = {sku: self._rng.randint(0, 40) for sku in PRODUCTS}
        self.world = World(orders, stock)
        self._free = list(orders)

    def draw(self, count: int, held_out: bool) -> list[Request]:
        """``count`` new requests, intents mixed; ``QuickstartError`` when they run dry."""
        requests = [self._one(_MIX[i % len(_MIX)], held_out) for i in range(count)]
        self._rng.shuffle(requests)
        return requests

    def _one(self, intent: str, held_out: bool) -> Request:
        templates = [t for i, t in enumerate(_TEMPLATES[intent]) if _reserved(i) == held_out]
        if intent == "stock":
            return self._stock(templates)
        if not self._free:
            raise QuickstartError("the shop ran out of orders; ask for fewer requests")
        order = self.world.orders[self._free.pop(self._rng.randrange(len(self._free)))]
        template = self._rng.choice(templates)
        text = template.format(order=order.order_id)
        if intent == "status":
            call = Call("lookup_order", {"order_id": order.order_id})
            answer = f"Order {order.order_id} is {order.status}."
            return Request(text, intent, call, order.status, answer, template)
        call = Call("open_return", {"order_id": order.order_id, "reason": intent})
        answer = f"Return {order.return_id} is open for order {order.order_id}."
        return Request(text, "return", call, order.return_id, answer, template)

    def _stock(self, templates: list[str]) -> Request:
        """A stock request; its text new unless 200 draws found none (a dozen SKUs)."""
        for _ in range(200):
            template, sku = self._rng.choice(templates), self._rng.choice(sorted(PRODUCTS))
            text = template.format(sku=sku, product=PRODUCTS[sku])
            if text not in self._seen:
                break
        self._seen.add(text)
        count = self.world.stock[sku]
        call = Call("check_stock", {"sku": sku})
        return Request(
            text, "stock", call, str(count), f"We have {count} {sku} in stock.", template
        )


def suite_items(requests: Sequence[Request], world: World, prefix: str) -> list[dict[str, Any]]:
    """Gate items of ``requests``, two per request: its first turn (the reference is the
    right call, scored by ``tool_call``) and its answer after the right call's result
    (scored by ``regex``: the fact in plain text, as ``answers`` reads it); both offered
    the tools."""
    items: list[dict[str, Any]] = []
    for index, request in enumerate(requests):
        user = {"role": "user", "content": request.text}
        call = request.call.to_openai()
        result = json.dumps(world.execute(request.call))
        items.append(
            {
                "id": f"{prefix}-{index}-call",
                "messages": [user],
                "reference": {"tool_calls": [call]},
                "scorer": {"type": "tool_call"},
                "params": {"tools": TOOLS},
            }
        )
        answered = [
            user,
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": call["id"], "content": result},
        ]
        items.append(
            {
                "id": f"{prefix}-{index}-answer",
                "messages": answered,
                "reference": answer_pattern(request.fact),
                "scorer": {"type": "regex", "flags": ["IGNORECASE"]},
                "params": {"tools": TOOLS},
            }
        )
    return items


__all__ = [
    "MAX_TURNS",
    "SYSTEM_PROMPT",
    "TOOLS",
    "Call",
    "Request",
    "RequestGenerator",
    "Turn",
    "Verdict",
    "World",
    "answer_pattern",
    "answers",
    "grade",
    "names",
    "parse_arguments",
    "suite_items",
]
