"""JSON Schemas of the inference request bodies, for the OpenAPI document.

They state what ``reef.gateway.body_checks`` enforces, no more and no less: the types and
bounds of the fields Reef reads, ``null`` allowed where the check treats it as absent,
every other field open (passed through to the upstream). ``tests/gateway/
test_body_checks.py`` validates each body it sends against these schemas, so a body the
gateway refuses is one the document says is invalid, and the other way round.
"""

from __future__ import annotations

from typing import Any

from reef.core.jsoncodec import MAX_DEPTH
from reef.gateway.body_checks import (
    ANTHROPIC_TOOL_CHOICES,
    EMBEDDING_ENCODINGS,
    MAX_CHOICES,
    MAX_COMPLETION_LOGPROBS,
    MAX_COUNT,
    MAX_EMBEDDING_DIMENSIONS,
)
from reef.gateway.responses.checks import (
    FORMAT_TYPES,
    REASONING_EFFORTS,
    TOOL_CHOICES,
    UNSUPPORTED_FIELDS,
)

_INT64 = 2**63
_NESTING = f" Bodies nested deeper than {MAX_DEPTH} levels of arrays and objects are refused."


def _maybe(kind: str | list[str], **more: Any) -> dict[str, Any]:
    """A field of this JSON type, or ``null``."""
    kinds = [kind] if isinstance(kind, str) else list(kind)
    return {"type": [*kinds, "null"], **more}


def _counts(lowest: int, highest: int) -> dict[str, Any]:
    return _maybe("integer", minimum=lowest, maximum=highest)


_STRINGS = {"type": "array", "items": {"type": "string"}}
_COMMON = {
    "model": _maybe(
        "string", description="A model, `reef/<scenario>`, or a scenario's model alias."
    ),
    "stream": _maybe("boolean"),
    "max_tokens": _counts(1, MAX_COUNT),
    "temperature": _maybe("number", minimum=0),
    "top_p": _maybe("number", minimum=0, maximum=1),
}


def _request(
    title: str, description: str, message: dict[str, Any], **fields: Any
) -> dict[str, Any]:
    return {
        "title": title,
        "type": "object",
        "description": description + _NESTING,
        "required": ["messages"],
        "properties": {
            "messages": {"type": "array", "minItems": 1, "items": message},
            **_COMMON,
            **fields,
        },
        "additionalProperties": True,
    }


def chat_completion_request() -> dict[str, Any]:
    """``POST /v1/chat/completions``."""
    part = {"type": "object", "required": ["type"], "properties": {"type": {"type": "string"}}}
    # a tool call, and a tool: both objects whose function (if any) has a string name
    call = {
        "type": "object",
        "properties": {"function": _maybe("object", properties={"name": _maybe("string")})},
    }
    message = {
        "type": "object",
        "required": ["role"],
        "properties": {
            "role": {"type": "string"},
            "content": _maybe(["string", "array"], items=part),
            "tool_calls": _maybe("array", items=call),
            "tool_call_id": _maybe("string"),
            "name": _maybe("string"),
        },
    }
    return _request(
        "ChatCompletionRequest",
        "An OpenAI chat completion request: the fields Reef reads are typed here, any "
        "other is passed to the upstream.",
        message,
        stream_options=_maybe("object", properties={"include_usage": _maybe("boolean")}),
        tools=_maybe("array", items=call),
        tool_choice=_maybe(["string", "object"]),
        stop={"oneOf": [{"type": ["string", "null"]}, _STRINGS]},
        n=_counts(1, MAX_CHOICES),
        max_completion_tokens=_counts(1, MAX_COUNT),
        seed=_counts(-_INT64, _INT64 - 1),
        presence_penalty=_maybe("number"),
        frequency_penalty=_maybe("number"),
    )


def _inputs(description: str) -> dict[str, Any]:
    """A completion's ``prompt`` or an embedding's ``input``."""
    tokens = {
        "type": "array",
        "minItems": 1,
        "items": {"type": "integer", "minimum": 0, "maximum": MAX_COUNT},
    }
    return {
        "description": description,
        "oneOf": [
            {"type": "string"},
            {"type": "array", "minItems": 1, "items": {"type": "string"}},
            tokens,
            {"type": "array", "minItems": 1, "items": tokens},
        ],
    }


