"""Clients for model servers, and the dialect machinery around them.

Owns: the ``Upstream`` contract and its errors (``base``); the aiohttp client for
OpenAI-compatible servers and the Anthropic API with its pooling, timeouts and
retries (``http``); Server-Sent Events (``sse``); Anthropic ⇄ OpenAI translation
(``translate``); reassembling streams into complete responses (``assemble``); the
canonical conversation form and its prefix hashes (``canonical``).

Does not own: routing, auth, capture or HTTP status mapping (``reef.gateway``), what
is stored (``reef.experience``), the embedded model server (``reef.engine``). Must
not import ``reef.experience``, ``reef.learning`` or ``reef.gateway``.

Extend: a new kind of model server subclasses ``Upstream`` (and ``UpstreamStream``),
raises only the ``UpstreamError`` subclasses, gets a ``type`` in
``reef.config.models.UpstreamConfig`` and a branch in ``build_upstream``.
"""

from reef.upstream.assemble import AnthropicStreamAssembler, OpenAIStreamAssembler
from reef.upstream.base import (
    ADAPTER_ALREADY_LOADED,
    AdapterAlreadyLoadedError,
    Dialect,
    Upstream,
    UpstreamError,
    UpstreamMalformedError,
    UpstreamRejectedError,
    UpstreamRequest,
    UpstreamResponse,
    UpstreamStalledError,
    UpstreamStream,
    UpstreamTimeoutError,
    UpstreamTruncatedError,
    UpstreamUnavailableError,
)
from reef.upstream.canonical import (
    canonical_anthropic,
    canonical_message,
    canonical_openai,
    canonical_reply_anthropic,
    canonical_reply_openai,
    chain_hashes,
    extend_chain,
)
from reef.upstream.http import (
    HTTPUpstream,
    HTTPUpstreamStream,
    build_upstream,
    error_message_from_body,
    parse_retry_after,
)
from reef.upstream.sse import SSEEvent, SSEParser, encode_sse
from reef.upstream.translate import (
    RAW_ARGUMENTS_KEY,
    OpenAIToAnthropicStream,
    anthropic_message_id,
    anthropic_request_to_openai,
    openai_response_to_anthropic,
    stop_reason,
    tool_input,
)

__all__ = [
    "ADAPTER_ALREADY_LOADED",
    "RAW_ARGUMENTS_KEY",
    "AdapterAlreadyLoadedError",
    "AnthropicStreamAssembler",
    "Dialect",
    "HTTPUpstream",
    "HTTPUpstreamStream",
    "OpenAIStreamAssembler",
    "OpenAIToAnthropicStream",
    "SSEEvent",
    "SSEParser",
    "Upstream",
    "UpstreamError",
    "UpstreamMalformedError",
    "UpstreamRejectedError",
    "UpstreamRequest",
    "UpstreamResponse",
    "UpstreamStalledError",
    "UpstreamStream",
    "UpstreamTimeoutError",
    "UpstreamTruncatedError",
    "UpstreamUnavailableError",
    "anthropic_message_id",
    "anthropic_request_to_openai",
    "build_upstream",
    "canonical_anthropic",
    "canonical_message",
    "canonical_openai",
    "canonical_reply_anthropic",
    "canonical_reply_openai",
    "chain_hashes",
    "encode_sse",
    "error_message_from_body",
    "extend_chain",
    "openai_response_to_anthropic",
    "parse_retry_after",
    "stop_reason",
    "tool_input",
]
