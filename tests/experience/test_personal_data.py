"""The typed personal-data detector: the forms the issue names, the checksums that keep
look-alikes out, placeholders, and values compared across spellings. (Its recall on a
labelled set is measured in tests/learning/test_pii_scrubbing.py.)"""

from __future__ import annotations

from collections import Counter

import pytest

from reef.core import new_id
from reef.experience import (
    find_personal_data,
    personal_data_key,
    scrub_personal_text,
    scrub_personal_value,
)


@pytest.mark.parametrize(
    "text",
    [
        "tell customers to call 555-0100",
        "tell customers to call (555) 010-0100",
        "tell customers to call +44 20 7946 0958",
        "tell customers to call 1-800-555-0199",
    ],
)
def test_the_phone_forms_the_issue_names(text: str) -> None:
    assert scrub_personal_text(text) == "tell customers to call <PHONE>"


def test_checksums_keep_look_alikes_out() -> None:
    assert scrub_personal_text("card 4111 1111 1111 1111") == "card <CARD>"
    assert scrub_personal_text("card 4111 1111 1111 1112") != "card <CARD>"  # fails Luhn
    assert scrub_personal_text("IBAN GB82 WEST 1234 5698 7654 32") == "IBAN <IBAN>"
    assert "<IBAN>" not in scrub_personal_text("IBAN GB83 WEST 1234 5698 7654 32")
    assert scrub_personal_text("from 203.0.113.7") == "from <IP>"
    assert scrub_personal_text("from 999.0.113.7") == "from 999.0.113.7"
    assert scrub_personal_text("version 1.2.3.4 is out") == "version 1.2.3.4 is out"


def test_every_kind_gets_its_placeholder_and_counts() -> None:
    text = (
        "Dana (dana@example.com, 555-0142) at 221B Baker Street paid with "
        "4111-1111-1111-1111 from DE89 3704 0044 0532 0130 00; SSN 123-45-6789; "
        "key sk-proj-4f9aT7bQ2mXc8LpZ0rS3vW6y; "
        "https://files.example.com/r.pdf?token=9f8e7d6c5b4a; docs https://docs.example.com"
    )
    counts: Counter[str] = Counter()
    assert scrub_personal_text(text, counts) == (
        "Dana (<EMAIL>, <PHONE>) at <ADDRESS> paid with <CARD> from <IBAN>; SSN <SSN>; "
        "key <SECRET>; <URL>; docs https://docs.example.com"
    )
    assert counts == Counter(
        {k: 1 for k in ("EMAIL", "PHONE", "ADDRESS", "CARD", "IBAN", "SSN", "SECRET", "URL")}
    )
    # a plain link is found (for the gate), not scrubbed
    assert [f.kind for f in find_personal_data("see https://docs.example.com")] == ["LINK"]


def test_assignments_keep_their_key_and_lose_their_value() -> None:
    assert scrub_personal_text("password: hunter2!") == "password: <SECRET>"
    assert scrub_personal_text('api_key = "a8f5f167f44f4964"') == 'api_key = "<SECRET>"'
    assert scrub_personal_text("the password must be long") == "the password must be long"


def test_values_are_scrubbed_and_mapping_keys_are_not() -> None:
    value = {"ann@example.com": ["call 555-0100", 3, None], "n": {"to": "bo@example.org"}}
    assert scrub_personal_value(value) == {
        "ann@example.com": ["call <PHONE>", 3, None],
        "n": {"to": "<EMAIL>"},
    }


def test_one_phone_written_two_ways_has_one_key() -> None:
    first, second = (find_personal_data(t)[0] for t in ("(555) 010-0100", "+1 555.010.0100"))
    assert personal_data_key(first) == personal_data_key(second)
    email = find_personal_data("Ann@Example.com")[0]
    assert personal_data_key(email) == "ann@example.com"


def test_record_ids_dates_and_versions_are_not_personal_data() -> None:
    ids = ", ".join(new_id() for _ in range(50))
    clean = [
        f"Learned from records {ids}",
        "Released 2024-03-15 10:30 as v3.12.1; order #A-10234; ISBN 978-3-16-148410-0",
        "Scores 3.34 3.04 2.00 and ratios 828 / 1428; between 1990-2000; 1,234,567 users",
        "placeholders such as <PHONE> and <EMAIL> are not data",
    ]
    for text in clean:
        assert find_personal_data(text) == [], text
