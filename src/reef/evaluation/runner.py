"""The paired runner's calling half: ask both arms every item through the gateway.

Each call pins its arm with ``x-reef-release`` and declares ``x-reef-purpose: eval``, so
the gateway records it (the answer's ``record_id`` is the receipt) but never trains on
it. The two arms of one item and repeat are sent next to each other, so whatever drifts
in the server while the run goes on (load, a warm cache) touches both alike.
"""

from __future__ import annotations

import asyncio
import json
import string
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal
from urllib.parse import quote

import aiohttp

from reef.core import InvalidInputError, dumps, loads, new_id
from reef.core.retrying import Retrier, RetryPolicy, Sleep, parse_retry_after
from reef.evaluation.values import (
    ARMS,
    Answer,
    Arm,
    ErrorKind,
    EvalItem,
    Reply,
    error_kind_of_status,
    item_label,
)
from reef.upstream import (
    anthropic_response_to_openai,
    openai_chat_messages,
    openai_request_to_anthropic,
)

if TYPE_CHECKING:
    from reef.core.prices import Price
    from reef.experience import LearningMeter

BACKOFF_BASE_SECONDS = 0.2
BACKOFF_MAX_SECONDS = 5.0
RETRY_AFTER_MAX_SECONDS = 10.0
"""The longest ``Retry-After`` the runner honours: a run waits for a busy gateway, but
not for as long as any server asks."""
_REFUSED = frozenset({400, 401, 403, 404, 409})  # 409: a pin the gateway cannot serve
_HEADER_SAFE = string.punctuation.replace("%", "") + " "


@dataclass(frozen=True)
class GatewayTarget:
    """Where and how to call: the gateway's ``base_url`` (without ``/v1``), the
    ``scenario`` under evaluation, an inference key (None when auth is off), and the
    per-call deadline, retries of a failed call and calls in flight at once.

    ``dialect`` is the route items are asked through: ``openai`` (chat completions),
    or ``anthropic`` (Messages) for a scenario served by an Anthropic upstream, which
    the gateway serves on ``/v1/messages`` only. Items are written in OpenAI chat form
    either way; for ``anthropic`` each is translated with the gateway's own
    chat-to-Messages translation and the reply read back as a chat completion."""

    base_url: str
    scenario: str
    api_key: str | None = None
    timeout_seconds: float = 120.0
    retries: int = 2
    concurrency: int = 4
    dialect: Literal["openai", "anthropic"] = "openai"
    # Reef's own spend: each call admitted by and counted in ``meter`` as ``eval`` at
    # ``price`` (``reef.experience.learning_spend``); None: not counted.
    meter: LearningMeter | None = None
    price: Price | None = None
    # The wait before a failed call is sent again (a test records the waits instead).
    sleep: Sleep = asyncio.sleep

    def __post_init__(self) -> None:
        if self.timeout_seconds <= 0:
            raise ValueError(f"timeout_seconds must be positive, got {self.timeout_seconds}")
        if self.retries < 0:
            raise ValueError(f"retries must be >= 0, got {self.retries}")
        if self.concurrency < 1:
            raise ValueError(f"concurrency must be >= 1, got {self.concurrency}")

    @property
    def chat_url(self) -> str:
        """The chat completions endpoint."""
        return self.base_url.rstrip("/") + "/v1/chat/completions"

    @property
    def url(self) -> str:
        """The endpoint of ``dialect``: chat completions, or Anthropic's Messages."""
        if self.dialect == "anthropic":
            return self.base_url.rstrip("/") + "/v1/messages"
        return self.chat_url


class EvalRunError(InvalidInputError):
    """The gateway refused an arm outright (its pin is unknown or belongs to another
    scenario, the key is wrong, or it rejects the request before serving it), so every
    call of the run would fail alike.

    ``arm``, ``release_id`` and ``status`` say which pin and how it was refused;
    ``item_key`` the item whose call was refused first (its message names it too).
    """

    def __init__(
        self, message: str, *, arm: Arm, release_id: str, status: int, item_key: str | None = None
    ) -> None:
        super().__init__(message)
        self.arm = arm
        self.release_id = release_id
        self.status = status
        self.item_key = item_key


@dataclass(frozen=True)
class _Job:
    item: EvalItem
    repeat: int
    arm: Arm
    release_id: str


@dataclass(frozen=True)
class _Outcome:
    """One attempt: a reply (``text``), or why not (``error``, of ``kind``) and whether
    to try again."""

    text: str | None
    record_id: str | None
    latency_ms: float
    error: str | None = None
    retryable: bool = False
    retry_after: float | None = None
    reply: Reply | None = None
    kind: ErrorKind | None = None


