"""Reading a user's next message against the answer it follows.

``read_follow_up(said, answer=…, question=…)`` says whether the follow-up complains
about the answer, accepts it or asks the question again, and, for a complaint, which
value it gives as the right one. The rules read the exchange, not only the follow-up:

1. **Moving on.** The message is cut into clauses; a clause that opens a new request
   ("now check order 555", "and when does it end?", "what about …") is set aside: its
   values belong to the new request, never to a correction. A bare "no" just before such
   a clause ("No. Now check order 31151") is no complaint either.
2. **Guards.** A "no" or "not" that is no complaint is struck out before the complaint
   rules run: a polite closing ("no, that's all, thanks"), praise as a negation ("not
   bad at all", "nothing wrong with that"), a refusal of more help ("no need", "no
   thanks").
3. **Complaints** (``complaint_patterns``): a leading "no"; wrong / incorrect / not
   right; hedges and near-misses ("hmm, I think it's actually …", "that doesn't look
   right", "close, but", "not quite"); a misreading or mix-up ("you mixed up …", "you
   swapped", "wrong order"); the user restating what they said ("I said", "I wrote");
   a request to redo or recheck; a value with a verb of obligation ("it should be X");
   a question about where the answer came from ("why billing?"); French, German and
   Spanish forms of the same. A follow-up that states a value other than the answer
   ("it's 48213", "48213" alone, "the capital is Canberra", a quoted span) complains
   too. A complaint that is only a leading "no" beside an explicit acceptance ("no, you
   got it right") is an acceptance.
4. **Corrections**, tried in order, the first that passes the precision guards wins:
   a code block or inline code; a quoted span; "X, not Y" / "not Y but X" / "X instead
   of Y" (where Y is, or is part of, the answer); a value after a copula or a verb of
   obligation ("my order number is X", "it should be X", "I wrote X", "it says X");
   shape alignment (``reef.learning.value_shapes``): the one span of the answer's shape
   that differs from it, or the one label of the scenario's vocabulary other than the
   answer (when several differ, the one the user's question contained; never one after
   "not"); for an answer of several words, the run that differs from it in one word of
   the same kind ("Nimbus 3000" for "Nimbus 300"); a value given alone after the
   complaint ("no, Canberra").
5. **Precision guards.** A correction must appear in the user's message (outside a
   clause that moves on) and differ from the answer; where the answer has a shape, the
   value is narrowed to the span of that shape (or a vocabulary label) and dropped when
   there is none; free text is dropped when it reads as a description ("the time", "way
   off") rather than a value.

Everything is regular expressions and small functions: deterministic, about 0.2 ms a
message. The phrase lists are ``SignalsConfig`` settings (English, French, German and
Spanish by default, in ``reef.learning.follow_up_phrases``); the structure (clauses,
guards, shapes) is fixed.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Sequence
from dataclasses import dataclass

from reef.learning.follow_up_phrases import (
    BARE_LEAD,
    BARE_NO_THEN_MOVE,
    CLAUSE_END,
    CONTRAST,
    COPULA_LEAD,
    CUT,
    DEFAULT_ACCEPTS,
    DEFAULT_COMPLAINTS,
    DEFAULT_CORRECTIONS,
    FILLER,
    GUARD_PATTERNS,
    LEADING_NO,
    MOVES_ON,
    NAMED_RIGHT,
    NOT_A_VALUE,
    POINTING,
    STATED,
    STATED_LOOSELY,
)
from reef.learning.value_shapes import (
    NUMBER_WORDS,
    loose_code_spans,
    normalised,
    same_shape_spans,
    value_shape,
    vocabulary_spans,
)


@dataclass(frozen=True)
class PhraseRules:
    """The configurable phrase lists, compiled (``SignalsConfig`` builds them)."""

    complaints: tuple[re.Pattern[str], ...]
    accepts: tuple[re.Pattern[str], ...]
    corrections: tuple[re.Pattern[str], ...]

    @classmethod
    def compile(
        cls, complaints: Sequence[str], accepts: Sequence[str], corrections: Sequence[str]
    ) -> PhraseRules:
        """The lists, compiled case-insensitive."""

        def each(patterns: Sequence[str]) -> tuple[re.Pattern[str], ...]:
            return tuple(re.compile(p, re.IGNORECASE) for p in patterns)

        return cls(each(complaints), each(accepts), each(corrections))


DEFAULT_RULES = PhraseRules.compile(DEFAULT_COMPLAINTS, DEFAULT_ACCEPTS, DEFAULT_CORRECTIONS)
_WORD = re.compile(r"\w+")
_QUESTIONED = "the follow-up questions the answer"
_EXPLICIT = "\x00explicit\x00"  # marks an X of "X, not <the answer>"
_PART = "\x00part\x00"  # marks a candidate that replaces a part of the answer


@dataclass(frozen=True)
class Reading:
    """What a follow-up says about the answer before it (module doc)."""

    complaint: bool
    accept: bool
    rephrase: bool
    correction: str | None = None


def read_follow_up(
    said: str,
    *,
    answer: str = "",
    question: str = "",
    rules: PhraseRules = DEFAULT_RULES,
    vocabulary: Collection[str] = (),
    rephrase_similarity: float = 0.6,
) -> Reading:
    """Read the user's follow-up ``said`` to ``answer`` (the reply it follows), given
    the ``question`` that answer answered and the scenario's label ``vocabulary``."""
    text = said.strip()
    kept = _kept_clauses(text)
    body = " ".join(kept)
    guarded = _struck(body)
    complaints: list[object] = [p for p in rules.complaints if p.search(guarded)]
    if _questions_the_answer(guarded, answer):
        complaints.append(_QUESTIONED)
    accepted = any(p.search(NAMED_RIGHT.sub(" ", text)) for p in rules.accepts)
    only_no = bool(complaints) and all(
        isinstance(p, re.Pattern) and _leading_no_only(p, guarded) for p in complaints
    )
    complaint = bool(complaints) and not (
        only_no and accepted and not _is_value_restated(answer, body, vocabulary)
    )
    if not complaint and not accepted and not text.endswith("?"):
        complaint = _is_value_restated(answer, body, vocabulary) or (
            _stated(body, answer, vocabulary) is not None
        )
    if complaint:
        value = _correction(body, answer, question, rules, vocabulary)
        return Reading(True, False, False, value)
    rephrase = bool(question) and _similar(question, text, rephrase_similarity)
    return Reading(False, accepted, rephrase)


