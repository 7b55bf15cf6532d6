"""Personal and contact data in free text: found, typed, and replaced by placeholders.

``find_personal_data(text)`` returns typed spans; ``scrub_personal_text`` and
``scrub_personal_value`` replace each with its kind's placeholder (``<EMAIL>``,
``<PHONE>``, …), so what a learner copies from traffic into a harness keeps its shape
and loses the person; ``personal_data_key`` compares findings across spellings.

Kinds, in the order they claim text (an earlier kind's span wins an overlap):

- ``URL``: links carrying credentials (``user:pass@``) or a token-like query parameter
  (``token``, ``key``, ``sig``, ``password``, …); plain links are ``LINK`` and are found
  but not scrubbed (they are rarely personal, often useful, and the gate sends a harness
  that adds one to review);
- ``SECRET``: private-key blocks, bearer tokens, JWTs, keys with a vendor prefix
  (``sk-``, ``ghp_``, ``AKIA``, ``xox?-``, ``AIza``, ``glpat-``, ``hf_``, …) and the
  value of ``password=…`` / ``api_key: …`` assignments;
- ``EMAIL`` (also ``name [at] host [dot] com``), ``IBAN`` (ISO 13616 mod-97 checked),
  ``CARD`` (13 to 19 digits, Luhn checked), ``SSN`` (US ``123-45-6789``, valid areas),
  ``IP`` (IPv4 and IPv6, checked by ``ipaddress``);
- ``PHONE``: international (``+44 20 7946 0958``, ``0044 …``), North American
  (``(555) 010-0100``, ``555-010-0100``, ``1-800-555-0199``, ``555-0100``) and national
  forms (``020 7946 0958``, ``01 23 45 67 89``, ``030/1234567``), extensions included;
  bare digit runs count only next to a word such as "call", "phone" or "tel", and
  numbers after "order", "id", "ticket", … only in a phone's usual shape;
- ``ADDRESS``: street addresses (``221B Baker Street``, ``1600 Pennsylvania Ave NW``,
  ``Hauptstraße 5``, ``12 rue de la Paix``), PO boxes, UK postcodes, and US
  ``City, ST 12345`` tails.

Regular expressions and checksums only: nothing is downloaded, nothing is slow.
What it cannot see — people's names, dates of birth, free-form addresses without a
street word — it leaves; the labelled set in ``tests/learning/data/pii_labelled.jsonl``
measures what it does see.
"""

from __future__ import annotations

import ipaddress
import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

SCRUBBED_KINDS = ("SECRET", "URL", "EMAIL", "IBAN", "CARD", "SSN", "IP", "PHONE", "ADDRESS")
"""The kinds ``scrub_personal_text`` replaces (``LINK`` is found, never replaced)."""


@dataclass(frozen=True)
class PersonalData:
    """One span of ``text`` that holds personal or contact data of ``kind``."""

    kind: str
    start: int
    end: int
    text: str

    @property
    def placeholder(self) -> str:
        """What replaces it: ``<KIND>``."""
        return f"<{self.kind}>"


# -- secrets -----------------------------------------------------------------------------