def completion_request() -> dict[str, Any]:
    """``POST /v1/completions`` (legacy text completions)."""
    return {
        "title": "CompletionRequest",
        "type": "object",
        "description": "An OpenAI legacy text completion request: the fields Reef reads "
        "are typed here, any other is passed to the upstream." + _NESTING,
        "required": ["prompt"],
        "properties": {
            "prompt": _inputs(
                "A text, several texts, token ids, or several prompts of token ids (the "
                "record's canonical form holds the first prompt)."
            ),
            **_COMMON,
            "stream_options": _maybe("object", properties={"include_usage": _maybe("boolean")}),
            "stop": {"oneOf": [{"type": ["string", "null"]}, _STRINGS]},
            "echo": _maybe("boolean"),
            "suffix": _maybe("string"),
            "n": _counts(1, MAX_CHOICES),
            "logprobs": _counts(0, MAX_COMPLETION_LOGPROBS),
            "seed": _counts(-_INT64, _INT64 - 1),
        },
        "additionalProperties": True,
    }


def embeddings_request() -> dict[str, Any]:
    """``POST /v1/embeddings``."""
    return {
        "title": "EmbeddingsRequest",
        "type": "object",
        "description": "An OpenAI embeddings request: the fields Reef reads are typed "
        "here, any other is passed to the upstream." + _NESTING,
        "required": ["input"],
        "properties": {
            "input": _inputs("A text, several texts, token ids, or several inputs of them."),
            "model": _maybe(
                "string",
                description="An embedding model (sent upstream as named), or "
                "`reef/<scenario>` / a model alias for the scenario's configured model.",
            ),
            "dimensions": _counts(1, MAX_EMBEDDING_DIMENSIONS),
            "encoding_format": {"enum": [*EMBEDDING_ENCODINGS, None]},
        },
        "additionalProperties": True,
    }


def _block() -> dict[str, Any]:
    """An Anthropic content block; the fields of its ``type`` that the translation reads."""
    by_type = {
        "text": {"required": ["text"], "properties": {"text": {"type": "string"}}},
        "image": {"properties": {"source": _maybe("object")}},
        "tool_use": {
            "properties": {
                "id": _maybe("string"),
                "name": _maybe("string"),
                "input": _maybe("object"),
            }
        },
        "tool_result": {
            "properties": {
                "tool_use_id": _maybe("string"),
                "is_error": _maybe("boolean"),
                # blocks inside a result are checked like any other; the schema recurses
                "content": _maybe(["string", "array"], items={"$ref": "#"}),
            }
        },
    }
    return {
        "type": "object",
        "required": ["type"],
        "properties": {"type": {"type": "string"}},
        "allOf": [
            {"if": {"properties": {"type": {"const": kind}}}, "then": then}
            for kind, then in by_type.items()
        ],
    }


def messages_request() -> dict[str, Any]:
    """``POST /v1/messages``. ``max_tokens`` is optional here: an OpenAI-compatible
    upstream does without it (an Anthropic one refuses the request, relayed)."""
    block = _block()
    # "#" inside a block means the block itself (tool_result content): give it a home.
    block_ref = "#/components/schemas/AnthropicContentBlock"
    _point_refs(block, block_ref)
    blocks = {"type": "array", "items": {"$ref": block_ref}}
    message = {
        "type": "object",
        "required": ["role", "content"],
        "properties": {
            "role": {"type": "string"},
            "content": {"oneOf": [{"type": "string"}, blocks]},
        },
    }
    tool = {
        "type": "object",
        "properties": {
            "name": _maybe("string"),
            "description": _maybe("string"),
            "input_schema": _maybe("object"),
        },
    }
    tool_choice = {
        "type": ["object", "null"],
        "required": ["type"],
        "properties": {
            "type": {"enum": list(ANTHROPIC_TOOL_CHOICES)},
            "disable_parallel_tool_use": _maybe("boolean"),
        },
        "if": {"type": "object", "properties": {"type": {"const": "tool"}}},
        "then": {"required": ["name"], "properties": {"name": {"type": "string"}}},
    }
    schema = _request(
        "MessagesRequest",
        "An Anthropic messages request: the fields Reef reads are typed here, any other "
        "is passed to the upstream.",
        message,
        system={"oneOf": [{"type": ["string", "null"]}, blocks]},
        tools=_maybe("array", items=tool),
        tool_choice=tool_choice,
        metadata=_maybe("object", properties={"user_id": _maybe("string")}),
        stop_sequences=_maybe("array", items={"type": "string"}),
        top_k=_counts(0, MAX_COUNT),
    )
    return {"MessagesRequest": schema, "AnthropicContentBlock": block}


def _point_refs(schema: Any, target: str) -> None:
    if isinstance(schema, dict):
        if schema.get("$ref") == "#":
            schema["$ref"] = target
        for value in schema.values():
            _point_refs(value, target)
    elif isinstance(schema, list):
        for value in schema:
            _point_refs(value, target)


