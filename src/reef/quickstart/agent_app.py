"""The agent task's application: an order-support agent driven by a scripted client loop
through the official OpenAI SDK, as an application's own agent loop would drive it.

An episode is one customer request: the app sends it with the tools; while the model
answers with tool calls (at most ``MAX_TURNS`` model calls), the app runs each against
the shop (``agent.World``) and sends the results back in the same conversation, one
session (``x-reef-session``). The app then grades the outcome (``agent.grade``) — it
knows the right call and the fact the answer must name, as a real application with a
known-good answer does — and posts it as the session's outcome: score 1 or 0 and, when
it failed, a correction on the turn that went wrong (``{"tool_calls": [...]}`` for a
wrong or missing call, the right sentence for a wrong answer).

When the agent's first turn missed the call, the customer still gets served: the app
makes the right call itself (it knows it) and asks the model for the answer, in a
session of its own (``<session>.fallback``), and grades that answer like any reply
(score 1, or 0 with the right sentence). Held-out measurement never falls back: it
measures the agent's own episodes.
"""

from __future__ import annotations

import dataclasses
import json
import uuid
from dataclasses import dataclass
from typing import Any

import openai

from reef.quickstart.agent import (
    MAX_TURNS,
    TOOLS,
    Call,
    Request,
    Turn,
    Verdict,
    World,
    answers,
    grade,
    parse_arguments,
)
from reef.quickstart.application import GatewayClient, post_json
from reef.quickstart.errors import QuickstartError


@dataclass(frozen=True)
class Episode:
    """One request's episode: its turns, its grade, its session and release."""

    request: Request
    turns: tuple[Turn, ...]
    verdict: Verdict
    session_id: str
    release_id: str | None
    fallback: Turn | None = None

    @property
    def feedback_posted(self) -> int:
        """Feedback items the app posts for it: the outcome, and the fallback's grade."""
        return 1 + (self.fallback is not None)

    @property
    def corrections_posted(self) -> int:
        """Of those, the ones carrying a correction."""
        wrong_fallback = self.fallback is not None and not self.fallback_right
        return int(not self.correct) + int(wrong_fallback)

    @property
    def fallback_right(self) -> bool:
        """Whether the fallback's answer says the fact (``agent.answers``)."""
        return self.fallback is not None and answers(self.fallback.text, self.request.fact)

    @property
    def correct(self) -> bool:
        """Whether the episode succeeded."""
        return self.verdict.success

    @property
    def follow_up(self) -> str | None:
        """Nobody replies in the conversation: the app grades (explicit feedback)."""
        return None


class AgentApp(GatewayClient):
    """The application; ``world`` is the shop its tools run against."""

    def __init__(self, url: str, scenario: str, world: World) -> None:
        super().__init__(url, scenario)
        self.world = world

    def episode(
        self,
        request: Request,
        headers: dict[str, str] | None = None,
        session_id: str | None = None,
    ) -> Episode:
        """Run one episode through the gateway under ``session_id`` (default: a new
        random one) and grade it."""
        session_id = session_id or f"ep-{uuid.uuid4().hex}"
        sent = {"x-reef-session": session_id, **(headers or {})}
        messages: list[Any] = [{"role": "user", "content": request.text}]
        turns: list[Turn] = []
        release_id = None
        for _ in range(MAX_TURNS):
            turn, called, release_id = self._turn(messages, sent)
            turns.append(turn)
            if not turn.calls:
                break
            messages.append(
                {
                    "role": "assistant",
                    "content": turn.text or None,
                    "tool_calls": [c.model_dump(exclude_none=True) for c in called],
                }
            )
            for item, call in zip(called, turn.calls, strict=True):
                result = json.dumps(self.world.execute(call))
                messages.append({"role": "tool", "tool_call_id": item.id, "content": result})
        return Episode(request, tuple(turns), grade(request, turns), session_id, release_id)

    def _turn(
        self, messages: list[Any], headers: dict[str, str]
    ) -> tuple[Turn, list[Any], str | None]:
        """One model call: the turn, the SDK's function calls, the release."""
        try:
            raw = self.client.chat.completions.with_raw_response.create(
                model=f"reef/{self.scenario}",
                messages=messages,
                tools=TOOLS,  # type: ignore[arg-type]  # plain dicts of the SDK's shape
                extra_headers=headers,
            )
        except openai.APIError as error:
            raise QuickstartError(f"the gateway failed a request: {error}") from error
        message = raw.parse().choices[0].message
        called = [c for c in message.tool_calls or () if c.type == "function"]
        calls = tuple(Call(c.function.name, parse_arguments(c.function.arguments)) for c in called)
        turn = Turn(message.content or "", calls, raw.headers.get("x-reef-record-id"))
        return turn, called, raw.headers.get("x-reef-release-id")

    def fall_back(self, episode: Episode) -> Episode:
        """Serve the customer of an episode whose first turn missed the call: the right
        call's result, and the model's answer to it (module docstring)."""
        call = episode.request.call.to_openai()
        messages: list[Any] = [
            {"role": "user", "content": episode.request.text},
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {
                "role": "tool",
                "tool_call_id": call["id"],
                "content": json.dumps(self.world.execute(episode.request.call)),
            },
        ]
        turn, _, _ = self._turn(messages, {"x-reef-session": f"{episode.session_id}.fallback"})
        return dataclasses.replace(episode, fallback=turn)

    def feedback(self, episode: Episode) -> None:
        """The episode's outcome on its session: 1 or 0, and when it failed, a
        correction on the turn that went wrong."""
        body: dict[str, Any] = {
            "scenario": self.scenario,
            "session_id": episode.session_id,
            "score": 1.0 if episode.correct else 0.0,
        }
        verdict = episode.verdict
        if not verdict.success and verdict.wrong_turn is not None:
            body["feedback"] = verdict.why
            body["correction"] = verdict.correction
            if verdict.wrong_turn < len(episode.turns):
                record_id = episode.turns[verdict.wrong_turn].record_id
                if record_id is None:
                    raise QuickstartError("the gateway sent no x-reef-record-id receipt")
                body["record_ids"] = [record_id]
        post_json(self.url + "/reef/feedback", body)
        if episode.fallback is not None:
            if episode.fallback.record_id is None:
                raise QuickstartError("the gateway sent no x-reef-record-id receipt")
            graded: dict[str, Any] = {
                "record_ids": [episode.fallback.record_id],
                "score": 1.0 if episode.fallback_right else 0.0,
            }
            if not episode.fallback_right:
                graded["correction"] = episode.request.answer
            post_json(self.url + "/reef/feedback", graded)

    def serve_and_grade(self, request: Request) -> Episode:
        """One unit of live traffic: the episode, graded, its outcome posted. Its
        session comes from the request's text (``traffic_session``), so the same seed
        splits training from the gate's holdout the same way on every run."""
        episode = self.episode(request, session_id=self.traffic_session(request.text))
        if episode.verdict.wrong_turn == 0:
            episode = self.fall_back(episode)
        self.feedback(episode)
        return episode

    def serve_and_reply(self, request: Request, seed: int) -> Episode:
        """Implicit feedback is the triage task's (``--feedback implicit``)."""
        raise QuickstartError("--task agent grades outcomes: use --feedback explicit")

    def measure(self, request: Request, release_id: str) -> Episode:
        """One held-out episode, every turn pinned to ``release_id``, recorded as
        ``eval`` (never trained on)."""
        return self.episode(request, {"x-reef-release": release_id, "x-reef-purpose": "eval"})


__all__ = ["AgentApp", "Episode"]