_SECRET = re.compile(
    r"-----BEGIN [A-Z ]*PRIVATE KEY-----[\s\S]*?-----END [A-Z ]*PRIVATE KEY-----"
    r"|\bBearer\s+[A-Za-z0-9._~+/=-]{16,}"
    r"|\beyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}"
    r"|\b(?:sk|pk|rk)-(?:ant-|proj-|live-|test-)?[A-Za-z0-9_-]{16,}"
    r"|\b(?:sk|pk|rk)_(?:live|test)_[A-Za-z0-9]{16,}"
    r"|\b(?:ghp|gho|ghu|ghs|ghr)_[A-Za-z0-9]{30,}|\bgithub_pat_[A-Za-z0-9_]{30,}"
    r"|\bxox[abposr]-[A-Za-z0-9-]{10,}"
    r"|\b(?:AKIA|ASIA)[0-9A-Z]{16}\b"
    r"|\bAIza[0-9A-Za-z_-]{35}"
    r"|\bglpat-[A-Za-z0-9_-]{20,}"
    r"|\bhf_[A-Za-z0-9]{30,}"
    r"|\bSG\.[A-Za-z0-9_-]{16,}\.[A-Za-z0-9_-]{16,}"
    r"|(?i:\b(?:api[_ -]?key|secret(?:[_ -]?key)?|access[_ -]?(?:key|token)|auth[_ -]?token"
    r"|client[_ -]?secret|password|passwd|pwd|passcode|token)\b[\"']?\s*(?:[:=]|\bis\b)\s*"
    r"[\"']?)(?=[^\s\"']*[0-9!@#$%^&*])[^\s\"',;]{6,}",
)
# The assignment form: only the value is the secret, the key name stays readable.
_SECRET_VALUE_OF = re.compile(
    r"(?i)^(?:api[_ -]?key|secret(?:[_ -]?key)?|access[_ -]?(?:key|token)|auth[_ -]?token"
    r"|client[_ -]?secret|password|passwd|pwd|passcode|token)\b[\"']?\s*(?:[:=]|\bis\b)\s*[\"']?"
)

# -- links -------------------------------------------------------------------------------

_LINK = re.compile(
    r"\b[a-z][a-z0-9+.-]{1,15}://[^\s<>\"'`)\]}]+|\bwww\.[a-z0-9-]+\.[^\s<>\"'`)\]}]+",
    re.IGNORECASE,
)
_CREDENTIAL_LINK = re.compile(
    r"^[a-z][a-z0-9+.-]*://[^/\s@]*:[^/\s@]+@"
    r"|[?&#](?:access_token|id_token|refresh_token|token|api_?key|key|apikey|sig|signature"
    r"|password|pwd|pass|secret|auth|session(?:id)?|sid|code|x-amz-signature"
    r"|x-amz-credential|client_secret)=[^&\s]{4,}",
    re.IGNORECASE,
)

# -- e-mail ------------------------------------------------------------------------------

_EMAIL = re.compile(
    r"(?<![\w.+-])[^\W_][\w.%+'-]{0,63}@"
    r"(?:[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?\.)+[A-Za-z]{2,24}\b"
    r"|(?<![\w.+-])[^\W_][\w.+-]{0,63}%40(?:[A-Za-z0-9-]+\.)+[A-Za-z]{2,24}\b"
    r"|(?<![\w.])[A-Za-z0-9][A-Za-z0-9._-]{0,63}\s*[\[(\{]\s*at\s*[\])\}]\s*"
    r"[A-Za-z0-9-]+(?:\s*(?:[\[(\{]\s*dot\s*[\])\}]|\.)\s*[A-Za-z0-9-]+)+"
    r"|(?<![\w.])[a-z0-9][a-z0-9._-]{0,63}(?: dot [a-z0-9_-]+)* at [a-z0-9-]{2,} dot "
    r"(?:com|org|net|edu|gov|io|co"
    r"|uk|de|fr|es|it|nl|ca|au|in|jp)\b(?: dot [a-z]{2,3}\b)?",
)

# -- bank and card numbers ---------------------------------------------------------------

_IBAN = re.compile(
    r"\b[A-Z]{2}\d{2}(?:[ -]?[A-Z0-9]{4}){2,7}(?:[ -]?[A-Z0-9]{1,3})?\b"
    r"|\b[a-z]{2}\d{2}[a-z0-9]{11,30}\b"
)
_CARD = re.compile(r"(?<![\w.-])\d(?:[ -]?\d){12,18}(?!\d|\.\d)")
_SSN = re.compile(
    r"(?<![\d-])(?!000|666|9\d\d)\d{3}([- ])(?!00)\d{2}\1(?!0000)\d{4}(?![\d-])"
    r"|(?i:(?<=ssn)|(?<=ssn:)|(?<=ssn )|(?<=ssn: )|(?<=ssn#)|(?<=security number )"
    r"|(?<=security number: )|(?<=security no\. ))(?!000|666|9\d\d)\d{9}\b"
)