def _questions_the_answer(body: str, answer: str) -> bool:
    """The follow-up asks where the answer came from ("why billing?", "where did 4.2
    come from?") or says what the answer really is ("Acme is the company, …",
    "62094 isn't my order")."""
    words = answer.split()
    if not words or len(answer) > 60:
        return False
    first = re.escape(words[0].strip(".,;:!?\"'"))
    asked = re.search(
        rf"\b(why|where did|where does|how come|since when)\b[^.?!]*(?<!\w){first}(?!\w)",
        body,
        re.IGNORECASE,
    )
    whole = re.escape(answer.strip())
    said_is = re.search(
        rf"(?<!\w){whole}(?!\w)\s+((is|was|are|isn'?t|wasn'?t|is not)\s+(the|a|an|when|where|my|"
        rf"our|not)\b|(doesn'?t|does not) (exist|match|fit))|^\W*{whole}\s*\?",
        body,
        re.IGNORECASE,
    )
    return asked is not None or said_is is not None


def _kept_clauses(text: str) -> list[str]:
    """The clauses of ``text`` that do not move on to a new request."""
    clauses = [c for c in CLAUSE_END.split(text) if c and c.strip()]
    kept: list[str] = []
    for index, clause in enumerate(clauses):
        if MOVES_ON.search(clause) and not _redo(clause):
            continue
        following = clauses[index + 1] if index + 1 < len(clauses) else ""
        if BARE_NO_THEN_MOVE.match(clause) and following and MOVES_ON.search(following):
            continue
        kept.append(clause)
    return kept


def _redo(clause: str) -> bool:
    """Whether a clause asks to redo the answer (words inside quotes are another text's)."""
    own = re.sub(r"[\"“„«][^\"“”„«»]*[\"”“»]", " ", clause)
    return bool(re.search(r"\b(again|recheck|redo|re-?classify|wrong|not)\b", own, re.I))


def _struck(text: str) -> str:
    for guard in GUARD_PATTERNS:
        text = guard.sub(" ", text)
    return text


def _leading_no_only(pattern: re.Pattern[str], text: str) -> bool:
    match = pattern.search(text)
    return match is not None and LEADING_NO.match(text) is not None and match.start() == 0


