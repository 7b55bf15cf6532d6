"""Playing one episode of an environment against an OpenAI-compatible chat endpoint
(the Reef gateway, or any server of the chat completions API).

``play_episode``: ``reset`` the environment on the task, send the messages and tools,
and while the reply calls tools, ``step`` them and send the results back; stop at a
reply without tool calls (``finished``), after ``limits.max_turns`` replies
(``max_turns``), when the episode's time runs out (``timeout``), at a reply that is
not a chat completion (``malformed``) or when the endpoint fails (``error``); then
``score``. Each request is one JSON call (no streaming) with the episode's own
``x-reef-session``, so the gateway records the episode as one trajectory.

A reply that reports its tokens (vLLM's ``return_token_ids``: ``prompt_token_ids`` on
the body, ``token_ids`` and, with ``logprobs``, their log-probs on the choice) keeps them
as the turn's ``TurnTokens``: what RL over episodes trains on, exactly as sampled.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import aiohttp

from reef.core import dumps, loads, new_id
from reef.environments.base import (
    TOOL_STATUSES,
    Environment,
    Observation,
    Score,
    StepResult,
    ToolStatus,
)
from reef.environments.calls import normalize_call
from reef.environments.tasks import Task
from reef.upstream import (
    anthropic_response_to_openai,
    openai_chat_messages,
    openai_request_to_anthropic,
)

if TYPE_CHECKING:
    from reef.core.prices import Price
    from reef.experience import LearningMeter

StopCause = Literal["finished", "max_turns", "timeout", "malformed", "error"]


@dataclass(frozen=True)
class ChatEndpoint:
    """Where the agent's model is: the OpenAI ``base_url`` (with ``/v1``), the
    ``model`` to ask, a key (None: no auth), extra ``headers`` (a release pin, a
    purpose), request ``params`` (``temperature``, ``max_tokens``) and the deadline of
    one call."""

    base_url: str
    model: str
    api_key: str | None = None
    headers: Mapping[str, str] = field(default_factory=dict)
    params: Mapping[str, Any] = field(default_factory=dict)
    timeout_seconds: float = 120.0
    # ``anthropic``: a gateway scenario on an Anthropic upstream, served on /messages
    # only; each turn goes out translated to the Messages API and comes back as chat.
    dialect: Literal["openai", "anthropic"] = "openai"
    # Reef's own spend: each turn admitted by and counted in ``meter`` as ``episode``
    # at ``price`` (``reef.experience.learning_spend``); None: not counted.
    meter: LearningMeter | None = None
    price: Price | None = None

    def __post_init__(self) -> None:
        if self.timeout_seconds <= 0:
            raise ValueError(f"timeout_seconds must be positive, got {self.timeout_seconds}")

    def admit(self) -> None:
        """Before a turn: raises when a learning budget of its ``meter`` is spent."""
        if self.meter is not None:
            self.meter.admit("episode")

    def charge(self, reply: Any) -> None:
        """After a turn: its usage counted in the ``meter``."""
        if self.meter is not None:
            usage = reply.get("usage") if isinstance(reply, dict) else None
            self.meter.charge("episode", usage, self.price)

    @property
    def chat_url(self) -> str:
        """The endpoint turns are asked through: chat completions, or Anthropic's
        Messages for the ``anthropic`` dialect."""
        if self.dialect == "anthropic":
            return self.base_url.rstrip("/") + "/messages"
        return self.base_url.rstrip("/") + "/chat/completions"


@dataclass(frozen=True)
class TurnTokens:
    """One reply's tokens as the endpoint reported them: the prompt it saw (after its
    chat template), the completion it sampled, and the completion's log-probs under the
    sampler (None when the reply carried none, or not one per token)."""

    prompt_ids: tuple[int, ...]
    completion_ids: tuple[int, ...]
    logprobs: tuple[float, ...] | None = None


def turn_tokens(reply: Any) -> TurnTokens | None:
    """The tokens a chat completion reports for its first choice, or None when it
    reports none (an endpoint without ``return_token_ids``) or they are not integers."""
    if not isinstance(reply, dict):
        return None
    choices = reply.get("choices")
    first = choices[0] if isinstance(choices, list) and choices else None
    if not isinstance(first, dict):
        return None
    prompt = _int_list(reply.get("prompt_token_ids"))
    completion = _int_list(first.get("token_ids"))
    if prompt is None or completion is None:
        return None
    content = (first.get("logprobs") or {}).get("content") if first.get("logprobs") else None
    logprobs: tuple[float, ...] | None = None
    if isinstance(content, list) and len(content) == len(completion):
        try:
            logprobs = tuple(float(entry["logprob"]) for entry in content)
        except (TypeError, KeyError, ValueError):
            logprobs = None
    return TurnTokens(prompt, completion, logprobs)


def _int_list(value: Any) -> tuple[int, ...] | None:
    if not isinstance(value, list) or not all(
        isinstance(i, int) and not isinstance(i, bool) for i in value
    ):
        return None
    return tuple(value)


@dataclass(frozen=True)
class EpisodeResult:
    """How one episode went.

    ``turns``: model replies received; ``tool_calls``: calls made, with ``tool_status``
    counting their results by status (``malformed``, ``timeout``, ``crashed``, ...);
    ``truncated``: results cut to the output cap; ``stop``: why it ended (the module
    docstring), with ``error`` saying more; ``messages``: the whole conversation;
    ``record_ids``: the gateway's receipts (``x-reef-record-id``), one per reply;
    ``turn_tokens``: one entry per reply, its ``TurnTokens`` or None (module docstring).
    """

    task_id: str
    environment: str
    session_id: str
    stop: StopCause
    score: Score
    turns: int
    tool_calls: int
    tool_status: Mapping[ToolStatus, int]
    truncated: int
    seconds: float
    messages: tuple[dict[str, Any], ...]
    record_ids: tuple[str, ...] = ()
    error: str | None = None
    turn_tokens: tuple[TurnTokens | None, ...] = ()

    @property
    def malformed_calls(self) -> int:
        """Tool calls the environment refused as malformed."""
        return self.tool_status.get("malformed", 0)

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {
            "task_id": self.task_id,
            "environment": self.environment,
            "session_id": self.session_id,
            "stop": self.stop,
            "score": self.score.value,
            "reason": self.score.reason,
            "turns": self.turns,
            "tool_calls": self.tool_calls,
            "tool_status": dict(self.tool_status),
            "truncated": self.truncated,
            "seconds": self.seconds,
            "record_ids": list(self.record_ids),
            "error": self.error,
        }


class _Stop(Exception):
    def __init__(self, cause: StopCause, message: str) -> None:
        super().__init__(message)
        self.cause = cause


@dataclass
class _Episode:
    """The running state of one episode."""

    task: Task
    deadline: float
    limit_seconds: float
    session_id: str
    messages: list[dict[str, Any]] = field(default_factory=list)
    tools: list[dict[str, Any]] = field(default_factory=list)
    turns: int = 0
    statuses: Counter[ToolStatus] = field(default_factory=Counter)
    truncated: int = 0
    record_ids: list[str] = field(default_factory=list)
    turn_tokens: list[TurnTokens | None] = field(default_factory=list)

    def limit_text(self) -> str:
        return f"the episode ran past its {self.limit_seconds:g} s limit"

    def remaining(self) -> float:
        return self.deadline - time.monotonic()

    def add_step(self, step: StepResult) -> None:
        self.messages.extend(step.messages)
        for result in step.results:
            self.statuses[result.status] += 1
            self.truncated += result.truncated


async def play_episode(
    environment: Environment,
    task: Task,
    endpoint: ChatEndpoint,
    session: aiohttp.ClientSession | None = None,
) -> EpisodeResult:
    """Play ``task`` in ``environment`` with the model at ``endpoint`` (the module
    docstring) and return the result; ``session`` is reused when given. The
    environment stays open (``close`` it, or play the next task). Raises what
    ``reset`` and ``score`` raise (``EpisodeError``: the environment could not start or
    score); a failing model call is the episode's ``error`` stop, not an exception."""
    started = time.monotonic()
    limit = environment.limits.episode_timeout_seconds
    pinned = {k.lower(): v for k, v in endpoint.headers.items()}.get("x-reef-session")
    episode = _Episode(task, started + limit, limit, pinned or new_id())
    observation: Observation = await environment.reset(task)
    # A task taken from recorded traffic may hold canonical messages (flat tool calls):
    # sent in OpenAI chat form, which passes through unchanged.
    episode.messages = openai_chat_messages(observation.messages)
    episode.tools = [dict(t) for t in observation.tools]
    stop: StopCause = "max_turns"
    error: str | None = None
    own = session is None
    http = session or aiohttp.ClientSession()
    try:
        await _loop(environment, endpoint, http, episode)
    except _Stop as stopped:
        stop, error = stopped.cause, str(stopped) or None
    finally:
        if own:
            await http.close()
    if stop == "max_turns":
        error = f"no final answer within {environment.limits.max_turns} turns"
    score = await environment.score(task, episode.messages)
    return EpisodeResult(
        task_id=task.id,
        environment=environment.type_name,
        session_id=episode.session_id,
        stop=stop,
        score=score,
        turns=episode.turns,
        tool_calls=sum(episode.statuses.values()),
        tool_status={status: episode.statuses[status] for status in TOOL_STATUSES},
        truncated=episode.truncated,
        seconds=time.monotonic() - started,
        messages=tuple(episode.messages),
        record_ids=tuple(episode.record_ids),
        error=error,
        turn_tokens=tuple(episode.turn_tokens),
    )