# -- IP addresses ------------------------------------------------------------------------

_IPV4 = re.compile(r"(?<![\w.])(?:\d{1,3}\.){3}\d{1,3}(?:/\d{1,2})?(?![\w]|\.\d)")
# A candidate holds two colons; ``ipaddress`` decides (times such as 10:30:00 fail it).
_IPV6 = re.compile(
    r"(?<![\w:.])(?=[0-9A-Fa-f:.]*:[0-9A-Fa-f.]*:)[0-9A-Fa-f:.]{3,45}(?:/\d{1,3})?(?![\w:])"
)
_VERSION_BEFORE = re.compile(r"(?i)\b(?:v|version|release|build|ver\.?)\s*$")

# -- phone numbers -----------------------------------------------------------------------

_PHONE = re.compile(
    r"(?<![\w@/.+#$€£=-])"
    r"(?:(?:\+|\b00)\s?\d{1,3}[\s.-]{0,2}|\(\+\d{1,3}\)\s?|\b1[\s.-]?)?"
    r"(?:\(\d{1,5}\)[\s.-]{0,2}|\(0\)\s?)?"
    r"\d{1,15}(?:(?:[ .\-/\u00a0\u2013]|\s?[-/\u2013]\s?)\d{1,12}){0,6}"
    r"(?:\s*(?:ext\.?|x|extension|#)\s*\d{1,5})?"
    r"(?![\w@]|[.,/-]\d|\.[a-zA-Z])",
    re.IGNORECASE,
)
_VANITY = re.compile(
    r"\b(?:1[\s.-])?8(?:00|33|44|55|66|77|88)[\s.-][A-Z0-9]{3,4}[\s.-]?[A-Z]{0,4}\b"
)
_PHONE_WORD = re.compile(
    r"(?i)(?:\b(?:call|caller|phone|tel|telephone|mobile|mob|cell|fax|dial|text|sms|whats ?app"
    r"|telefon|telefono|teléfono|téléphone|tél|handy|mobil|portable|móvil|cellulare"
    r"|ring|hotline|helpline|number|no\.|nr\.?|reach|contact|landline|line)\b|☎|📞)"
    r"[^\n\d+]{0,24}$"
)
# A date, alone or leading ("2026-12-03 18:05"): never a phone.
_DATE = re.compile(
    r"(?:\d{4}[-./]\d{1,2}[-./]\d{1,2}|\d{1,2}[-./]\d{1,2}[-./](?:\d{4}|\d{2})"
    r"|\d{4}[-./]\d{1,2}|\d{1,2}[-./]\d{4})(?:\s|$)"
)
# Identifiers that look like numbers to call: not phones unless written with a "+" or in
# the 3-3-4 shape of a North American number.
_NOT_PHONE_WORD = re.compile(
    r"(?i)\b(?:id|order|invoice|ticket|tracking|ref(?:erence)?|case|serial|isbn|sku"
    r"|meeting|booking|confirmation|part|model|policy|build|lot|batch|version)\b"
    r"[^\n\d]{0,15}$"
)
_NANP = re.compile(r"(?:1[\s.-]?)?(?:\(\d{3}\)\s?|\d{3}[\s.-])\d{3}[\s.-]\d{4}")
_DOTTED_QUAD = re.compile(r"\d{1,3}(?:\.\d{1,3}){3}")  # an IP's shape, valid or not
_DECIMAL = re.compile(r"\d\.\d+\s|\s\d+\.\d")
_THOUSANDS = re.compile(r"\d{1,3}(?:([ .,\u00a0])\d{3})(?:\1\d{3})*")
_YEAR_RANGE = re.compile(r"(?:1[89]|20)\d\d\s?[-/]\s?(?:1[89]|20)\d\d")

# -- street addresses --------------------------------------------------------------------