def _is_value_restated(answer: str, body: str, vocabulary: Collection[str]) -> bool:
    """A short follow-up that states a value of the answer's shape (or another label)
    other than the answer: "48213", "it's FRA", "shipping"."""
    words = _WORD.findall(body)
    spans = same_shape_spans(answer, body)
    if spans:  # a value counts as one word, however many digits groups it has
        words = _WORD.findall(re.sub("|".join(map(re.escape, spans)), " V ", body))
    if not answer or not words or len(words) > 6 or body.rstrip().endswith("?"):
        return False
    if value_shape(answer) is None and not _in_vocabulary(answer, vocabulary):
        bare = _bare(body, answer)
        return bare is not None and _valid(bare, body, answer)
    return _aligned(answer, body, "", vocabulary) is not None


def _stated(body: str, answer: str, vocabulary: Collection[str]) -> str | None:
    """A value other than the answer that ``body`` states outright: in code, in quotes or
    after a copula ("the capital is Canberra", "it's `git branch feature`")."""
    for candidate in _quoted(body) + _statements(body, answer):
        value = _narrowed(candidate, answer, vocabulary)
        if value is not None and _valid(value, body, answer):
            return value
    return None


def _quoted(body: str) -> list[str]:
    found = re.findall(r"```(?:\w+\n)?\s*([^`]+?)\s*```", body)
    found += re.findall(r"(?<!`)`([^`\n]+)`(?!`)", body)
    found += [m.group(2) for m in re.finditer(r"([\"“„«])\s*([^\"“”„«»]+?)\s*[\"”“»]", body)]
    return found


def _statements(body: str, answer: str) -> list[str]:
    found = [m.group("value") for m in STATED.finditer(body)]
    if value_shape(answer) is not None:  # the shape keeps a loose subject precise
        found += [m.group("value") for m in STATED_LOOSELY.finditer(body)]
    return found


def _correction(
    body: str, answer: str, question: str, rules: PhraseRules, vocabulary: Collection[str]
) -> str | None:
    """The right value the complaint ``body`` gives (module doc, rules 4-5)."""
    for candidate in _candidates(body, answer, rules):
        value = _narrowed(candidate, answer, vocabulary)
        if value is not None and _valid(value, body, answer):
            return value
    aligned = _aligned(answer, body, question, vocabulary) or _near_miss(answer, body)
    if aligned is not None:
        return aligned
    if BARE_LEAD.match(body) is None:
        return None
    bare = _bare(body, answer)
    return bare if bare is not None and _valid(bare, body, answer) else None


def _candidates(body: str, answer: str, rules: PhraseRules) -> list[str]:
    found = _quoted(body)
    for pattern in CONTRAST:
        for match in pattern.finditer(body):
            if _refers_to(match.group("y"), answer):
                x = COPULA_LEAD.sub("", match.group("x"))
                found.append(x)
                if _part_of(match.group("y"), answer):
                    found.append(_PART + x)
                elif _is_the_answer(match.group("y"), answer):
                    # "X, not <the answer>": X stands even without the answer's shape
                    found.append(_EXPLICIT + x)
    found += _statements(body, answer)
    for pattern in rules.corrections:
        configured = pattern.search(body)
        if configured:
            found.append(configured.group("correction"))
    return found


def _refers_to(said: str, answer: str) -> bool:
    """Whether ``said`` (the Y of "X, not Y") names the answer or a part of it."""
    y, a = normalised(said), normalised(answer)
    if y in POINTING:
        return True
    if not y or not a:
        return False
    words = {w for w in _WORD.findall(y) if len(w) > 3}
    return y in a or a in y or bool(words & set(_WORD.findall(a)))


def _is_the_answer(said: str, answer: str) -> bool:
    """Whether ``said`` is the answer, its beginning, or a word pointing at it."""
    y, a = normalised(said), normalised(answer)
    return y in POINTING or y == a or (len(y) >= 4 and a.startswith(y))


def _part_of(said: str, answer: str) -> bool:
    """Whether ``said`` is a proper part of the answer ("June" of "1 June 2025")."""
    y, a = normalised(said), normalised(answer)
    return bool(y) and y != a and re.search(rf"(?<!\w){re.escape(y)}(?!\w)", a) is not None