def responses_request() -> dict[str, Any]:
    """``POST /v1/responses``: unlike the other two bodies, closed — every field is
    translated (or ignored as harmless) by Reef, and any other is refused
    (``reef.gateway.responses.checks``)."""
    text_part = {
        "type": "object",
        "required": ["type", "text"],
        "properties": {"type": {"enum": ["input_text", "output_text"]}, "text": {"type": "string"}},
    }
    refusal = {
        "type": "object",
        "required": ["type", "refusal"],
        "properties": {"type": {"const": "refusal"}, "refusal": {"type": "string"}},
    }
    image = {
        "type": "object",
        "required": ["type", "image_url"],
        "properties": {"type": {"const": "input_image"}, "image_url": {"type": "string"}},
    }
    message = {
        "type": "object",
        "required": ["role", "content"],
        "properties": {
            "type": {"const": "message"},
            "role": {"enum": ["user", "assistant", "system", "developer"]},
            "content": {
                "oneOf": [
                    {"type": "string"},
                    {"type": "array", "items": {"oneOf": [text_part, refusal, image]}},
                ]
            },
        },
    }
    call = {
        "type": "object",
        "required": ["type", "call_id", "name", "arguments"],
        "properties": {
            "type": {"const": "function_call"},
            **{key: {"type": "string"} for key in ("call_id", "name", "arguments")},
        },
    }
    output = {
        "type": "object",
        "required": ["type", "call_id", "output"],
        "properties": {
            "type": {"const": "function_call_output"},
            "call_id": {"type": "string"},
            "output": {
                "oneOf": [
                    {"type": "string"},
                    {
                        "type": "array",
                        "items": {
                            **text_part,
                            "properties": {
                                "type": {"const": "input_text"},
                                "text": {"type": "string"},
                            },
                        },
                    },
                ]
            },
        },
    }
    tool = {
        "type": "object",
        "required": ["type", "name"],
        "properties": {
            "type": {"const": "function"},
            "name": {"type": "string"},
            "description": _maybe("string"),
            "parameters": _maybe("object"),
            "strict": _maybe("boolean"),
        },
    }
    fmt = {
        "type": ["object", "null"],
        "required": ["type"],
        "properties": {"type": {"enum": list(FORMAT_TYPES)}},
        "if": {"type": "object", "properties": {"type": {"const": "json_schema"}}},
        "then": {
            "required": ["name", "schema"],
            "properties": {"name": {"type": "string"}, "schema": {"type": "object"}},
        },
    }
    unsupported = {"type": "null", "description": "Not supported: refused unless null."}
    return {
        "title": "ResponsesRequest",
        "type": "object",
        "description": "An OpenAI Responses request, translated into chat completions for "
        "the scenario's upstream. Reasoning items, built-in tools and any field or item "
        "type not listed here are refused with a 400 naming them." + _NESTING,
        "required": ["input"],
        "properties": {
            "model": _COMMON["model"],
            "input": {
                "oneOf": [
                    {"type": "string"},
                    {"type": "array", "minItems": 1, "items": {"oneOf": [message, call, output]}},
                ]
            },
            "instructions": _maybe("string"),
            "previous_response_id": _maybe(
                "string", description="A response Reef stored, of this scenario."
            ),
            "store": _maybe("boolean", description="`false`: keep nothing retrievable."),
            "stream": _maybe("boolean"),
            "stream_options": _maybe("object"),
            "tools": _maybe("array", items=tool),
            "tool_choice": {
                "oneOf": [
                    {"enum": [*TOOL_CHOICES, None]},
                    {
                        "type": "object",
                        "required": ["type", "name"],
                        "properties": {"type": {"const": "function"}, "name": {"type": "string"}},
                    },
                ]
            },
            "parallel_tool_calls": _maybe("boolean"),
            "temperature": _maybe("number", minimum=0, maximum=2),
            "top_p": _COMMON["top_p"],
            "max_output_tokens": _counts(1, MAX_COUNT),
            "text": _maybe("object", properties={"format": fmt}, additionalProperties=unsupported),
            "metadata": _maybe("object", additionalProperties={"type": "string"}),
            "reasoning": _maybe(
                "object",
                properties={
                    "effort": {"enum": [*REASONING_EFFORTS, None]},
                    "summary": unsupported,
                    "generate_summary": unsupported,
                },
            ),
            "truncation": {"enum": ["disabled", None]},
            "include": _maybe("array", maxItems=0),
            "background": {"enum": [False, None]},
            "user": _maybe("string"),
            "safety_identifier": _maybe("string"),
            "prompt_cache_key": _maybe("string"),
            "service_tier": _maybe("string"),
            **{key: unsupported for key in UNSUPPORTED_FIELDS},
        },
        "additionalProperties": False,
    }
