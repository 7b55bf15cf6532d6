"""The shape of a short structured answer, and the spans of a text that share it.

A correction usually restates the value in the answer's own form: an order number for
an order number, an ISO date for an ISO date, a code with the same run of letters and
digits. ``same_shape_spans`` finds those spans in the user's follow-up, so a correction
is heard whatever words surround it ("my order number is 48213", "hmm, 48213?").

Shapes: ``money`` ($42.99), ``money_after`` (1 240,50 €), ``percent`` (15%),
``iso_date`` (2024-03-14), ``slash_date`` (12/05/2024), ``text_date`` (1 July 2025,
May 12), ``number`` (84, 1,250, 10.45, 7,50), ``quantity`` (a number and a unit: 2.4 kg,
any number with the same unit) and ``code``: any
other single token (or two, as in a postal code) mixing letters and digits, or of
capitals only, matched run for run (``A7-3391`` has the shape of ``A7-3319``, not of
``A7-33910``). Anything else (words, sentences) has no shape; a label vocabulary, when
the scenario has one, stands in for it (``vocabulary_spans``).
"""

from __future__ import annotations

import re
from collections.abc import Collection

_AROUND = r"(?<![\w.,/$€£-]){}(?![\w/%-]|[.,]\d)"
_MONTH = (
    r"(?:jan(?:uary)?|feb(?:ruary)?|mar(?:ch)?|apr(?:il)?|may|june?|july?|aug(?:ust)?|"
    r"sep(?:t(?:ember)?)?|oct(?:ober)?|nov(?:ember)?|dec(?:ember)?|"
    r"janvier|février|mars|avril|mai|juin|juillet|août|septembre|octobre|novembre|décembre|"
    r"januar|februar|märz|juni|juli|oktober|dezember|"
    r"enero|febrero|marzo|abril|mayo|junio|julio|agosto|septiembre|octubre|noviembre|diciembre)"
)
_SHAPES: tuple[tuple[str, str], ...] = (
    (
        "text_date",
        rf"(?i:\d{{1,2}}(?:st|nd|rd|th)?\.? {_MONTH}(?: \d{{4}})?"
        rf"|{_MONTH} \d{{1,2}}(?:st|nd|rd|th)?(?:,? \d{{4}})?)",
    ),
    ("money", r"[$€£]\d+(?:[.,]\d+)*"),
    ("money_after", r"\d{1,3}(?:[ \u00a0.,]\d{3})*(?:[.,]\d+)?\s?[$€£]"),
    ("percent", r"\d+(?:[.,]\d+)?%"),
    ("iso_date", r"\d{4}-\d{2}-\d{2}"),
    ("slash_date", r"\d{1,2}/\d{1,2}/\d{2,4}"),
    ("number", r"\d+(?:[.,]\d+)*"),
)
_CODE_PART = re.compile(r"[A-Z]+|[a-z]+|\d+|[^A-Za-z\d]")
_CODE = re.compile(r"[A-Za-z\d]+(?:[-_ /.][A-Za-z\d]+)*")


NUMBER_WORDS = frozenset(
    (
        "zero",
        "one",
        "two",
        "three",
        "four",
        "five",
        "six",
        "seven",
        "eight",
        "nine",
        "ten",
        "eleven",
        "twelve",
        "thirteen",
        "fourteen",
        "fifteen",
        "sixteen",
        "seventeen",
        "eighteen",
        "nineteen",
        "twenty",
    )
)
_QUANTITY = re.compile(r"(\d+(?:[.,]\d+)*)(\s?)([A-Za-z°µ%]{1,5})")


def value_shape(value: str) -> str | None:
    """The shape of ``value`` (module doc), else None."""
    text = value.strip()
    for name, pattern in _SHAPES:
        if re.fullmatch(pattern, text):
            return name
    if _QUANTITY.fullmatch(text) and not any(c.isupper() for c in text):
        return "quantity"
    if len(text) > 40 or not _CODE.fullmatch(text) or text.count(" ") > 1:
        return None
    if " " in text and not all(
        any(c.isdigit() for c in part) or part.isupper() for part in text.split(" ")
    ):
        return None  # "ZenBook 14" is a name; "NW1 6XE" is a code
    has_digit = any(c.isdigit() for c in text)
    capitals = text.replace("-", "").replace("_", "").replace(" ", "").isupper()
    if has_digit or (capitals and len(text) >= 2):
        return "code"
    return None


def _code_pattern(value: str) -> str:
    """A regex matching tokens with ``value``'s runs of capitals, small letters and
    digits, each of the same length, and its separators."""
    parts = []
    for run in _CODE_PART.findall(value.strip()):
        if run.isdigit():
            parts.append(rf"\d{{{len(run)}}}")
        elif run.isupper():
            parts.append(rf"[A-Z]{{{len(run)}}}")
        elif run.islower():
            parts.append(rf"[a-z]{{{len(run)}}}")
        else:
            parts.append(re.escape(run))
    return "".join(parts)


def same_shape_spans(answer: str, text: str) -> list[str]:
    """The spans of ``text`` with the shape of ``answer``, in order (none when the
    answer has no shape)."""
    shape = value_shape(answer)
    if shape is None:
        return []
    if shape == "code":
        pattern = _code_pattern(answer)
    elif shape == "quantity":  # the same unit after any number: "2.4 kg" for "4.2 kg"
        unit = _QUANTITY.fullmatch(answer.strip())
        assert unit is not None
        pattern = rf"\d+(?:[.,]\d+)*\s?{re.escape(unit.group(3))}"
    else:
        pattern = dict(_SHAPES)[shape]
    return [m.group(0) for m in re.finditer(_AROUND.format(pattern), text)]


def loose_code_spans(answer: str, text: str) -> list[str]:
    """For a code answer: the tokens of ``text`` as long as it, with its separators in
    the same places and a digit or capital, whatever kind each other character is
    ("XR-200-B" for "XR-200-8")."""
    if value_shape(answer) != "code" or " " in answer.strip():
        return []
    code = answer.strip()
    found = []
    for match in re.finditer(r"(?<![\w-])[A-Za-z\d]+(?:[-_/.][A-Za-z\d]+)*(?![\w-])", text):
        token = match.group(0)
        separators = [i for i, c in enumerate(code) if not c.isalnum()]
        if len(token) != len(code) or separators != [
            i for i, c in enumerate(token) if not c.isalnum()
        ]:
            continue
        if any(c.isdigit() or c.isupper() for c in token):
            found.append(token)
    return found


def vocabulary_spans(vocabulary: Collection[str], text: str) -> list[str]:
    """The labels of ``vocabulary`` that ``text`` names as whole words, longest first
    where one contains another ("not spam" before "spam"), in order of appearance."""
    found: list[tuple[int, str]] = []
    taken: list[tuple[int, int]] = []
    for label in sorted(vocabulary, key=len, reverse=True):
        if not label.strip():
            continue
        for match in re.finditer(rf"(?<!\w){re.escape(label)}(?!\w)", text, re.IGNORECASE):
            if any(s < match.end() and match.start() < e for s, e in taken):
                continue
            taken.append((match.start(), match.end()))
            found.append((match.start(), label))
    return [label for _, label in sorted(found)]


def normalised(value: str) -> str:
    """``value`` as compared: case, surrounding quotes and punctuation, inner spaces
    ignored."""
    return re.sub(r"\s+", " ", value.strip(" \t\n\"'`“”«»„.,;:!?")).casefold()
