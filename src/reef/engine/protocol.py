"""Request bodies the engine accepts, as pydantic models (OpenAI and vLLM shapes).

Unknown fields are ignored, as OpenAI-compatible servers do: SDKs send fields that a
small engine has no use for (``user``, ``metadata``, penalties).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from reef.core.chat_format import AUTO, ToolChoice
from reef.engine.errors import BadRequestError


class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


class ChatMessage(_Body):
    """One message; ``content`` may be a string, a list of content parts or null."""

    model_config = ConfigDict(extra="allow", frozen=True)

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[dict[str, Any]] | None = None

    @model_validator(mode="after")
    def _tool_calls_are_function_calls(self) -> ChatMessage:
        calls = (self.model_extra or {}).get("tool_calls")
        if calls is None:
            return self
        if not isinstance(calls, list):
            raise ValueError("tool_calls must be an array")
        for index, call in enumerate(calls):
            function = call.get("function") if isinstance(call, dict) else None
            if not isinstance(function, dict) or not isinstance(function.get("name"), str):
                raise ValueError(f"tool_calls[{index}].function.name must be a string")
            if not isinstance(function.get("arguments", ""), str | dict):
                raise ValueError(f"tool_calls[{index}].function.arguments must be a string")
        return self

    def for_template(self) -> dict[str, Any]:
        """The message as chat templates expect it: text content, ``developer`` as
        ``system``, other fields (``tool_calls``, ``name``) passed through."""
        message: dict[str, Any] = dict(self.model_extra or {})
        message["role"] = "system" if self.role == "developer" else self.role
        message["content"] = _text_of(self.content)
        return message


def _text_of(content: str | list[dict[str, Any]] | None) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    parts: list[str] = []
    for part in content:
        if part.get("type") != "text" or not isinstance(part.get("text"), str):
            raise BadRequestError("only text content parts are supported")
        parts.append(part["text"])
    return "".join(parts)


class FunctionDefinition(_Body):
    """A tool's function: a name as OpenAI allows it, a description, JSON-schema
    ``parameters`` (an object)."""

    model_config = ConfigDict(extra="allow", frozen=True)

    name: str = Field(pattern=r"^[A-Za-z0-9_.-]{1,64}$")
    description: str | None = None
    parameters: dict[str, Any] | None = None


class FunctionTool(_Body):
    """One item of ``tools``; only function tools exist on chat completions."""

    model_config = ConfigDict(extra="allow", frozen=True)

    type: Literal["function"]
    function: FunctionDefinition


TOOL_CHOICE_SHAPES = (
    '\'auto\', \'none\', \'required\' or {"type": "function", "function": {"name": ...}}'
)


def read_tool_choice(raw: Any, tools: list[FunctionTool] | None) -> ToolChoice:
    """``tool_choice`` as a :class:`ToolChoice`; absent means ``auto``. Raises
    ``BadRequestError`` naming the field for a shape OpenAI does not accept, a call
    forced without ``tools``, or a function that is not among them."""
    if raw is None or raw == "auto":
        return AUTO
    if raw in ("none", "required"):
        choice = ToolChoice(raw)
    elif isinstance(raw, dict) and raw.get("type") == "function":
        function = raw.get("function")
        name = function.get("name") if isinstance(function, dict) else None
        if not isinstance(name, str):
            raise BadRequestError("tool_choice.function.name: a string naming a tool is required")
        choice = ToolChoice("function", name)
    else:
        raise BadRequestError(f"tool_choice: must be {TOOL_CHOICE_SHAPES}")
    if choice.mode == "none":
        return choice
    if not tools:
        raise BadRequestError(f"tool_choice: {raw!r} needs tools")
    if choice.name is not None and choice.name not in {t.function.name for t in tools}:
        raise BadRequestError(f"tool_choice.function.name: no tool is named {choice.name!r}")
    return choice


class _ToolsBody(_Body):
    """``tools`` and ``tool_choice``, which completions and ``/tokenize`` share."""

    tools: list[FunctionTool] | None = None
    tool_choice: Any = None

    @property
    def tool_choice_value(self) -> ToolChoice:
        """``tool_choice`` read (see :func:`read_tool_choice`)."""
        return read_tool_choice(self.tool_choice, self.tools)

    @property
    def tool_dicts(self) -> list[dict[str, Any]] | None:
        """``tools`` as plain JSON, as chat templates and the tool prompt read them."""
        if not self.tools:
            return None
        dumped = [tool.model_dump() for tool in self.tools]
        for tool in dumped:
            tool["function"] = {k: v for k, v in tool["function"].items() if v is not None}
        return dumped


class StreamOptions(_Body):
    """``stream_options``: ``include_usage`` adds a final chunk carrying ``usage``."""

    include_usage: bool = False


class ChatCompletionRequest(_ToolsBody):
    """``POST /v1/chat/completions``. ``return_token_ids`` is vLLM's flag for
    ``prompt_token_ids`` on the response and ``token_ids`` on each choice."""

    model: str
    messages: list[ChatMessage] = Field(min_length=1)
    stream: bool = False
    stream_options: StreamOptions | None = None
    temperature: float = Field(default=1.0, ge=0.0, le=2.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    stop: str | list[str] | None = None
    seed: int | None = None
    n: int = Field(default=1, ge=1, le=16)
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    parallel_tool_calls: bool = True
    return_token_ids: bool = False

    @field_validator("stop")
    @classmethod
    def _stops(cls, stop: str | list[str] | None) -> list[str] | None:
        stops = [stop] if isinstance(stop, str) else stop
        if stops is not None and any(not s for s in stops):
            raise ValueError("stop strings must not be empty")
        return stops

    @model_validator(mode="after")
    def _top_logprobs_needs_logprobs(self) -> ChatCompletionRequest:
        if self.top_logprobs and not self.logprobs:
            raise ValueError("top_logprobs requires logprobs: true")
        return self

    @model_validator(mode="after")
    def _unique_tool_names(self) -> ChatCompletionRequest:
        names = [tool.function.name for tool in self.tools or ()]
        if len(set(names)) < len(names):
            raise ValueError("tools: two tools have the same function name")
        return self

    @property
    def stop_strings(self) -> list[str]:
        """The stop strings as a list (``stop`` normalised)."""
        return list(self.stop or [])

    @property
    def token_limit(self) -> int | None:
        """``max_completion_tokens`` or, failing that, ``max_tokens``."""
        return self.max_completion_tokens or self.max_tokens


class CompletionRequest(_Body):
    """``POST /v1/completions``: a raw text continuation of one prompt (a string, or
    token ids; a list holding one of either), no chat template. ``max_tokens`` defaults
    to 16 as OpenAI's does. ``logprobs`` and ``suffix`` are refused rather than ignored."""

    model: str
    prompt: str | list[str] | list[int] | list[list[int]]
    stream: bool = False
    stream_options: StreamOptions | None = None
    temperature: float = Field(default=1.0, ge=0.0, le=2.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    max_tokens: int = Field(default=16, ge=1)
    stop: str | list[str] | None = None
    seed: int | None = None
    n: int = Field(default=1, ge=1, le=16)
    echo: bool = False
    logprobs: int | None = None
    suffix: str | None = None

    @field_validator("prompt")
    @classmethod
    def _one_prompt(
        cls, prompt: str | list[str] | list[int] | list[list[int]]
    ) -> str | list[str] | list[int] | list[list[int]]:
        if isinstance(prompt, list):
            if not prompt:
                raise ValueError("prompt must not be empty")
            if isinstance(prompt[0], str | list) and len(prompt) != 1:
                raise ValueError(
                    f"the embedded engine completes one prompt per request, not {len(prompt)}"
                )
        return prompt

    @field_validator("stop")
    @classmethod
    def _stops(cls, stop: str | list[str] | None) -> list[str] | None:
        stops = [stop] if isinstance(stop, str) else stop
        if stops is not None and any(not s for s in stops):
            raise ValueError("stop strings must not be empty")
        return stops

    @model_validator(mode="after")
    def _unsupported(self) -> CompletionRequest:
        if self.logprobs:
            raise ValueError("logprobs on /v1/completions is not supported by the embedded engine")
        if self.suffix:
            raise ValueError("suffix (insertion) is not supported by the embedded engine")
        return self

    def text_or_ids(self) -> str | list[int]:
        """The one prompt: its text, or its token ids."""
        prompt = self.prompt
        if isinstance(prompt, str):
            return prompt
        first = prompt[0]
        if isinstance(first, str):
            return first
        if isinstance(first, list):
            return list(first)
        return [int(token) for token in prompt if isinstance(token, int)]


class TokenizeRequest(_ToolsBody):
    """``POST /tokenize`` (vLLM's chat form): the conversation's tokens through the chat
    template, generation prompt included, as ``/v1/chat/completions`` would encode it."""

    model: str | None = None
    messages: list[ChatMessage] = Field(min_length=1)


class LoadLoraAdapterRequest(_Body):
    """``POST /v1/load_lora_adapter`` (vLLM's body, plus Reef's ``expected_digest`` and
    ``base_model_name``).

    ``load_inplace`` replaces an adapter of the same name; requests already running
    finish on the old weights. ``base_model_name``: a loaded checkpoint to run the
    adapter on (default: the engine's base model).
    """

    lora_name: str = Field(min_length=1)
    lora_path: str = Field(min_length=1)
    expected_digest: str | None = Field(default=None, pattern=r"^sha256:[0-9a-f]{64}$")
    load_inplace: bool = False
    base_model_name: str | None = Field(default=None, min_length=1, max_length=256)


class UnloadLoraAdapterRequest(_Body):
    """``POST /v1/unload_lora_adapter``."""

    lora_name: str = Field(min_length=1)


class LoadCheckpointRequest(_Body):
    """``POST /v1/load_checkpoint`` (Reef's): serve the checkpoint directory at ``path``
    (full fine-tuned weights of the base model) as the model ``name``. ``replace``
    retires a checkpoint of the same name; requests already running finish on it."""

    name: str = Field(min_length=1)
    path: str = Field(min_length=1)
    expected_digest: str | None = Field(default=None, pattern=r"^sha256:[0-9a-f]{64}$")
    replace: bool = False


class UnloadCheckpointRequest(_Body):
    """``POST /v1/unload_checkpoint``: stop serving ``name``; its weights are freed once
    the requests running on them finish."""

    name: str = Field(min_length=1)