_STREET_TYPES = (
    r"street|st|avenue|ave|av|road|rd|boulevard|blvd|lane|ln|drive|dr|court|ct|way|place"
    r"|pl|terrace|ter|circle|cir|parkway|pkwy|highway|hwy|square|sq|crescent|cres|close"
    r"|grove|gardens|row|mews|walk|hill|trail|trl|alley|plaza|loop"
)
_NAME_WORD = r"(?:[A-Z][A-Za-z'.-]*|\d{1,3}(?:st|nd|rd|th)|[a-z][a-z'-]{2,})"
# Words that make "3 blocks down the street" a distance, not an address.
_STOP_TEXT = (
    "the a an of to in on at by for from with and or my your our their his her its "
    "this that these those down up over into out about more less than per each every "
    "some any many few all other next last first minutes hours days weeks blocks "
    "steps miles km times items people users lanes roads streets main-road busy"
)
_STOP = frozenset(_STOP_TEXT.split())
_STREET_TYPE = re.compile(_STREET_TYPES, re.IGNORECASE)
_UNIT = r"(?i:apt|apartment|suite|ste|unit|flat|floor|fl|#)"
_STREET = re.compile(
    r"\b\d{1,6}[A-Za-z]?(?:[-/]\d{1,4}[A-Za-z]?)?,?\s+"
    r"(?:(?:[NSEW]|North|South|East|West)\.?\s+)?"
    rf"(?P<name>(?:{_NAME_WORD}\s+){{1,4}}?)(?P<type>(?i:{_STREET_TYPES}))\b\.?"
    r"(?:\s+(?:[NS][EW]|[NSEW])\b\.?)?"
    rf"(?:,?\s*{_UNIT}\.?\s*#?\s*[A-Za-z0-9-]{{1,6}}\b)?"
    r"(?:,\s*[A-Z][A-Za-z .'-]{1,30},\s*[A-Z]{2}\s+\d{5}(?:-\d{4})?)?"
)
_EUROPEAN_STREET = re.compile(
    r"\b[A-ZÄÖÜ][a-zäöüß]+(?:straße|strasse|str\.|weg|allee|platz|gasse|ring|damm|ufer)"
    r"\s+\d{1,4}[a-z]?(?:,\s*\d{5}\s+[A-ZÄÖÜ][a-zäöüß]+)?"
    r"|\b[A-ZÄÖÜ][\wäöüß.-]+(?:\s+(?:[a-zäöü]{2,4}|[A-ZÄÖÜ][\wäöüß.-]+)){0,3}\s+\d{1,4}[a-z]?"
    r",\s*\d{5}\s+[A-ZÄÖÜ][a-zäöüß]+"
    r"|\b\d{1,4}(?:\s?(?:bis|ter))?,?\s+(?:rue|avenue|av\.|boulevard|bd|place|chemin|allée"
    r"|impasse|quai)\s+(?:(?:de|du|des|la|le|l'|d')\s*)*[A-ZÉÈ][\wÉÈéèêàç'-]+"
    r"(?:[ -][A-ZÉÈ][\wÉÈéèêàç'-]+){0,3}(?:,\s*\d{5}\s+[A-Z][a-zéèêàç-]+)?"
    r"|\b(?:Calle|Avenida|Avda\.|Paseo|Plaza|Carrer|Rua|Via|Viale|Piazza|Corso)\s+"
    r"(?:(?:de|del|la|di|della|do|da)\s+)*[A-Z][\w'-]+(?:\s+[A-Z][\w'-]+){0,2},?\s+\d{1,4}\b"
)
_PO_BOX = re.compile(r"\b(?:P\.?\s?O\.?\s?Box|Post Office Box)\s+\d{1,7}\b", re.IGNORECASE)
_CITY_STATE_ZIP = re.compile(r"\b[A-Z][a-z]+(?: [A-Z][a-z]+)?,\s*[A-Z]{2}\s+\d{5}(?:-\d{4})?\b")
_UK_POSTCODE = re.compile(r"\b(?:GIR 0AA|[A-PR-UWYZ][A-HK-Y]?\d[A-Z\d]?\s?\d[ABD-HJLNP-UW-Z]{2})\b")


