"""Clients for model servers, and the dialect machinery around them.

Owns: the ``Upstream`` contract and its errors (``base``); the aiohttp client for
OpenAI-compatible servers and the Anthropic API with its pooling, timeouts and
retries (``http``); Server-Sent Events (``sse``); Anthropic ⇄ OpenAI translation
(``translate``: Anthropic clients on OpenAI-compatible servers; ``chat_anthropic``: chat
requests on the Anthropic API); OpenAI Responses ⇄ Chat Completions, the Responses
event stream and its relays (the ``responses`` sub-package); reassembling streams into
complete responses (``assemble``); relaying an upstream's stream to a client while
reassembling it (``relay``: the gateway picks the relay and gives it the error event a
failed stream ends with); the canonical conversation form and its prefix hashes
(``canonical``).

Does not own: routing, auth, capture or HTTP status mapping (``reef.gateway``), what
is stored (``reef.experience``), the embedded model server (``reef.engine``). Must
not import ``reef.experience``, ``reef.learning`` or ``reef.gateway``.

Extend: a new kind of model server subclasses ``Upstream`` (and ``UpstreamStream``),
raises only the ``UpstreamError`` subclasses, gets a ``type`` in
``reef.config.models.UpstreamConfig`` and a branch in ``build_upstream``.
"""

from reef.upstream.assemble import (
    AnthropicStreamAssembler,
    CompletionStreamAssembler,
    OpenAIStreamAssembler,
)
from reef.upstream.base import (
    ADAPTER_ALREADY_LOADED,
    AdapterAlreadyLoadedError,
    Dialect,
    Upstream,
    UpstreamBusyError,
    UpstreamError,
    UpstreamMalformedError,
    UpstreamOversizedError,
    UpstreamRejectedError,
    UpstreamRequest,
    UpstreamResponse,
    UpstreamStalledError,
    UpstreamStream,
    UpstreamTimeoutError,
    UpstreamTruncatedError,
    UpstreamUnavailableError,
    UpstreamUnsupportedError,
)
from reef.upstream.canonical import (
    canonical_anthropic,
    canonical_completions,
    canonical_embeddings,
    canonical_message,
    canonical_openai,
    canonical_reply,
    canonical_reply_anthropic,
    canonical_reply_completions,
    canonical_reply_openai,
    canonical_reply_responses,
    canonical_request,
    canonical_responses,
    chain_hashes,
    continuation_candidates,
    extend_chain,
    openai_chat_message,
    openai_chat_messages,
)
from reef.upstream.chat_anthropic import (
    DEFAULT_MAX_TOKENS,
    AnthropicToOpenAIStream,
    anthropic_response_to_openai,
    openai_request_to_anthropic,
)
from reef.upstream.http import (
    HTTPUpstream,
    HTTPUpstreamStream,
    build_upstream,
    error_message_from_body,
)
from reef.upstream.responses.stream import OpenAIToResponsesStream, response_events
from reef.upstream.responses.translate import (
    input_items,
    item_id,
    openai_response_to_responses,
    response_id_for,
    response_shell,
    responses_request_to_openai,
)
from reef.upstream.sse import SSEEvent, SSELineTooLongError, SSEParser, encode_sse
from reef.upstream.translate import (
    RAW_ARGUMENTS_KEY,
    OpenAIToAnthropicStream,
    anthropic_message_id,
    anthropic_request_to_openai,
    arguments_text,
    openai_response_to_anthropic,
    stop_reason,
    tool_input,
)

__all__ = [
    "ADAPTER_ALREADY_LOADED",
    "DEFAULT_MAX_TOKENS",
    "RAW_ARGUMENTS_KEY",
    "AdapterAlreadyLoadedError",
    "AnthropicStreamAssembler",
    "AnthropicToOpenAIStream",
    "CompletionStreamAssembler",
    "Dialect",
    "HTTPUpstream",
    "HTTPUpstreamStream",
    "OpenAIStreamAssembler",
    "OpenAIToAnthropicStream",
    "OpenAIToResponsesStream",
    "SSEEvent",
    "SSELineTooLongError",
    "SSEParser",
    "Upstream",
    "UpstreamBusyError",
    "UpstreamError",
    "UpstreamMalformedError",
    "UpstreamOversizedError",
    "UpstreamRejectedError",
    "UpstreamRequest",
    "UpstreamResponse",
    "UpstreamStalledError",
    "UpstreamStream",
    "UpstreamTimeoutError",
    "UpstreamTruncatedError",
    "UpstreamUnavailableError",
    "UpstreamUnsupportedError",
    "anthropic_message_id",
    "anthropic_request_to_openai",
    "anthropic_response_to_openai",
    "arguments_text",
    "build_upstream",
    "canonical_anthropic",
    "canonical_completions",
    "canonical_embeddings",
    "canonical_message",
    "canonical_openai",
    "canonical_reply",
    "canonical_reply_anthropic",
    "canonical_reply_completions",
    "canonical_reply_openai",
    "canonical_reply_responses",
    "canonical_request",
    "canonical_responses",
    "chain_hashes",
    "continuation_candidates",
    "encode_sse",
    "error_message_from_body",
    "extend_chain",
    "input_items",
    "item_id",
    "openai_chat_message",
    "openai_chat_messages",
    "openai_request_to_anthropic",
    "openai_response_to_anthropic",
    "openai_response_to_responses",
    "response_events",
    "response_id_for",
    "response_shell",
    "responses_request_to_openai",
    "stop_reason",
    "tool_input",
]