def _narrowed(candidate: str, answer: str, vocabulary: Collection[str]) -> str | None:
    for marker, most in ((_PART, 3), (_EXPLICIT, 6)):
        if candidate.startswith(marker):  # "July, not June": a part of the answer replaced
            value = candidate[len(marker) :].strip(" \t\"'`“”«»„.,:!?")
            short = 0 < len(_WORD.findall(value)) <= most and not NOT_A_VALUE.match(value)
            return value if short else None
    value = candidate.strip(" \t\"'`“”«»„.,:!?")
    if value_shape(answer) is not None:
        spans = same_shape_spans(answer, value) or loose_code_spans(answer, value)
        spans = [s for s in spans if normalised(s) != normalised(answer)]
        if spans:
            return spans[0]
        return None
    if vocabulary and _in_vocabulary(answer, vocabulary):
        labels = vocabulary_spans(vocabulary, value)
        labels = [v for v in labels if normalised(v) != normalised(answer)]
        if labels:
            return labels[0]
        # a label outside the vocabulary seen so far is read as free text
    if NOT_A_VALUE.match(value):
        return None
    value = CUT.sub("", FILLER.sub("", value)).strip(" \"'`.,:!?")
    if not value or NOT_A_VALUE.match(value) or len(_WORD.findall(value)) > 5:
        return None
    return value


def _in_vocabulary(answer: str, vocabulary: Collection[str]) -> bool:
    return normalised(answer) in {normalised(v) for v in vocabulary}


def _aligned(answer: str, body: str, question: str, vocabulary: Collection[str]) -> str | None:
    """The one span of the answer's shape (or label of the vocabulary) in ``body`` that
    differs from the answer; among several, the one the question contained."""
    if value_shape(answer) is not None:
        spans = same_shape_spans(answer, body)
        differ = [s for s in spans if normalised(s) != normalised(answer)]
        if not differ:  # "XR-200-B" for "XR-200-8": a character of another kind
            spans = loose_code_spans(answer, body)
    elif vocabulary and _in_vocabulary(answer, vocabulary):
        spans = vocabulary_spans(vocabulary, body)
    else:
        return None
    distinct: dict[str, str] = {}
    for span in spans:
        negated = rf"\b(not|nicht|pas|no|instead of|rather than)\s+{re.escape(span)}(?!\w)"
        if normalised(span) != normalised(answer) and not re.search(negated, body, re.I):
            distinct.setdefault(normalised(span), span)
    if len(distinct) == 1:
        return next(iter(distinct.values()))
    asked = [s for s in distinct.values() if normalised(s) in normalised(question)]
    return asked[0] if len(asked) == 1 else None


def _near_miss(answer: str, body: str) -> str | None:
    """For an answer of several words: the run of as many words in ``body`` that
    matches it but for one word of the same kind ("Nimbus 3000" for "Nimbus 300")."""
    want = answer.split()
    if not 2 <= len(want) <= 6:
        return None
    words = [w.strip(".,;:!?\"'()") for w in body.split()]
    for start in range(len(words) - len(want) + 1):
        window = words[start : start + len(want)]
        differ = [(a, b) for a, b in zip(want, window, strict=True) if a.lower() != b.lower()]
        if len(differ) == 1 and _same_kind(*differ[0]):
            return " ".join(window)
    return None


def _same_kind(first: str, second: str) -> bool:
    """Two words of the same kind of value: both with digits, or both capitalised."""
    digits = any(c.isdigit() for c in first) and any(c.isdigit() for c in second)
    return digits or (first[:1].isupper() and second[:1].isupper())


def _bare(body: str, answer: str) -> str | None:
    """A value given alone after the complaint word ("no, Jane Austen")."""
    rest = BARE_LEAD.sub("", body).strip(" \"'`.,;:!?")
    words = _WORD.findall(rest)
    if not rest or len(words) > 3 or "?" in rest or NOT_A_VALUE.match(rest):
        return None
    starts_like_value = rest[:1].isupper() or rest[:1].isdigit()
    if value_shape(answer) == "number" and normalised(rest) in NUMBER_WORDS:
        return rest  # "No, five." for "6"
    shares_word = bool({w.lower() for w in words} & {w.lower() for w in _WORD.findall(answer)})
    return rest if starts_like_value or shares_word else None


def _valid(value: str, body: str, answer: str) -> bool:
    """Rule 5: the value is in the user's message and differs from the answer."""
    return (
        bool(normalised(value))
        and normalised(value) in normalised(body)
        and (normalised(value) != normalised(answer))
    )


def _similar(first: str, second: str, threshold: float) -> bool:
    """Different texts whose word sets overlap by at least ``threshold`` (Jaccard)."""
    a = {w.lower() for w in _WORD.findall(first)}
    b = {w.lower() for w in _WORD.findall(second)}
    if not a or not b or first.strip().lower() == second.strip().lower():
        return False
    return len(a & b) / len(a | b) >= threshold
