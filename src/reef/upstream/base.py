"""The ``Upstream`` contract and its errors."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Final, Literal

from reef.core.errors import ReefError

Dialect = Literal["openai", "anthropic"]

DEFAULT_MAX_SSE_LINE_BYTES: Final = 8 * 1024 * 1024
"""The longest event-stream line held by default (the default of
``upstreams.<name>.max_sse_line_bytes``, whose description says why)."""


class UpstreamError(ReefError):
    """The upstream failed. ``status`` is what the gateway answers; ``message`` is the
    upstream's own message where it sent one; ``reason`` names the kind of failure
    (records and stream error events carry it, see ``detail``). Raised as is: the
    upstream sent an error of its own (e.g. an error event mid-stream)."""

    reason: ClassVar[str] = "upstream_error"

    def __init__(self, message: str, status: int = 502, upstream_status: int | None = None):
        super().__init__(message)
        self.status = status
        self.upstream_status = upstream_status

    @property
    def detail(self) -> str:
        """``reason: message``."""
        return f"{self.reason}: {self.message}"


class UpstreamUnavailableError(UpstreamError):
    """Connection refused or reset, or 429/5xx after every retry: the gateway answers 502."""

    reason: ClassVar[str] = "upstream_unavailable"


class UpstreamTimeoutError(UpstreamError):
    """Connect, read or total deadline exceeded: the gateway answers 504."""

    reason: ClassVar[str] = "upstream_timeout"

    def __init__(self, message: str) -> None:
        super().__init__(message, status=504)


class UpstreamStalledError(UpstreamTimeoutError):
    """The answer began, then nothing came for the read timeout: 504."""

    reason: ClassVar[str] = "upstream_stalled"


class UpstreamTruncatedError(UpstreamError):
    """The answer ended before its end: a body cut short, a stream without its terminal
    event (``[DONE]`` and a ``finish_reason``; ``message_stop``): 502."""

    reason: ClassVar[str] = "upstream_truncated"


class UpstreamMalformedError(UpstreamError):
    """The answer is not what the dialect sends: JSON that does not parse, a stream that
    is not Server-Sent Events, a wrong content type: 502."""

    reason: ClassVar[str] = "upstream_malformed"


class UpstreamOversizedError(UpstreamError):
    """The answer is larger than the gateway holds: a body past ``max_response_bytes``,
    an event-stream line past ``max_sse_line_bytes``: 502, the message naming the
    setting to raise."""

    reason: ClassVar[str] = "upstream_oversized"


class UpstreamBusyError(UpstreamError):
    """Every connection the gateway may open to the upstream (``max_connections``) stayed
    busy until the call's deadline: the gateway answers 503 with ``Retry-After``
    (``retry_after_seconds``)."""

    reason: ClassVar[str] = "upstream_busy"

    def __init__(self, message: str, retry_after_seconds: int = 1) -> None:
        super().__init__(message, status=503)
        self.retry_after_seconds = retry_after_seconds


class UpstreamRejectedError(UpstreamError):
    """The upstream refused the request with a 4xx (not 429); relayed with its status.
    ``code`` is the error body's machine-readable ``error.code`` when it sent one."""

    reason: ClassVar[str] = "upstream_rejected"

    def __init__(
        self,
        message: str,
        status: int = 502,
        upstream_status: int | None = None,
        code: str | None = None,
    ):
        super().__init__(message, status, upstream_status)
        self.code = code


class UpstreamUnsupportedError(UpstreamError):
    """The upstream has no way to do what was asked (a route it does not serve): the
    gateway answers 501."""

    reason: ClassVar[str] = "upstream_unsupported"

    def __init__(self, message: str, upstream_status: int | None = None):
        super().__init__(message, 501, upstream_status)


class AdapterAlreadyLoadedError(UpstreamRejectedError):
    """``load_adapter``: the upstream already serves an adapter of that name."""


ADAPTER_ALREADY_LOADED = "adapter_already_loaded"
"""The ``error.code`` with which the embedded engine refuses an adapter name it serves."""


@dataclass(frozen=True)
class UpstreamRequest:
    """A call to make: ``path`` relative to the upstream's base URL (e.g. ``/chat/completions``)."""

    path: str
    body: bytes
    stream: bool
    headers: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class UpstreamResponse:
    """A complete (non-streaming) upstream answer."""

    status: int
    body: bytes
    content_type: str


class UpstreamStream(ABC):
    """An open streaming response: raw bytes as they arrive, then ``aclose``.

    ``max_line_bytes`` is the longest event-stream line it lets through (its upstream's
    ``max_sse_line_bytes``): a parser of its bytes is sized to it.
    """

    status: int
    content_type: str
    max_line_bytes: int = DEFAULT_MAX_SSE_LINE_BYTES

    @abstractmethod
    def __aiter__(self) -> AsyncIterator[bytes]:
        """Chunks of the body. Raises ``UpstreamStalledError`` when the upstream goes
        silent past the read timeout, ``UpstreamTimeoutError`` past the total deadline,
        ``UpstreamTruncatedError`` when the connection drops and
        ``UpstreamOversizedError`` when a line or the whole body passes its bound."""

    @abstractmethod
    async def aclose(self) -> None:
        """Close the connection; an unfinished upstream request is cancelled. Idempotent."""