def collect_answers(
    target: GatewayTarget,
    items: Sequence[EvalItem],
    arms: Mapping[Arm, str],
    repeats: int = 1,
    defaults: Mapping[str, Any] | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> list[Answer]:
    """Ask every arm every item ``repeats`` times and return the answers.

    ``arms`` maps each arm to the release or candidate id it pins; ``defaults`` are
    request fields (``max_tokens``, ``temperature``) that an item's ``params`` override.
    Synchronous: runs its own event loop, so call it from a thread without one.
    ``progress(done, total)`` follows every finished call. Answers come in a stable
    order (item, repeat, then candidate before baseline) whatever order calls finish in.

    A call that still fails after ``target.retries`` retries (connection errors,
    timeouts, 429, 5xx; ``reef.core.retrying``: full-jitter backoff from 0.2 s up to 5 s,
    or the gateway's ``Retry-After``, seconds or an HTTP-date, up to 10 s, waited with
    ``target.sleep``) gives an answer with ``text=None``, ``error`` set and
    ``error_kind`` saying which kind of failure it was (``ErrorKind``); a refused item
    (a 4xx relayed from the upstream) is not retried. Raises
    ``EvalRunError`` when the gateway refuses an arm's pin or the key (400/401/403/404),
    and ``ValueError`` for an unknown arm or ``repeats < 1``.
    """
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    unknown = sorted(set(arms) - set(ARMS))
    if unknown:
        raise ValueError(f"unknown arms {unknown}; arms are {list(ARMS)}")
    order = [arm for arm in ARMS if arm in arms]
    jobs = [
        _Job(item, repeat, arm, arms[arm])
        for item in items
        for repeat in range(repeats)
        for arm in order
    ]
    if not jobs:
        return []
    return asyncio.run(_collect(target, jobs, dict(defaults or {}), progress))


async def _collect(
    target: GatewayTarget,
    jobs: list[_Job],
    defaults: dict[str, Any],
    progress: Callable[[int, int], None] | None,
) -> list[Answer]:
    answers: list[Answer | None] = [None] * len(jobs)
    pending = iter(enumerate(jobs))  # shared by the workers: they start jobs in order
    done = 0
    headers = {"authorization": f"Bearer {target.api_key}"} if target.api_key else {}
    connector = aiohttp.TCPConnector(limit=target.concurrency)
    timeout = aiohttp.ClientTimeout(total=target.timeout_seconds)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout, headers=headers) as s:
        caller = _Caller(s, target, defaults)

        async def work() -> None:
            nonlocal done
            for index, job in pending:
                answers[index] = await caller.answer(job)
                done += 1
                if progress is not None:
                    progress(done, len(jobs))

        try:
            async with asyncio.TaskGroup() as group:
                for _ in range(min(target.concurrency, len(jobs))):
                    group.create_task(work())
        except ExceptionGroup as failed:
            # One refused pin cancels the rest; raise it as itself, not wrapped.
            refused = [e for e in failed.exceptions if isinstance(e, EvalRunError)]
            raise (refused or failed.exceptions)[0] from None
    return [answer for answer in answers if answer is not None]


