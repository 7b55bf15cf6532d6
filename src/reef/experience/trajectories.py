"""Trajectories: a session's records assembled into a tree of turns.

A *turn* is one distinct request of the session (its canonical conversation and the
tools it offered, ``reef.experience.exchanges``) with the model's reply. Records that
send the same request again are *attempts* of one turn (a retry), not new turns; the
turn's ``record_id`` is its newest attempt that succeeded (else its newest attempt).

Each turn hangs under the turn whose conversation it continues — its *parent* — found
the way the gateway infers sessions, and ``link`` says how it was found:

- ``start``: the first turn of a conversation (no earlier turn to continue);
- ``continues``: the request starts with the parent's whole conversation and reply
  (the longest such parent wins);
- ``system_changed``: it does so once system messages are left out of both (the agent
  rewrote its system prompt between turns);
- ``compacted``: the agent truncated or summarised its history, so no earlier
  conversation is a prefix; the parent is the newest earlier turn whose reply the
  request still carries, else the session's newest earlier turn.

``new_messages`` are what the request added after the parent's reply: the user's next
message and the tool results (``tool_results`` pairs each with the call it answers, by
``tool_call_id``). Two turns continuing one parent are a fork; each path from a root to
a leaf is a *branch*, listed with the record that answered each of its turns (for a
turn that forked after a retry, the attempt the next turn continued).

Nothing of the recorded conversation is lost: every message of every request is in its
turn's ``messages`` (tool calls with their ids, names and arguments, tool results with
their ``tool_call_id``), in canonical form; the record itself stays readable by id.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

from reef.core.jsoncodec import canonical_json, sha256_hex
from reef.experience.exchanges import CanonicalExchange, canonical_exchange
from reef.experience.records import FeedbackView, RecordView
from reef.upstream.canonical import chain_hashes, extend_chain

Link = Literal["start", "continues", "system_changed", "compacted"]


@dataclass(frozen=True)
class Attempt:
    """One record of a turn: a sending of its request and what came back."""

    record_id: str
    status: str
    error: str | None
    reply: dict[str, Any] | None
    release_id: str | None
    purpose: str
    created_at: datetime
    feedback: tuple[FeedbackView, ...] = ()

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {
            "record_id": self.record_id,
            "status": self.status,
            "error": self.error,
            "reply": self.reply,
            "release_id": self.release_id,
            "purpose": self.purpose,
            "created_at": self.created_at.isoformat(),
            "feedback": [fb.as_dict() for fb in self.feedback],
        }


@dataclass
class Turn:
    """One distinct request of the session and its reply (see the module doc)."""

    id: str  # the first record that sent this request
    index: int  # order of first appearance in the session
    api: str
    parent: str | None
    parent_record_id: str | None
    link: Link
    messages: list[dict[str, Any]]
    new_messages: list[dict[str, Any]]
    tool_results: list[dict[str, Any]]
    system: str | None
    system_changed: bool
    tools: list[dict[str, Any]]
    tool_choice: Any
    attempts: list[Attempt] = field(default_factory=list)
    children: list[str] = field(default_factory=list)
    depth: int = 0

    @property
    def answered(self) -> Attempt:
        """The newest attempt that succeeded, else the newest attempt."""
        ok = [attempt for attempt in self.attempts if attempt.status == "ok"]
        return (ok or self.attempts)[-1]

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form (the admin API)."""
        answered = self.answered
        return {
            "id": self.id,
            "index": self.index,
            "depth": self.depth,
            "api": self.api,
            "parent": self.parent,
            "parent_record_id": self.parent_record_id,
            "link": self.link,
            "children": list(self.children),
            "record_id": answered.record_id,
            "status": answered.status,
            "reply": answered.reply,
            "system": self.system,
            "system_changed": self.system_changed,
            "tools": self.tools,
            "tool_choice": self.tool_choice,
            "new_messages": self.new_messages,
            "tool_results": self.tool_results,
            "messages": self.messages,
            "retries": len(self.attempts) - 1,
            "attempts": [attempt.as_dict() for attempt in self.attempts],
        }


@dataclass(frozen=True)
class Branch:
    """A path from a root turn to a leaf: its turns and the record answering each."""

    turns: tuple[str, ...]
    records: tuple[str, ...]
    newest: tuple[datetime, str]  # (created_at, record id) of the leaf's newest attempt

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {"turns": list(self.turns), "records": list(self.records), "leaf": self.turns[-1]}


