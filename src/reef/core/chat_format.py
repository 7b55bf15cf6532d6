"""The chat and tool-call format: the default tool prompt, the call format, its parser.

One format, shared by the engine (which renders prompts and parses replies) and the
model learners (which train adapters on conversations rendered here), so an adapter
trained on tool-using trajectories emits calls the engine parses. It is the Hermes /
Qwen2.5 format:

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

When a chat template takes no ``tools`` (SmolLM2's, the tiny model's), the offered
tools go into the system message as :func:`tool_prompt` writes them; assistant turns'
``tool_calls`` become such blocks in the assistant's text and ``tool`` results become a
user turn of ``<tool_response>`` blocks. A template that takes ``tools`` gets them and
the messages as they are (arguments as objects, as Hugging Face templates expect); it
is assumed to speak the same format, as Hermes and Qwen templates do.

It lives in ``core`` because both sides write conversations down this way: the engine
and the learners import it, and it imports neither, so a learner needs no inference
server to know how a conversation is written. Torch-free and free of the ``local`` extra
(jinja2 is imported only to read a template).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

TOOL_CALL_OPEN = "<tool_call>"
TOOL_CALL_CLOSE = "</tool_call>"
TOOL_RESPONSE_OPEN = "<tool_response>"
TOOL_RESPONSE_CLOSE = "</tool_response>"

TOOL_PROMPT_HEAD = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
)
TOOL_PROMPT_TAIL = (
    "</tools>\n\nFor each function call, return a json object with function name and "
    "arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n"
    '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
)

ChoiceMode = Literal["auto", "none", "required", "function"]


@dataclass(frozen=True)
class ToolChoice:
    """A request's ``tool_choice``: ``auto``, ``none``, ``required``, or ``function``
    with the ``name`` of the one function the reply must call."""

    mode: ChoiceMode = "auto"
    name: str | None = None

    @property
    def calls_allowed(self) -> bool:
        """Whether tools are rendered and replies parsed for calls."""
        return self.mode != "none"


AUTO = ToolChoice()


@dataclass(frozen=True)
class ToolCall:
    """A parsed call: an OpenAI-style ``id``, the function ``name``, and its
    ``arguments`` as JSON text (an object)."""

    id: str
    name: str
    arguments: str

    def to_openai(self) -> dict[str, Any]:
        """The call as an item of an OpenAI message's ``tool_calls``."""
        return {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        }


@dataclass(frozen=True)
class ParsedReply:
    """Generated text split into what the user reads and the calls it makes."""

    content: str
    calls: tuple[ToolCall, ...]


@dataclass(frozen=True)
class RenderedChat:
    """What goes through the chat template: ``messages``, the ``template_tools`` to
    pass as its ``tools`` (None when it takes none or none are offered), and the
    ``prefill`` that starts the assistant's reply (empty unless a call is forced)."""

    messages: list[dict[str, Any]]
    template_tools: list[dict[str, Any]] | None
    prefill: str


def template_takes_tools(template: str | None) -> bool:
    """Whether a Jinja chat template reads a ``tools`` variable."""
    if not template:
        return False
    from jinja2 import Environment, TemplateSyntaxError, meta  # with the local extra only

    try:
        environment = Environment()  # noqa: S701 (parsed, never rendered: nothing to escape)
        return "tools" in meta.find_undeclared_variables(environment.parse(template))
    except TemplateSyntaxError:
        return "tools" in template


def tool_names(tools: Sequence[Mapping[str, Any]]) -> frozenset[str]:
    """The function names of OpenAI ``tools``."""
    return frozenset(str(tool.get("function", {}).get("name", "")) for tool in tools)


def tool_prompt(tools: Sequence[Mapping[str, Any]], choice: ToolChoice = AUTO) -> str:
    """The default tool prompt: each tool as one JSON line (name, description,
    parameters, in that order), the call format, and what ``choice`` demands."""
    lines = "".join(json.dumps(_tool_line(tool), ensure_ascii=False) + "\n" for tool in tools)
    prompt = TOOL_PROMPT_HEAD + lines + TOOL_PROMPT_TAIL
    if choice.mode == "required":
        prompt += "\n\nYou must call at least one function."
    elif choice.mode == "function":
        prompt += f"\n\nYou must call the function {choice.name}."
    return prompt


def _tool_line(tool: Mapping[str, Any]) -> dict[str, Any]:
    function = tool.get("function", {})
    line: dict[str, Any] = {"name": function.get("name", "")}
    if function.get("description"):
        line["description"] = function["description"]
    line["parameters"] = function.get("parameters") or {"type": "object", "properties": {}}
    return {"type": "function", "function": line}


