"""The quickstart's application: an ordinary OpenAI SDK client of the gateway that
triages tickets, grades every answer and reports the grade (and, when wrong, the right
label) as feedback — what a real application with reviewers would do. With implicit
feedback (``--feedback implicit``) nobody grades: the simulated user answers in the same
conversation, as people do ("No, it's billing, not shipping."), and Reef's conversation
signals are the only feedback.

Held-out measurement goes through the gateway too, pinned to one release
(``x-reef-release``) and declared ``x-reef-purpose: eval``: recorded like any call,
never trained on.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import random
import threading
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import openai

from reef.quickstart.errors import QuickstartError
from reef.quickstart.scenario import Ticket, is_correct

CONCURRENCY = 8  # the engine batches concurrent requests; 8 keeps two cores busy

# The simulated users of ``--feedback implicit``: most, not all, say so when an answer
# is wrong; some thank a right one; a few complain about a right one. The signals'
# measured precision and recall in the report come from these.
FOLLOW_UP_WRONG = 0.85
THANK_RIGHT = 0.5
GRUMBLE_RIGHT = 0.05


@dataclass(frozen=True)
class Answer:
    """One answered ticket: what the model said, whether it was right, its receipt, and
    (implicit feedback) what the user said next, if anything."""

    ticket: Ticket
    text: str
    correct: bool
    record_id: str | None
    release_id: str | None
    follow_up: str | None = None


class Graded(Protocol):
    """What the rounds read of one unit of traffic or of measurement."""

    @property
    def correct(self) -> bool: ...

    @property
    def follow_up(self) -> str | None: ...


class App(Protocol):
    """An application the rounds drive: the triage app or the agent."""

    def measure(self, item: Any, release_id: str) -> Graded: ...

    def serve_and_grade(self, item: Any) -> Graded: ...

    def serve_and_reply(self, item: Any, seed: int) -> Graded: ...

    def learn(self) -> str: ...

    def serving_release(self) -> str | None: ...

    def close(self) -> None: ...


class GatewayClient:
    """What every quickstart application does with the gateway: an OpenAI SDK client,
    the serving release, learning jobs. ``url`` is the gateway (without ``/v1``)."""

    def __init__(self, url: str, scenario: str) -> None:
        self.url = url.rstrip("/")
        self.scenario = scenario
        self.client = openai.OpenAI(
            base_url=self.url + "/v1",
            api_key="quickstart",  # the gateway has no keys configured: any value
            max_retries=2,
            timeout=300.0,
        )
        self._sent: Counter[str] = Counter()
        self._sent_lock = threading.Lock()

    def traffic_session(self, text: str) -> str:
        """The session id the live traffic unit that starts with ``text`` is sent under
        (``x-reef-session``): drawn from the text and how many units began with it
        before, not at random. Selection splits training from the gate's holdout by the
        session's hash, so with the gateway's random session ids the same seed trained on
        different tickets on every run. (Two units with the same text are the same
        request and get the same answer: which of them gets which id does not matter.)"""
        with self._sent_lock:
            seen = self._sent[text]
            self._sent[text] += 1
        return "qs-" + hashlib.sha256(f"{seen}:{text}".encode()).hexdigest()[:32]

    def close(self) -> None:
        """Close the SDK client's connections."""
        self.client.close()

    def serving_release(self) -> str | None:
        """The release the gateway serves for the scenario now (``GET /reef/scenarios``)."""
        for scenario in get_json(self.url + "/reef/scenarios").get("data", []):
            if scenario.get("name") == self.scenario:
                serving = scenario.get("serving_release_id")
                return serving if isinstance(serving, str) else None
        return None

    def learn(self) -> str:
        """Queue a learning job (``POST /reef/scenarios/{s}/learn``); its id."""
        job = post_json(f"{self.url}/reef/scenarios/{self.scenario}/learn", {})
        return str(job["id"])