class _Caller:
    """Sends one job's call, retrying what may pass on a second try."""

    def __init__(
        self,
        session: aiohttp.ClientSession,
        target: GatewayTarget,
        defaults: dict[str, Any],
    ) -> None:
        self.session = session
        self.target = target
        self.defaults = defaults
        self.policy = RetryPolicy(
            retries=target.retries,
            base_seconds=BACKOFF_BASE_SECONDS,
            cap_seconds=BACKOFF_MAX_SECONDS,
            hint_cap_seconds=RETRY_AFTER_MAX_SECONDS,
        )

    async def answer(self, job: _Job) -> Answer:
        """The job's answer after at most ``retries`` retries; raises ``EvalRunError``."""
        retrier = Retrier(self.policy)
        while True:
            outcome = await self._attempt(job)
            if outcome.error is None or not outcome.retryable:
                break
            if not await retrier.pause(outcome.retry_after, self.target.sleep):
                break
        attempts = retrier.attempts
        error = outcome.error
        if error is not None and attempts > 1:
            error = f"{error} (after {attempts} attempts)"
        reply = outcome.reply if error is None else None
        return Answer(
            item_key=job.item.key,
            arm=job.arm,
            repeat=job.repeat,
            text=outcome.text if error is None else None,
            record_id=outcome.record_id,
            error=error,
            latency_ms=outcome.latency_ms,
            attempts=attempts,
            content=None if reply is None else reply.content,
            tool_calls=() if reply is None else reply.tool_calls,
            error_kind=None if error is None else outcome.kind,
        )

    async def _attempt(self, job: _Job) -> _Outcome:
        body: dict[str, Any] = {
            "model": f"reef/{self.target.scenario}",
            # Items stored in canonical form (older holdouts, regression suites) go out
            # in OpenAI chat form; items already in it pass through unchanged.
            "messages": openai_chat_messages(job.item.messages),
            **self.defaults,
            **job.item.params,
        }
        body.pop("stream", None)  # the reply is read as one JSON document
        if self.target.dialect == "anthropic":
            body = openai_request_to_anthropic(body, model=body["model"])
        if self.target.meter is not None:
            self.target.meter.admit("eval")
        started = time.perf_counter()
        try:
            async with self.session.post(
                self.target.url, data=dumps(body), headers=self._headers(job)
            ) as response:
                raw = await response.read()
                status, headers = response.status, response.headers
        except TimeoutError:
            elapsed = _ms_since(started)
            reason = f"no reply within {self.target.timeout_seconds:g} s"
            return _Outcome(None, None, elapsed, reason, retryable=True, kind="timeout")
        except aiohttp.ClientError as exc:
            reason = f"could not reach the gateway: {type(exc).__name__}: {exc}"
            return _Outcome(
                None, None, _ms_since(started), reason, retryable=True, kind="unreachable"
            )
        elapsed = _ms_since(started)
        record_id = headers.get("x-reef-record-id")
        if status == 200:
            try:
                data = loads(raw)
                if self.target.dialect == "anthropic" and isinstance(data, dict):
                    data = anthropic_response_to_openai(data)
                self._charge(data)
                reply = parse_reply(data)
            except ValueError as exc:
                reason = f"unreadable reply: {exc}"
                return _Outcome(None, record_id, elapsed, reason, kind="unreadable")
            return _Outcome(reply.text, record_id, elapsed, reply=reply)
        message = _error_message(raw)
        # A 400 carrying a receipt is the upstream refusing this item (say, too long for
        # its context): that item's failure. Anything else refused voids the whole run.
        if status in _REFUSED and not (status == 400 and "x-reef-release-id" in headers):
            raise EvalRunError(
                f"the gateway refused the {job.arm} arm ({job.release_id!r}) of scenario "
                f"{self.target.scenario!r} with {status} on {item_label(job.item.key)}: {message}",
                arm=job.arm,
                release_id=job.release_id,
                status=status,
                item_key=job.item.key,
            )
        retryable = status == 429 or status >= 500
        reason = f"gateway answered {status}: {message}"
        return _Outcome(
            None,
            record_id,
            elapsed,
            reason,
            retryable,
            parse_retry_after(headers.get("retry-after")),
            kind=error_kind_of_status(status),
        )

    def _charge(self, data: Any) -> None:
        if self.target.meter is not None:
            usage = data.get("usage") if isinstance(data, dict) else None
            self.target.meter.charge("eval", usage, self.target.price)

    def _headers(self, job: _Job) -> dict[str, str]:
        return {
            "content-type": "application/json",
            "x-reef-scenario": self.target.scenario,
            "x-reef-release": job.release_id,
            "x-reef-purpose": "eval",
            "x-reef-session": new_id(),
            "x-reef-tag-eval-item": header_value(job.item.key),
            "x-reef-tag-eval-arm": job.arm,
        }


def reply_text(data: Any) -> str:
    """The text of a chat completion's first choice; tool calls become JSON text after
    it so scorers see them. Raises ``ValueError`` when there is no first choice."""
    return parse_reply(data).text


def parse_reply(data: Any) -> Reply:
    """A chat completion's first choice as a ``Reply``: its content, its tool calls,
    and the text scorers compare (``reply_text``). Raises ``ValueError`` when there is
    no first choice."""
    choices = data.get("choices") if isinstance(data, dict) else None
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise ValueError("the reply has no choices")
    message = choices[0].get("message")
    if not isinstance(message, dict):
        raise ValueError("the reply's first choice has no message")
    content = message.get("content")
    text = ""
    if isinstance(content, str):
        text = content
    elif isinstance(content, list):
        text = "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    raw_calls = message.get("tool_calls")
    calls = [c for c in raw_calls if isinstance(c, dict)] if isinstance(raw_calls, list) else []
    parts = [text]
    if raw_calls:
        parts.append(json.dumps(raw_calls, ensure_ascii=False, sort_keys=True))
    return Reply("\n".join(part for part in parts if part), text, tuple(calls))


def header_value(text: str) -> str:
    """``text`` as a header value: unchanged when printable ASCII, else percent-encoded
    (a header cannot carry other characters)."""
    if text.isascii() and text.isprintable():
        return text
    return quote(text, safe=_HEADER_SAFE)


def _error_message(raw: bytes) -> str:
    try:
        data = loads(raw)
    except ValueError:
        data = None
    if isinstance(data, dict):
        error = data.get("error")
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            return str(error["message"])
        if isinstance(error, str):
            return error
    text = raw.decode("utf-8", "replace").strip()
    return text[:500] or "(empty body)"


def _ms_since(started: float) -> float:
    return (time.perf_counter() - started) * 1000.0
