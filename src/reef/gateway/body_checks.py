"""Type checks of an inference request body, before Reef reads any of it.

Translation, canonical hashing and harness rendering assume each dialect's shapes; a body
that breaks them is refused here with a 400 naming the field (``InvalidFieldError``, so
OpenAI-shaped errors carry it as ``param``) rather than failing deep inside with a 500.
Only fields Reef itself reads are checked, for their type and for the bounds every server
shares; every other field goes upstream unchanged, for the upstream to judge. ``null``
counts as absent, as both APIs treat it. An integer may be written with a zero fraction
(``79.0``): JSON (and JSON Schema, in which the OpenAPI document states these types) has
one number type, so it is the integer 79, and Reef passes it on as ``79``.
"""

from __future__ import annotations

from typing import Any, Final, NoReturn

from reef.gateway.errors import InvalidFieldError

MAX_COUNT: Final = 2**31 - 1  # token counts: what every server keeps in a 32-bit int
MAX_CHOICES: Final = 128  # OpenAI's own bound on ``n``
MAX_COMPLETION_LOGPROBS: Final = 5  # OpenAI's bound on a legacy completion's ``logprobs``
EMBEDDING_ENCODINGS: Final = ("float", "base64")
MAX_EMBEDDING_DIMENSIONS: Final = 65_536  # past any embedding model's width
_INT64: Final = 2**63
ANTHROPIC_TOOL_CHOICES: Final = ("auto", "any", "tool", "none")
_CONTENT: Final = "a string or an array of content blocks"


def check_openai_chat(body: dict[str, Any]) -> None:
    """Raise ``InvalidFieldError`` unless what Reef reads of a chat-completions body has
    the type the OpenAI API gives it."""
    for index, message in enumerate(check_messages(body)):
        # Most messages are a role and a string: check them without building names.
        content = message.get("content")
        if content is not None and type(content) is not str:
            _openai_parts(content, f"messages[{index}].content")
        if "tool_calls" in message or "tool_call_id" in message or "name" in message:
            _openai_message_extras(message, f"messages[{index}]")
    _common(body)
    options = body.get("stream_options")
    if options is not None:
        optional_boolean(
            require_object(options, "stream_options"), "include_usage", "stream_options"
        )
    for index, tool in enumerate(_optional_array(body, "tools")):
        function = require_object(tool, f"tools[{index}]").get("function")
        if function is not None:
            optional_string(
                require_object(function, f"tools[{index}].function"),
                "name",
                f"tools[{index}].function",
            )
    choice = body.get("tool_choice")
    if choice is not None and not isinstance(choice, str | dict):
        refuse("tool_choice", "a string or an object", choice)
    stop = body.get("stop")
    if stop is not None and not isinstance(stop, str):
        _strings(stop, "stop", "a string or an array of strings")
    check_integer(body, "n", 1, MAX_CHOICES)
    check_integer(body, "max_completion_tokens", 1, MAX_COUNT)
    check_integer(body, "seed", -_INT64, _INT64 - 1)
    for key in ("presence_penalty", "frequency_penalty"):
        check_number(body, key, None, None)


def check_openai_completions(body: dict[str, Any]) -> None:
    """Raise ``InvalidFieldError`` unless what Reef reads of a legacy text completion body
    (``/v1/completions``) has the type the OpenAI API gives it."""
    _inputs(body, "prompt")
    _common(body)
    options = body.get("stream_options")
    if options is not None:
        optional_boolean(
            require_object(options, "stream_options"), "include_usage", "stream_options"
        )
    stop = body.get("stop")
    if stop is not None and not isinstance(stop, str):
        _strings(stop, "stop", "a string or an array of strings")
    optional_boolean(body, "echo", None)
    optional_string(body, "suffix", None)
    check_integer(body, "n", 1, MAX_CHOICES)
    check_integer(body, "logprobs", 0, MAX_COMPLETION_LOGPROBS)
    check_integer(body, "seed", -_INT64, _INT64 - 1)


def check_openai_embeddings(body: dict[str, Any]) -> None:
    """Raise ``InvalidFieldError`` unless what Reef reads of an embeddings body has the
    type the OpenAI API gives it."""
    _inputs(body, "input")
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        refuse("model", "a string", model)
    check_integer(body, "dimensions", 1, MAX_EMBEDDING_DIMENSIONS)
    encoding = body.get("encoding_format")
    if encoding is not None and encoding not in EMBEDDING_ENCODINGS:
        refuse("encoding_format", "'float' or 'base64'", encoding)