def _luhn(digits: str) -> bool:
    total = 0
    for index, char in enumerate(reversed(digits)):
        value = int(char)
        if index % 2:
            value = value * 2 - 9 if value > 4 else value * 2
        total += value
    return total % 10 == 0


def _iban_valid(text: str) -> bool:
    compact = re.sub(r"[ -]", "", text).upper()
    if not 15 <= len(compact) <= 34:
        return False
    moved = compact[4:] + compact[:4]
    number = "".join(str(int(c, 36)) for c in moved)
    return int(number) % 97 == 1


def _card_valid(text: str) -> bool:
    digits = re.sub(r"\D", "", text)
    return 13 <= len(digits) <= 19 and len(set(digits)) > 1 and _luhn(digits)


def _ip_valid(text: str, before: str) -> bool:
    address = text.split("/", 1)[0]
    try:
        ipaddress.ip_address(address)
    except ValueError:
        return False
    return ":" in address or not _VERSION_BEFORE.search(before)


def _phone_valid(text: str, before: str) -> bool:
    core = re.sub(r"(?i)\s*(?:ext\.?|x|extension|#)\s*\d{1,5}$", "", text).strip()
    digits = re.sub(r"\D", "", core)
    international = core.startswith(("+", "00"))
    if not (international or _NANP.fullmatch(core)) and _NOT_PHONE_WORD.search(before):
        return False
    cue = bool(_PHONE_WORD.search(before))
    sure = international or cue or "(" in core
    if not 7 <= len(digits) <= 15 or (len(digits) > 12 and not sure):
        return False
    if _DATE.match(core) or _YEAR_RANGE.fullmatch(core) or _DOTTED_QUAD.fullmatch(core):
        return False
    if not (international or cue) and ("/" in core or _DECIMAL.search(core)):
        return False  # ratios ("828 / 1428") and columns of figures ("3.34 3.04 2.00")
    if not re.search(r"[\s.\-/()]", core):
        return international or cue
    if not sure and _THOUSANDS.fullmatch(core):
        return False
    groups = re.findall(r"\d+", core)
    # "12 34" style pairs of short numbers are counts and scores; four or more pairs
    # ("01 23 45 67 89") are how much of Europe writes a phone number.
    return sure or max(len(g) for g in groups) >= 3 or len(groups) >= 4


def _street_valid(match: re.Match[str], _text: str) -> bool:
    words = match.group("name").split()
    if any(word.lower() in _STOP for word in words):
        return False
    if any(word.islower() and _STREET_TYPE.fullmatch(word) for word in words):
        return False  # "a 2 lane road"
    if (match.group("type") or "").lower() in {"st", "dr", "ct", "pl", "way", "row", "walk"}:
        # Short or common type words need a capitalized street name ("10 Downing St"),
        # unless a flat or suite number follows ("123 main st apt 4b").
        capitalized = all(w[0].isupper() or w[0].isdigit() for w in words)
        tail = match.string[match.end("type") : match.end()]
        return capitalized or re.search(_UNIT, tail) is not None
    return True


Finder = Callable[[str], list[PersonalData]]
Check = Callable[[re.Match[str], str], bool]


def _always(_match: re.Match[str], _text: str) -> bool:
    return True


def _finder(kind: str, pattern: re.Pattern[str], check: Check = _always) -> Finder:
    def find(text: str) -> list[PersonalData]:
        return [
            PersonalData(kind, match.start(), match.end(), match.group(0))
            for match in pattern.finditer(text)
            if check(match, text)
        ]

    return find


def _find_secrets(text: str) -> list[PersonalData]:
    found = []
    for match in _SECRET.finditer(text):
        start = match.start()
        key = _SECRET_VALUE_OF.match(match.group(0))
        if key is not None:
            start += key.end()
        found.append(PersonalData("SECRET", start, match.end(), text[start : match.end()]))
    return found