class Upstream(ABC):
    """A model server. Implementations own retries, timeouts and connection reuse."""

    name: str
    dialect: Dialect

    @abstractmethod
    async def send(self, request: UpstreamRequest) -> UpstreamResponse:
        """Make a non-streaming call within the total deadline.

        Retries only on connection errors, 429 (honouring ``Retry-After``) and 5xx other
        than 501, and only while the deadline allows. Raises ``UpstreamUnavailableError``
        (502), ``UpstreamTimeoutError`` (504), ``UpstreamRejectedError`` (upstream's 4xx),
        ``UpstreamUnsupportedError`` (its 501: it does not implement the route),
        ``UpstreamOversizedError`` (502: a body past the upstream's bound) or
        ``UpstreamBusyError`` (503: every allowed connection stayed busy).
        """

    @abstractmethod
    async def open_stream(self, request: UpstreamRequest) -> UpstreamStream:
        """Start a streaming call; retries as ``send`` does, but only until the response
        headers arrive: once bytes flow nothing is retried. Raises what ``send`` raises,
        and ``UpstreamMalformedError`` when the answer is not an event stream."""

    @abstractmethod
    async def list_models(self) -> list[str]:
        """Model names the upstream serves (``GET /models``); raises ``UpstreamError``."""

    async def model_cards(self) -> list[dict[str, Any]]:
        """The upstream's model cards (``GET /models``'s ``data``: vLLM lists each loaded
        adapter with its ``parent``); at least ``id`` in each. Raises ``UpstreamError``."""
        return [{"id": name} for name in await self.list_models()]

    async def load_adapter(
        self, name: str, path: str, expected_digest: str | None, on: str | None = None
    ) -> None:
        """Load a LoRA adapter at runtime under ``name`` (vLLM's ``/load_lora_adapter``),
        on the loaded checkpoint ``on`` when given (the embedded engine's
        ``base_model_name``).

        Raises ``UpstreamError``; upstreams without runtime adapters raise
        ``UpstreamRejectedError``.
        """
        raise UpstreamRejectedError(
            f"upstream {self.name!r} cannot load adapters at runtime", status=400
        )

    async def load_checkpoint(self, name: str, path: str, expected_digest: str | None) -> None:
        """Serve the checkpoint directory at ``path`` (full weights of the base model)
        under ``name`` (the embedded engine's ``/load_checkpoint``). Raises
        ``UpstreamError`` (a 507 from the engine: it would not fit in memory); upstreams
        without runtime checkpoints raise ``UpstreamRejectedError``. vLLM and SGLang
        take checkpoints in place instead (``reload_weights``)."""
        raise UpstreamRejectedError(
            f"upstream {self.name!r} cannot load checkpoints at runtime", status=400
        )

    async def unload_checkpoint(self, name: str) -> None:
        """Stop serving the checkpoint ``name`` (the engine's ``/unload_checkpoint``)."""
        raise UpstreamRejectedError(
            f"upstream {self.name!r} cannot unload checkpoints at runtime", status=400
        )

    async def reload_weights(self, path: str) -> None:
        """Replace the server's one set of weights, in place, with the model directory
        at ``path`` (a checkpoint or the base model), and drop every cache derived from
        the old ones: vLLM's ``/collective_rpc`` reload_weights and
        ``/reset_prefix_cache``, SGLang's ``/update_weights_from_disk``. The caller has
        drained the requests in flight. Raises ``UpstreamError``; upstreams that do not
        reload in place raise ``UpstreamRejectedError``."""
        raise UpstreamRejectedError(
            f"upstream {self.name!r} cannot reload its weights in place", status=400
        )

    async def base_weights(self) -> str:
        """The directory the server reads its base model from (``GET /models`` root
        unless configured), to reload it after a checkpoint."""
        raise UpstreamRejectedError(
            f"upstream {self.name!r} cannot reload its weights in place", status=400
        )

    async def count_chat_tokens(self, body: bytes) -> int:
        """The input tokens of a chat conversation (``{model, messages, tools?}``, JSON)
        by the server's own tokenizer and chat template: ``POST /tokenize`` of vLLM and
        the embedded engine. Raises ``UpstreamError``; ``UpstreamUnsupportedError`` when
        the upstream cannot count."""
        raise UpstreamUnsupportedError(f"upstream {self.name!r} cannot count tokens")

    async def unload_adapter(self, name: str) -> None:
        """Unload the adapter ``name`` (vLLM's ``/unload_lora_adapter``)."""
        raise UpstreamRejectedError(
            f"upstream {self.name!r} cannot unload adapters at runtime", status=400
        )

    @abstractmethod
    async def aclose(self) -> None:
        """Close pooled connections."""