def format_tool_call(name: str, arguments: Mapping[str, Any] | str) -> str:
    """One call in the format the engine parses (arguments given as an object or as
    OpenAI's JSON text; text that is no JSON object is kept as a string)."""
    body = {"name": name, "arguments": _arguments_object(arguments)}
    return f"{TOOL_CALL_OPEN}\n{json.dumps(body, ensure_ascii=False)}\n{TOOL_CALL_CLOSE}"


def _arguments_object(arguments: Any) -> Any:
    """``arguments`` as an object when it is one or JSON text of one; else unchanged
    (a model may write any JSON value there, and the parser then refuses the call)."""
    if arguments is None:
        return {}
    if isinstance(arguments, Mapping):
        return dict(arguments)
    if not isinstance(arguments, str):
        return arguments
    try:
        parsed = json.loads(arguments)
    except (ValueError, RecursionError):
        return arguments
    return parsed if isinstance(parsed, dict) else arguments


def call_prefill(choice: ToolChoice) -> str:
    """The start of a reply that ``choice`` forces: a named function's call up to its
    arguments, or for ``required`` the opening of some call; else nothing."""
    if choice.mode == "function":
        return f'{TOOL_CALL_OPEN}\n{{"name": {json.dumps(choice.name)}, "arguments": '
    if choice.mode == "required":
        return f'{TOOL_CALL_OPEN}\n{{"name": "'
    return ""


def render_tools(
    messages: Sequence[Mapping[str, Any]],
    tools: Sequence[Mapping[str, Any]] | None,
    choice: ToolChoice = AUTO,
    *,
    template_takes_tools: bool,
) -> RenderedChat:
    """Prepare a conversation with tools for a chat template.

    ``messages`` are chat-template messages (text ``content``; assistant
    ``tool_calls`` in OpenAI's shape; ``tool`` results). With ``template_takes_tools``
    the tools and messages pass through (arguments as objects); otherwise the tool
    prompt joins the system message and calls and results become text (see the module
    docstring). ``choice`` ``none`` renders no tools; past calls render either way.
    ``required`` with a single tool is that tool's named choice.
    """
    offered = [dict(tool) for tool in tools or ()] if choice.calls_allowed else []
    if choice.mode == "required" and len(offered) == 1:  # one tool: required names it
        choice = ToolChoice("function", str(offered[0].get("function", {}).get("name", "")))
    prefill = call_prefill(choice) if offered else ""
    if template_takes_tools:
        return RenderedChat([_with_argument_objects(m) for m in messages], offered or None, prefill)
    rendered = _calls_as_text(messages)
    if offered:
        rendered = _with_system(rendered, tool_prompt(offered, choice))
    return RenderedChat(rendered, None, prefill)


