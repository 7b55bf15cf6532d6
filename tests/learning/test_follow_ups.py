"""``read_follow_up`` and the value shapes, rule by rule: each with a follow-up where it
fires and one where it must not (the corpus measures them together)."""

from __future__ import annotations

import pytest

from reef.learning.follow_ups import PhraseRules, Reading, read_follow_up
from reef.learning.value_shapes import same_shape_spans, value_shape, vocabulary_spans

ORDER_Q = 'Extract the order number: "my order 48213 has not arrived"'
INTENTS = ("billing", "shipping", "refund", "technical", "account")


def read(said: str, answer: str = "48231", **more: object) -> Reading:
    return read_follow_up(said, answer=answer, question=ORDER_Q, **more)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "said",
    [
        "hmm, I think it's actually 48213?",
        "My order number is 48213.",
        "the order number is 48213",
        "it should be 48213",
        "It's 48213, not 48231.",
        "not 48231 but 48213",
        "you swapped two digits, it's 48213",
        "48213",
        "I wrote 48213",
        "nein, es ist 48213",
        "non, c'est 48213",
        "debería ser 48213",
    ],
)
def test_the_ways_people_correct_an_order_number(said: str) -> None:
    assert read(said) == Reading(complaint=True, accept=False, rephrase=False, correction="48213")


@pytest.mark.parametrize(
    "said",
    [
        "that doesn't look right",
        "you mixed up the digits",
        "can you recheck?",
        "that's not my order number",
        "why 48231?",
        "48231 isn't my order",
    ],
)
def test_complaints_without_a_value(said: str) -> None:
    assert read(said) == Reading(complaint=True, accept=False, rephrase=False, correction=None)


@pytest.mark.parametrize(
    ("said", "accept"),
    [
        ("no, that's all, thanks", True),  # a polite closing
        ("not bad at all", True),  # praise as a negation
        ("no need, I found it myself", False),  # a refusal of more help
        ("no, what about the refund for order 48300?", False),  # a new request
        ("No. Now check order 48300 please", False),
        ("thanks! now check order 555", True),  # moves on: 555 is no correction
        ("now check order 48300", False),
    ],
)
def test_a_no_or_a_value_that_is_no_complaint(said: str, accept: bool) -> None:
    reading = read(said)
    assert (reading.complaint, reading.accept, reading.correction) == (False, accept, None)


def test_a_value_must_be_in_the_message_and_differ_from_the_answer() -> None:
    assert read("it's 48231, not 48213", answer="48231").correction is None
    assert read("no, it's 48231", answer="48231").correction is None
    # a correction after a new request in the same message is still heard
    said = "it's 48213, and please check 48300 next"
    assert read(said).correction == "48213"


def test_labels_align_on_the_scenario_vocabulary() -> None:
    reading = read_follow_up(
        "they didn't ask for a refund, it's shipping", answer="refund", vocabulary=INTENTS
    )
    assert (reading.complaint, reading.correction) == (True, "shipping")
    accepted = read_follow_up("right, refund. Thanks", answer="refund", vocabulary=INTENTS)
    assert (accepted.complaint, accepted.accept) == (False, True)


def test_free_text_corrections_and_descriptions() -> None:
    assert read_follow_up("no, it's Canberra", answer="Sydney").correction == "Canberra"
    assert read_follow_up("July, not June", answer="1 June 2025").correction == "July"
    said = "that's the biggest city, not the capital"
    assert read_follow_up(said, answer="Sydney") == Reading(True, False, False, None)
    code = "the table is users, it should be `SELECT COUNT(*) FROM users;`"
    fixed = read_follow_up(code, answer="SELECT COUNT(*) FROM user;").correction
    assert fixed == "SELECT COUNT(*) FROM users;"


def test_rephrase_needs_the_question_and_no_complaint() -> None:
    question = "how do I reset my password on the mobile app?"
    again = read_follow_up(
        "how can I reset my password on the mobile app?", answer="Tap Sign out.", question=question
    )
    assert again == Reading(False, False, True, None)
    assert not read_follow_up("how can I reset my password?", answer="x").rephrase


def test_configured_phrases_replace_the_defaults() -> None:
    rules = PhraseRules.compile([r"\bnein\b"], [r"\bdanke\b"], [r"richtig ist (?P<correction>\w+)"])
    reading = read_follow_up("Nein, richtig ist T9", answer="T1 Team", rules=rules)
    assert (reading.complaint, reading.correction) == (True, "T9")
    assert not read_follow_up("that's wrong", answer="T1 Team", rules=rules).complaint


@pytest.mark.parametrize(
    ("answer", "shape"),
    [
        ("48231", "number"),
        ("1,250", "number"),
        ("$24.99", "money"),
        ("15%", "percent"),
        ("2024-03-04", "iso_date"),
        ("12/05/2024", "slash_date"),
        ("1 June 2025", "text_date"),
        ("4.2 kg", "quantity"),
        ("A7-3319", "code"),
        ("NW1 6XF", "code"),
        ("FRK", "code"),
        ("ZenBook 14", None),
        ("Sydney", None),
    ],
)
def test_value_shapes(answer: str, shape: str | None) -> None:
    assert value_shape(answer) == shape


def test_spans_of_the_same_shape() -> None:
    assert same_shape_spans("A7-3319", "it's A7-3391 or A7-33910 or a7-3391") == ["A7-3391"]
    assert same_shape_spans("4.2 kg", "it weighs 2.4 kg, not 2.4 lb") == ["2.4 kg"]
    assert same_shape_spans("2024-03-04", "on 2024-03-14, May 12") == ["2024-03-14"]
    assert same_shape_spans("Sydney", "Canberra") == []
    assert vocabulary_spans(("spam", "not spam"), "that's not spam, or spam?") == [
        "not spam",
        "spam",
    ]


@pytest.mark.parametrize(
    ("said", "answer", "value"),
    [
        ("No, it's billing, not BILLING SHIP.", "BILLING SHIP", "billing"),
        ("No, it's shipping, not FRK.", "FRK", "shipping"),
        ("No, it's Squid-7, not that.", "a long answer about squids", "Squid-7"),
    ],
)
def test_x_not_the_answer_gives_x_whatever_the_answer_s_shape(
    said: str, answer: str, value: str
) -> None:
    assert read_follow_up(said, answer=answer).correction == value