def run_episode(environment: Environment, task: Task, endpoint: ChatEndpoint) -> EpisodeResult:
    """``play_episode`` on an event loop of its own, closing the environment's episode
    resources before the loop ends; call it from a thread without a running loop."""

    async def play() -> EpisodeResult:
        try:
            return await play_episode(environment, task, endpoint)
        finally:
            await environment.close()

    return asyncio.run(play())


async def _loop(
    environment: Environment,
    endpoint: ChatEndpoint,
    http: aiohttp.ClientSession,
    episode: _Episode,
) -> None:
    """Ask and step until a final answer (a ``_Stop``) or the turn limit (a return)."""
    for _ in range(environment.limits.max_turns):
        reply, record_id = await _ask(endpoint, http, episode)
        episode.turns += 1
        if record_id:
            episode.record_ids.append(record_id)
        message, calls = _assistant_message(reply)
        episode.turn_tokens.append(turn_tokens(reply))
        episode.messages.append(message)
        if not calls:
            raise _Stop("finished", "")
        if episode.remaining() <= 0:
            raise _Stop("timeout", episode.limit_text())
        step = await environment.step(calls, episode.deadline)
        episode.add_step(step)
        if episode.remaining() <= 0:
            raise _Stop("timeout", episode.limit_text())


def _request_body(endpoint: ChatEndpoint, episode: _Episode) -> dict[str, Any]:
    """The next turn's request in the endpoint's dialect: the conversation so far and
    the tools, with the endpoint's params; never streamed (read as one document)."""
    body: dict[str, Any] = {
        **endpoint.params,
        "model": endpoint.model,
        "messages": episode.messages,
    }
    body.pop("stream", None)
    if episode.tools:
        body["tools"] = episode.tools
    if endpoint.dialect == "anthropic":
        body = openai_request_to_anthropic(body, model=endpoint.model)
    return body