def _with_argument_objects(message: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(message)
    if out.get("tool_calls"):
        out["tool_calls"] = [
            {**call, "function": {**function, "arguments": _arguments_object(arguments)}}
            for call in out["tool_calls"]
            for function, arguments in [_function_of(call)]
        ]
    return out


def _function_of(call: Mapping[str, Any]) -> tuple[dict[str, Any], Any]:
    function = dict(call.get("function") or {})
    return function, function.get("arguments")


def _calls_as_text(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    after_tool = False  # consecutive tool results share one user turn
    for message in messages:
        role = message.get("role")
        content = str(message.get("content") or "")
        if role == "tool":
            block = f"{TOOL_RESPONSE_OPEN}\n{content}\n{TOOL_RESPONSE_CLOSE}"
            if after_tool:
                out[-1]["content"] += "\n" + block
            else:
                out.append({"role": "user", "content": block})
            after_tool = True
            continue
        after_tool = False
        rewritten = {k: v for k, v in message.items() if k not in ("tool_calls", "tool_call_id")}
        if role == "assistant" and message.get("tool_calls"):
            rewritten["content"] = assistant_text(message)
        out.append(rewritten)
    return out


def assistant_text(message: Mapping[str, Any]) -> str:
    """The text an assistant turn is in this format: its content, then each of its
    ``tool_calls`` (OpenAI's shape) as a ``<tool_call>`` block, one line apart. What a
    model should generate for that turn, so it is also a training target."""
    content = str(message.get("content") or "")
    calls = [
        format_tool_call(str(function.get("name", "")), arguments or {})
        for call in message.get("tool_calls") or ()
        for function, arguments in [_function_of(call)]
    ]
    return "\n".join([content, *calls] if content else calls)


def _with_system(messages: list[dict[str, Any]], prompt: str) -> list[dict[str, Any]]:
    if messages and messages[0].get("role") == "system":
        first = dict(messages[0])
        first["content"] = f"{first.get('content') or ''}\n\n{prompt}".lstrip("\n")
        return [first, *messages[1:]]
    return [{"role": "system", "content": prompt}, *messages]


def new_call_id() -> str:
    """An id in OpenAI's ``call_…`` form."""
    return f"call_{uuid.uuid4().hex[:24]}"


def parse_call(body: str, names: frozenset[str] | None = None) -> ToolCall | None:
    """The call written between the tags, or None when it is not one: no JSON object,
    no string ``name``, ``arguments`` not an object, or a name outside ``names``."""
    try:
        parsed = json.loads(body)
    except (ValueError, RecursionError):
        return None
    if not isinstance(parsed, dict) or not isinstance(parsed.get("name"), str):
        return None
    arguments = _arguments_object(parsed.get("arguments"))
    if not isinstance(arguments, dict):
        return None
    if names is not None and parsed["name"] not in names:
        return None
    return ToolCall(new_call_id(), parsed["name"], json.dumps(arguments, ensure_ascii=False))


def parse_tool_calls(
    text: str, names: frozenset[str] | None = None, *, parallel: bool = True
) -> ParsedReply:
    """Split generated ``text`` into content and calls (see :class:`ToolCallStream`
    for the rules; this is the same parse over the whole text at once)."""
    stream = ToolCallStream(names, parallel=parallel)
    pieces = [*stream.feed(text), *stream.finish()]
    content = "".join(p for p in pieces if isinstance(p, str))
    return ParsedReply(content, tuple(p for p in pieces if isinstance(p, ToolCall)))


class ToolCallStream:
    """Incremental parse of generated text into text pieces and :class:`ToolCall` s.

    Text streams out as it arrives, except what could still open a call (a partial
    ``<tool_call>``, trailing whitespace); a call comes out whole once its closing tag
    arrives, or at :meth:`finish` when the text ends inside a call whose JSON is
    complete. A block that is no valid call (see :func:`parse_call`) comes back as the
    text it was. Whitespace around calls is dropped; a reply without calls comes out
    exactly as generated. Without ``parallel`` the first call ends the reply: whatever
    follows it is dropped (OpenAI's ``parallel_tool_calls: false``).
    """

    def __init__(self, names: frozenset[str] | None = None, *, parallel: bool = True) -> None:
        self.names = names
        self.parallel = parallel
        self.calls: list[ToolCall] = []
        self._pending = ""
        self._gap = ""  # whitespace between the text and an open call, kept for a bad call
        self._in_call = False
        self._emitted = False

    def feed(self, text: str) -> list[str | ToolCall]:
        """Take the next generated text; return the pieces it completes."""
        self._pending += text
        out: list[str | ToolCall] = []
        while not self.done:
            if self._in_call:
                end = self._pending.find(TOOL_CALL_CLOSE)
                if end < 0:
                    return out
                body, self._pending = (
                    self._pending[:end],
                    self._pending[end + len(TOOL_CALL_CLOSE) :],
                )
                self._close(body, TOOL_CALL_CLOSE, out)
                continue
            if self.calls and not self._emitted:
                self._pending = self._pending.lstrip()
            start = self._pending.find(TOOL_CALL_OPEN)
            if start < 0:
                keep = _held_suffix(self._pending)
                self._text(self._pending[: len(self._pending) - keep], out)
                self._pending = self._pending[len(self._pending) - keep :]
                return out
            before = self._pending[:start]
            self._text(before.rstrip(), out)
            self._gap = before[len(before.rstrip()) :]
            self._pending = self._pending[start + len(TOOL_CALL_OPEN) :]
            self._in_call = True
        self._pending = ""
        return out

    def finish(self) -> list[str | ToolCall]:
        """The text has ended: return what was held back."""
        out: list[str | ToolCall] = []
        pending, self._pending = self._pending, ""
        if self.done:
            return out
        if self._in_call:
            self._close(pending, "", out)
        else:
            self._text(pending.rstrip() if self.calls else pending, out)
        return out

    @property
    def done(self) -> bool:
        """Whether the reply is complete whatever follows: a first call without
        ``parallel``. Nothing more comes out; the caller may stop generating."""
        return bool(self.calls) and not self.parallel

    def _close(self, body: str, closing: str, out: list[str | ToolCall]) -> None:
        self._in_call = False
        call = parse_call(body, self.names)
        if call is None:
            self._text(self._gap + TOOL_CALL_OPEN + body + closing, out)
        else:
            self.calls.append(call)
            out.append(call)

    def _text(self, text: str, out: list[str | ToolCall]) -> None:
        if text:
            out.append(text)
            self._emitted = True


def _held_suffix(text: str) -> int:
    """How many trailing characters might still become part of a call's opening:
    whitespace, then a proper prefix of ``<tool_call>``."""
    for length in range(min(len(TOOL_CALL_OPEN) - 1, len(text)), -1, -1):
        if text.endswith(TOOL_CALL_OPEN[:length]):
            rest = text[: len(text) - length]
            return length + len(rest) - len(rest.rstrip())
    return 0