def _find_links(text: str) -> list[PersonalData]:
    found = []
    for match in _LINK.finditer(text):
        link = match.group(0).rstrip(".,;:!?")
        kind = "URL" if _CREDENTIAL_LINK.search(link) else "LINK"
        found.append(PersonalData(kind, match.start(), match.start() + len(link), link))
    return found


def _find_phones(text: str) -> list[PersonalData]:
    found = []
    for match in _PHONE.finditer(text):
        value = match.group(0).rstrip(" .-/")
        if value.count(")") > value.count("("):
            value = value[: value.index(")")]
        start = match.start()
        if _phone_valid(value, text[max(0, start - 40) : start]):
            found.append(PersonalData("PHONE", start, start + len(value), value))
    for match in _VANITY.finditer(text):
        if re.search(r"[A-Z]{3}", match.group(0)):
            found.append(PersonalData("PHONE", match.start(), match.end(), match.group(0)))
    return found


def _ipv4(match: re.Match[str], text: str) -> bool:
    return _ip_valid(match.group(0), text[max(0, match.start() - 12) : match.start()])


_FINDERS: tuple[Finder, ...] = (
    _find_links,
    _find_secrets,
    _finder("EMAIL", _EMAIL),
    _finder("IBAN", _IBAN, lambda m, _t: _iban_valid(m.group(0))),
    _finder("CARD", _CARD, lambda m, _t: _card_valid(m.group(0))),
    _finder("SSN", _SSN),
    _finder("IP", _IPV6, lambda m, _t: _ip_valid(m.group(0), "")),
    _finder("IP", _IPV4, _ipv4),
    _find_phones,
    _finder("ADDRESS", _STREET, _street_valid),
    _finder("ADDRESS", _EUROPEAN_STREET),
    _finder("ADDRESS", _PO_BOX),
    _finder("ADDRESS", _CITY_STATE_ZIP),
    _finder("ADDRESS", _UK_POSTCODE),
)


def find_personal_data(text: str) -> list[PersonalData]:
    """Every span of personal or contact data in ``text``, in order, without overlaps
    (an earlier kind in the module docstring's list wins an overlap)."""
    taken: list[PersonalData] = []
    for finder in _FINDERS:
        for item in finder(text):
            if item.end > item.start and not any(
                item.start < other.end and other.start < item.end for other in taken
            ):
                taken.append(item)
    return sorted(taken, key=lambda item: item.start)


def scrub_personal_text(text: str, counts: Counter[str] | None = None) -> str:
    """``text`` with every scrubbed kind replaced by its placeholder; ``counts`` (when
    given) is increased by one per replacement, by kind."""
    pieces = []
    cursor = 0
    for item in find_personal_data(text):
        if item.kind not in SCRUBBED_KINDS:
            continue
        pieces.append(text[cursor : item.start])
        pieces.append(item.placeholder)
        cursor = item.end
        if counts is not None:
            counts[item.kind] += 1
    if not pieces:
        return text
    pieces.append(text[cursor:])
    return "".join(pieces)


def scrub_personal_value(value: Any, counts: Counter[str] | None = None) -> Any:
    """A copy of ``value`` (a string, or JSON-like lists and mappings) with every string
    scrubbed by ``scrub_personal_text``; mapping keys are structure and stay."""
    if isinstance(value, str):
        return scrub_personal_text(value, counts)
    if isinstance(value, dict):
        return {key: scrub_personal_value(item, counts) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [scrub_personal_value(item, counts) for item in value]
    return value


def personal_data_key(item: PersonalData) -> str:
    """A comparable form of a finding: digits only for numbers, lower case otherwise,
    so ``(555) 010-0100`` and ``555.010.0100`` are the same phone."""
    if item.kind in {"PHONE", "CARD", "SSN"}:
        digits = re.sub(r"\D", "", item.text)
        return digits[-10:] if item.kind == "PHONE" else digits
    return re.sub(r"\s+", " ", item.text).strip().lower()