@dataclass
class Trajectory:
    """A session's turns (by first appearance), its roots and its branches."""

    scenario: str
    session_id: str
    turns: dict[str, Turn]
    roots: list[str]
    branches: list[Branch]
    turn_of_record: dict[str, str]
    # Feedback on the session as a whole (``POST /reef/feedback`` with a ``session_id``).
    outcomes: tuple[FeedbackView, ...] = ()

    def main_branch(self) -> Branch:
        """The branch ending in the newest attempt: where the task ended."""
        return max(self.branches, key=lambda branch: branch.newest)

    def branch_through(self, record_id: str | None) -> Branch:
        """The newest branch through ``record_id``'s turn, cut after that turn; the main
        branch when ``record_id`` is None. Raises ``KeyError`` for a record not here."""
        if record_id is None:
            return self.main_branch()
        turn_id = self.turn_of_record[record_id]
        through = [branch for branch in self.branches if turn_id in branch.turns]
        branch = max(through, key=lambda b: b.newest)
        end = branch.turns.index(turn_id) + 1
        records = (*branch.records[: end - 1], record_id)
        return Branch(branch.turns[:end], records, branch.newest)

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form (``GET /reef/scenarios/{s}/sessions/{id}``'s ``trajectory``)."""
        return {
            "scenario": self.scenario,
            "session_id": self.session_id,
            "roots": list(self.roots),
            "turns": [turn.as_dict() for turn in self.turns.values()],
            "branches": [branch.as_dict() for branch in self.branches],
            "main_branch": self.main_branch().as_dict() if self.branches else None,
            "outcomes": [feedback.as_dict() for feedback in self.outcomes],
        }


# -- assembly ---------------------------------------------------------------------------


def _request_key(exchange: CanonicalExchange, api: str) -> str:
    body = {"api": api, "messages": exchange.messages, "tools": exchange.tools}
    return sha256_hex(canonical_json(body))


def _without_system(messages: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    return [message for message in messages if message.get("role") != "system"]


def _system_text(messages: Sequence[dict[str, Any]]) -> str | None:
    texts = [str(m.get("content", "")) for m in messages if m.get("role") == "system"]
    return "\n".join(texts) if texts else None


def _continuation(messages: Sequence[dict[str, Any]], reply: dict[str, Any]) -> str:
    chain = chain_hashes(list(messages))
    return extend_chain(chain[-1] if chain else None, reply)


@dataclass(frozen=True)
class _Continued:
    turn_id: str
    record_id: str


class _Assembler:
    """Builds the turns one record at a time, in the session's order."""

    def __init__(self) -> None:
        self.turns: dict[str, Turn] = {}
        self.by_request: dict[str, str] = {}
        self.turn_of_record: dict[str, str] = {}
        # conversation + reply hashes of every answered attempt, with and without system
        self.continued: dict[str, _Continued] = {}
        self.continued_no_system: dict[str, _Continued] = {}
        self.replies: list[tuple[dict[str, Any], _Continued]] = []

    def add(self, record: RecordView) -> None:
        exchange = canonical_exchange(record)
        attempt = Attempt(
            record_id=record.id,
            status=record.status,
            error=record.error,
            reply=exchange.reply,
            release_id=record.release_id,
            purpose=record.purpose,
            created_at=record.created_at,
            feedback=record.feedback,
        )
        key = _request_key(exchange, record.api)
        turn_id = self.by_request.get(key)
        if turn_id is None:
            turn_id = self._new_turn(record, exchange)
            self.by_request[key] = turn_id
        self.turns[turn_id].attempts.append(attempt)
        self.turn_of_record[record.id] = turn_id
        if exchange.reply is not None:
            found = _Continued(turn_id, record.id)
            self.continued[_continuation(exchange.messages, exchange.reply)] = found
            no_system = _without_system(exchange.messages)
            self.continued_no_system[_continuation(no_system, exchange.reply)] = found
            self.replies.append((exchange.reply, found))

    def _new_turn(self, record: RecordView, exchange: CanonicalExchange) -> str:
        messages = exchange.messages
        link, parent, start = self._parent(messages)
        parent_turn = self.turns[parent.turn_id] if parent is not None else None
        new_messages = list(messages[start:])
        system = _system_text(messages)
        turn = Turn(
            id=record.id,
            index=len(self.turns),
            api=record.api,
            parent=parent.turn_id if parent is not None else None,
            parent_record_id=parent.record_id if parent is not None else None,
            link=link,
            messages=messages,
            new_messages=new_messages,
            tool_results=_tool_results(new_messages, messages),
            system=system,
            system_changed=parent_turn is not None and parent_turn.system != system,
            tools=exchange.tools,
            tool_choice=exchange.tool_choice,
            depth=parent_turn.depth + 1 if parent_turn is not None else 0,
        )
        self.turns[turn.id] = turn
        if parent_turn is not None:
            parent_turn.children.append(turn.id)
        return turn.id

    def _parent(self, messages: list[dict[str, Any]]) -> tuple[Link, _Continued | None, int]:
        """How the request links to an earlier turn: the link, the parent, and where in
        ``messages`` what the request added begins."""
        chain = chain_hashes(messages)
        for end in range(len(messages) - 1, -1, -1):
            found = self.continued.get(chain[end])
            if found is not None and messages[end].get("role") == "assistant":
                return "continues", found, end + 1
        kept = [i for i, message in enumerate(messages) if message.get("role") != "system"]
        stripped = chain_hashes([messages[i] for i in kept])
        for end in range(len(kept) - 1, -1, -1):
            found = self.continued_no_system.get(stripped[end])
            if found is not None and messages[kept[end]].get("role") == "assistant":
                return "system_changed", found, kept[end] + 1
        if not self.turns:
            return "start", None, 0
        for reply, found in reversed(self.replies):
            carried = [i for i, message in enumerate(messages) if message == reply]
            if carried:
                return "compacted", found, carried[-1] + 1
        newest = self.turns[next(reversed(self.turns))]
        assistants = [i for i, m in enumerate(messages) if m.get("role") == "assistant"]
        start = assistants[-1] + 1 if assistants else 0
        return "compacted", _Continued(newest.id, newest.answered.record_id), start


def _tool_results(
    new_messages: list[dict[str, Any]], messages: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """The tool messages among ``new_messages``, each with the call it answers (found in
    the conversation's assistant messages by id; ``call`` is None when none matches)."""
    calls: dict[str, dict[str, Any]] = {}
    for message in messages:
        for call in message.get("tool_calls") or ():
            if call.get("id"):
                calls[call["id"]] = call
    return [
        {
            "tool_call_id": message.get("tool_call_id"),
            "content": message.get("content", ""),
            "call": calls.get(str(message.get("tool_call_id"))),
        }
        for message in new_messages
        if message.get("role") == "tool"
    ]


def _branches(turns: dict[str, Turn], roots: list[str]) -> list[Branch]:
    found: list[Branch] = []

    def walk(path: list[str], records: list[str]) -> Iterator[Branch]:
        turn = turns[path[-1]]
        if not turn.children:
            answered = turn.answered
            newest = max((a.created_at, a.record_id) for a in turn.attempts)
            yield Branch(tuple(path), (*records, answered.record_id), newest)
            return
        for child in turn.children:
            continued = turns[child].parent_record_id or turn.answered.record_id
            yield from walk([*path, child], [*records, continued])

    for root in roots:
        found.extend(walk([root], []))
    return found


def assemble_trajectory(
    scenario: str,
    session_id: str,
    records: Sequence[RecordView],
    outcomes: Sequence[FeedbackView] = (),
) -> Trajectory:
    """The trajectory tree of one session's ``records`` (in the store's turn order, as
    ``ExperienceStore.get_session`` returns them) with the ``outcomes`` given on the
    session (``ExperienceStore.session_feedback``). Raises ``InvalidInputError`` for a
    record of an api that has no canonicaliser (``reef.experience.exchanges``)."""
    assembler = _Assembler()
    for record in records:
        assembler.add(record)
    turns = assembler.turns
    roots = [turn.id for turn in turns.values() if turn.parent is None]
    return Trajectory(
        scenario=scenario,
        session_id=session_id,
        turns=turns,
        roots=roots,
        branches=_branches(turns, roots),
        turn_of_record=assembler.turn_of_record,
        outcomes=tuple(outcomes),
    )