class TriageApp(GatewayClient):
    """The triage application."""

    def ask(self, ticket: Ticket, headers: dict[str, str] | None = None) -> Answer:
        """Triage one ticket through the gateway (the harness supplies the system
        prompt and the reply cap)."""
        try:
            raw = self.client.chat.completions.with_raw_response.create(
                model=f"reef/{self.scenario}",
                messages=[{"role": "user", "content": ticket.text}],
                extra_headers=headers or {},
            )
        except openai.APIError as error:
            raise QuickstartError(f"the gateway failed a request: {error}") from error
        completion = raw.parse()
        text = completion.choices[0].message.content or ""
        return Answer(
            ticket=ticket,
            text=text,
            correct=is_correct(text, ticket.label),
            record_id=raw.headers.get("x-reef-record-id"),
            release_id=raw.headers.get("x-reef-release-id"),
        )

    def feedback(self, answer: Answer) -> None:
        """The grader's verdict on ``answer``: score 1 or 0, the right label if wrong."""
        if answer.record_id is None:
            raise QuickstartError("the gateway sent no x-reef-record-id receipt")
        body: dict[str, Any] = {
            "record_ids": [answer.record_id],
            "score": 1.0 if answer.correct else 0.0,
        }
        if not answer.correct:
            body["correction"] = answer.ticket.label
        post_json(self.url + "/reef/feedback", body)

    def serve_and_grade(self, ticket: Ticket) -> Answer:
        """One unit of live traffic: ask, grade, send the feedback."""
        answer = self.ask(ticket, {"x-reef-session": self.traffic_session(ticket.text)})
        self.feedback(answer)
        return answer

    def serve_and_reply(self, ticket: Ticket, seed: int) -> Answer:
        """One unit of live traffic without a grader: ask; the user may then say, in the
        same conversation, that the answer was wrong (with the right label), or thank
        it (module doc). Nothing is posted to ``/reef/feedback``."""
        session = {"x-reef-session": self.traffic_session(ticket.text)}
        answer = self.ask(ticket, session)
        rng = random.Random(f"{seed}:{ticket.text}")  # noqa: S311 (seeded simulation)
        said = _what_the_user_says(answer, rng)
        if said is None:
            return answer
        conversation: list[Any] = [
            {"role": "user", "content": ticket.text},
            {"role": "assistant", "content": answer.text},
            {"role": "user", "content": said},
        ]
        try:
            self.client.chat.completions.create(
                model=f"reef/{self.scenario}",
                messages=conversation,
                max_tokens=8,
                extra_headers=session,
            )
        except openai.APIError as error:
            raise QuickstartError(f"the gateway failed a request: {error}") from error
        return dataclasses.replace(answer, follow_up=said)

    def measure(self, ticket: Ticket, release_id: str) -> Answer:
        """One held-out question, pinned to ``release_id``, recorded as ``eval``."""
        return self.ask(ticket, {"x-reef-release": release_id, "x-reef-purpose": "eval"})


def _what_the_user_says(answer: Answer, rng: random.Random) -> str | None:
    given = answer.text.strip()[:40] or "nothing"
    if not answer.correct:
        if rng.random() < FOLLOW_UP_WRONG:
            return f"No, it's {answer.ticket.label}, not {given}."
        return None
    if rng.random() < GRUMBLE_RIGHT:
        return "That's wrong."
    if rng.random() < THANK_RIGHT:
        return "Thanks, that's right."
    return None


Item = TypeVar("Item")
Result = TypeVar("Result")


def run_concurrently(
    work: Callable[[Item], Result],
    tickets: Sequence[Item],
    on_answer: Callable[[Result], None],
) -> list[Result]:
    """``work`` on every ticket, ``CONCURRENCY`` at once; ``on_answer`` after each (in
    the calling thread). Answers come back in ticket order."""
    answers: dict[int, Result] = {}
    with ThreadPoolExecutor(max_workers=CONCURRENCY, thread_name_prefix="triage") as pool:
        futures = {pool.submit(work, ticket): index for index, ticket in enumerate(tickets)}
        try:
            for future in as_completed(futures):
                answer = future.result()
                answers[futures[future]] = answer
                on_answer(answer)
        except BaseException:
            for future in futures:
                future.cancel()
            raise
    return [answers[index] for index in range(len(tickets))]


def post_json(url: str, body: dict[str, Any]) -> dict[str, Any]:
    """POST ``body``; the JSON answer. ``QuickstartError`` on an error status."""
    return _call(
        urllib.request.Request(  # noqa: S310 (the gateway's or engine's own http URL)
            url,
            data=json.dumps(body).encode(),
            headers={"content-type": "application/json"},
            method="POST",
        )
    )


def get_json(url: str) -> dict[str, Any]:
    """GET ``url``; the JSON answer. ``QuickstartError`` on an error status."""
    return _call(urllib.request.Request(url))  # noqa: S310 (the gateway's or engine's own http URL)


def _call(request: urllib.request.Request) -> dict[str, Any]:
    url = f"{request.get_method()} {request.full_url}"
    try:
        with urllib.request.urlopen(request, timeout=60) as response:  # noqa: S310 (the gateway's or engine's own http URL)
            data = json.loads(response.read() or b"{}")
    except urllib.error.HTTPError as error:
        detail = error.read().decode(errors="replace")
        raise QuickstartError(f"{url} answered {error.code}: {detail}") from error
    except urllib.error.URLError as error:
        raise QuickstartError(f"{url} failed: {error.reason}") from error
    if not isinstance(data, dict):
        raise QuickstartError(f"{url} answered {data!r}")
    return data