async def _ask(
    endpoint: ChatEndpoint, http: aiohttp.ClientSession, episode: _Episode
) -> tuple[Any, str | None]:
    """The endpoint's reply (parsed JSON) to the conversation so far and its record id.
    Raises ``_Stop``: ``timeout`` past the episode's deadline, ``error`` for a failed
    call, ``malformed`` for a body that is not JSON."""
    remaining = episode.remaining()
    if remaining <= 0:
        raise _Stop("timeout", f"{episode.limit_text()} before the model was asked")
    body = _request_body(endpoint, episode)
    headers = {"content-type": "application/json", "x-reef-session": episode.session_id}
    headers.update({k: v for k, v in endpoint.headers.items() if k.lower() != "x-reef-session"})
    if endpoint.api_key:
        headers["authorization"] = f"Bearer {endpoint.api_key}"
    budget = min(endpoint.timeout_seconds, remaining)
    endpoint.admit()
    try:
        async with http.post(
            endpoint.chat_url,
            data=dumps(body),
            headers=headers,
            timeout=aiohttp.ClientTimeout(total=budget),
        ) as response:
            raw = await response.read()
            status, record_id = response.status, response.headers.get("x-reef-record-id")
    except TimeoutError as exc:
        if budget >= remaining:
            raise _Stop("timeout", f"{episode.limit_text()} waiting for the model") from exc
        raise _Stop("error", f"the model did not answer within {budget:.3g} s") from exc
    except aiohttp.ClientError as exc:
        raise _Stop(
            "error", f"could not reach {endpoint.chat_url}: {type(exc).__name__}: {exc}"
        ) from exc
    if status != 200:
        text = raw.decode("utf-8", "replace")[:500]
        raise _Stop("error", f"the model endpoint answered {status}: {text}")
    try:
        reply = loads(raw)
    except ValueError as exc:
        raise _Stop("malformed", f"the reply is not JSON: {raw[:200]!r}") from exc
    endpoint.charge(reply)
    if endpoint.dialect == "anthropic" and isinstance(reply, dict):
        reply = anthropic_response_to_openai(reply)
    return reply, record_id


def _assistant_message(reply: Any) -> tuple[dict[str, Any], list[Any]]:
    """The reply's first choice as the assistant message to append (every tool call
    given an id and a name, see ``normalize_call``) and its tool calls as sent (for
    ``step`` to judge); raises ``_Stop("malformed")``."""
    choices = reply.get("choices") if isinstance(reply, dict) else None
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise _Stop("malformed", "the reply has no choices")
    message = choices[0].get("message")
    if not isinstance(message, dict):
        raise _Stop("malformed", "the reply's first choice has no message")
    content = message.get("content")
    out: dict[str, Any] = {"role": "assistant", "content": content}
    calls = message.get("tool_calls")
    if calls is None or calls == []:
        return out, []
    if not isinstance(calls, list):
        raise _Stop("malformed", f"the reply's tool_calls is a {type(calls).__name__}, not a list")
    out["tool_calls"] = [normalize_call(call, index) for index, call in enumerate(calls)]
    return out, calls