def _inputs(body: dict[str, Any], key: str) -> None:
    """A completion's ``prompt`` or an embedding's ``input``: a string, or a non-empty
    array of strings, of token ids, or of arrays of token ids."""
    expected = "a string, or a non-empty array of strings, token ids or arrays of token ids"
    value = body.get(key)
    if value is None:
        raise InvalidFieldError(key, f"request body is missing '{key}'")
    if isinstance(value, str):
        return
    if not isinstance(value, list) or not value:
        refuse(key, expected, value)
    if all(isinstance(item, str) for item in value):
        return
    rows = value if all(isinstance(item, list) for item in value) else [value]
    for row, tokens in enumerate(rows):
        ids = [_whole(token) for token in tokens]
        if not tokens or not all(_is_token(token) for token in ids):
            where = key if rows is not value else f"{key}[{row}]"
            refuse(where, expected, tokens)
        tokens[:] = ids


def _is_token(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_COUNT


def _whole(value: Any) -> Any:
    """``value`` as an ``int`` when it is a float with no fraction (``79.0``), else as is."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def check_anthropic_messages(body: dict[str, Any]) -> None:
    """Raise ``InvalidFieldError`` unless what Reef reads of a Messages body has the type
    the Anthropic API gives it."""
    for index, message in enumerate(check_messages(body)):
        content = message.get("content")
        if type(content) is not str:
            _content_blocks(content, f"messages[{index}].content", required=True)
    system = body.get("system")
    if system is not None and not isinstance(system, str):
        for index, block in enumerate(
            require_array(system, "system", "a string or an array of text blocks")
        ):
            _block(block, f"system[{index}]")
    _common(body)
    for index, tool in enumerate(_optional_array(body, "tools")):
        where = f"tools[{index}]"
        tool = require_object(tool, where)
        optional_string(tool, "name", where)
        optional_string(tool, "description", where)
        if tool.get("input_schema") is not None:
            require_object(tool["input_schema"], f"{where}.input_schema")
    _tool_choice(body.get("tool_choice"))
    metadata = body.get("metadata")
    if metadata is not None:
        optional_string(require_object(metadata, "metadata"), "user_id", "metadata")
    if body.get("stop_sequences") is not None:
        _strings(body["stop_sequences"], "stop_sequences", "an array of strings")
    check_integer(body, "top_k", 0, MAX_COUNT)


def check_messages(body: dict[str, Any]) -> list[dict[str, Any]]:
    """The non-empty ``messages`` list of objects with a ``role``, or ``InvalidFieldError``
    naming the problem."""
    messages = body.get("messages")
    if messages is None:
        raise InvalidFieldError("messages", "request body is missing 'messages'")
    if not isinstance(messages, list) or not messages:
        raise InvalidFieldError("messages", "'messages' must be a non-empty array")
    for index, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise InvalidFieldError(
                f"messages[{index}]", f"messages[{index}] must be an object with a 'role'"
            )
    return messages


def _openai_parts(content: Any, field: str) -> None:
    for index, part in enumerate(require_array(content, field, _CONTENT)):
        _typed_object(part, f"{field}[{index}]", "a content part")


def _openai_message_extras(message: dict[str, Any], where: str) -> None:
    for index, call in enumerate(_optional_array(message, "tool_calls", where)):
        field = f"{where}.tool_calls[{index}]"
        function = require_object(call, field).get("function")
        if function is not None:
            optional_string(
                require_object(function, f"{field}.function"), "name", f"{field}.function"
            )
    for key in ("tool_call_id", "name"):
        optional_string(message, key, where)


def _common(body: dict[str, Any]) -> None:
    """Fields both dialects share."""
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        refuse("model", "a string", model)
    optional_boolean(body, "stream", None)
    check_integer(body, "max_tokens", 1, MAX_COUNT)
    check_number(body, "temperature", 0, None)
    check_number(body, "top_p", 0, 1)


def _content_blocks(value: Any, field: str, required: bool) -> None:
    if value is None and not required:
        return
    if isinstance(value, str):
        return
    for index, block in enumerate(require_array(value, field, _CONTENT)):
        _block(block, f"{field}[{index}]")


def _block(value: Any, field: str) -> None:
    """One Anthropic content block: the fields the translation reads."""
    block = _typed_object(value, field, "a content block")
    kind = block["type"]
    if kind == "text":
        if not isinstance(block.get("text"), str):
            refuse(f"{field}.text", "a string", block.get("text"))
    elif kind == "image":
        if block.get("source") is not None:
            require_object(block["source"], f"{field}.source")
    elif kind == "tool_use":
        for key in ("id", "name"):
            optional_string(block, key, field)
        if block.get("input") is not None:
            require_object(block["input"], f"{field}.input")
    elif kind == "tool_result":
        optional_string(block, "tool_use_id", field)
        optional_boolean(block, "is_error", field)
        _content_blocks(block.get("content"), f"{field}.content", required=False)


def _tool_choice(choice: Any) -> None:
    if choice is None:
        return
    choice = require_object(choice, "tool_choice", 'an object such as {"type": "auto"}')
    if choice.get("type") not in ANTHROPIC_TOOL_CHOICES:
        raise InvalidFieldError(
            "tool_choice.type",
            f"'tool_choice.type' must be one of {', '.join(ANTHROPIC_TOOL_CHOICES)}, "
            f"not {shown(choice.get('type'))}",
        )
    if choice["type"] == "tool" and not isinstance(choice.get("name"), str):
        refuse("tool_choice.name", "a string (the tool to call)", choice.get("name"))
    optional_boolean(choice, "disable_parallel_tool_use", "tool_choice")


# -- the primitives ----------------------------------------------------------------------


def shown(value: Any) -> str:
    """What was sent, briefly: a number or short string itself, else its JSON type."""
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return repr(value) if len(value) <= 40 else "a long string"
    if isinstance(value, list):
        return "an array"
    return "null" if value is None else "an object"


def refuse(field: str, expected: str, value: Any) -> NoReturn:
    raise InvalidFieldError(field, f"'{field}' must be {expected}, not {shown(value)}")


def require_object(value: Any, field: str, expected: str = "an object") -> dict[str, Any]:
    if not isinstance(value, dict):
        refuse(field, expected, value)
    return value


def _typed_object(value: Any, field: str, what: str) -> dict[str, Any]:
    block = require_object(value, field, f"{what} (an object with a 'type')")
    if not isinstance(block.get("type"), str):
        refuse(f"{field}.type", "a string", block.get("type"))
    return block


def require_array(value: Any, field: str, expected: str = "an array") -> list[Any]:
    if not isinstance(value, list):
        refuse(field, expected, value)
    return value


def _strings(value: Any, field: str, expected: str) -> None:
    for index, item in enumerate(require_array(value, field, expected)):
        if not isinstance(item, str):
            refuse(f"{field}[{index}]", "a string", item)


def _joined(parent: str | None, key: str) -> str:
    return key if parent is None else f"{parent}.{key}"


def _optional_array(owner: dict[str, Any], key: str, parent: str | None = None) -> list[Any]:
    value = owner.get(key)
    return [] if value is None else require_array(value, _joined(parent, key))


def _optional(owner: dict[str, Any], key: str, parent: str | None, kind: type, what: str) -> None:
    value = owner.get(key)
    if value is not None and not isinstance(value, kind):
        refuse(_joined(parent, key), what, value)


def optional_string(owner: dict[str, Any], key: str, parent: str | None) -> None:
    _optional(owner, key, parent, str, "a string")


def optional_boolean(owner: dict[str, Any], key: str, parent: str | None) -> None:
    _optional(owner, key, parent, bool, "a boolean")


def check_integer(body: dict[str, Any], key: str, lowest: int, highest: int) -> None:
    """``body[key]``, when present, is an integer from ``lowest`` to ``highest``; one
    written with a zero fraction is replaced by the ``int``."""
    sent = body.get(key)
    if sent is None:
        return
    value = _whole(sent)
    # bool is an int in Python, not in JSON; integers past 64 bits arrive as floats.
    if isinstance(value, bool) or not isinstance(value, int) or not lowest <= value <= highest:
        refuse(key, f"an integer from {lowest} to {highest}", sent)
    body[key] = value


def check_number(
    body: dict[str, Any], key: str, lowest: float | None, highest: float | None
) -> None:
    value = body.get(key)
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int | float):
        refuse(key, "a number", value)
    if (lowest is not None and value < lowest) or (highest is not None and value > highest):
        bounds = f"at least {lowest}" if highest is None else f"from {lowest} to {highest}"
        refuse(key, f"a number {bounds}", value)
