"""The quickstart's application: support-ticket triage, generated in-process.

A customer message is a greeting, one *core* sentence that carries the intent, an
optional detail and an optional sign-off, with slots (order numbers, products, amounts,
days) filled at random. Each label has several core templates; a fixed share of them is
**reserved for the held-out set**, so held-out accuracy measures phrasings the
application never sent as traffic, not memorised ones. The grader knows each message's
label (the generator wrote it), scores every answer with the same normalization as the
gate's ``normalized_exact`` scorer, and hands the right label back as a correction
when the answer is wrong — as a real application's reviewers would.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from reef.evaluation import normalize_text
from reef.quickstart.errors import QuickstartError

LABELS: tuple[str, ...] = ("billing", "shipping", "technical", "account", "cancellation", "sales")

# Short on purpose: on two CPU cores every prompt token is paid for by every request
# and every training step.
SYSTEM_PROMPT = (
    "Classify the customer's support message as one of: "
    + ", ".join(LABELS)
    + ". Answer with the label only."
)

_CORES: dict[str, tuple[str, ...]] = {
    "billing": (
        "I was charged {amount} twice for the same invoice.",
        "My invoice for {month} shows the wrong amount.",
        "Why did my card get billed {amount} on the {day}?",
        "The VAT on my last invoice is calculated incorrectly.",
        "I need a copy of the invoice for order {order}.",
        "My payment of {amount} failed but the money left my account.",
        "Can you update the credit card you bill every month?",
        "There is an unexpected {amount} fee on my statement.",
        "The receipt for order {order} lists a price I never agreed to.",
        "I was billed for the {plan} plan although I pay for the basic one.",
        "Please send the invoice to my accounting department instead.",
        "My bank statement shows a charge from you that I do not recognise.",
    ),
    "shipping": (
        "My package with order {order} has not arrived after {days} days.",
        "The tracking number for order {order} does not work.",
        "The courier left my {product} at the wrong address.",
        "When will order {order} be delivered?",
        "My {product} arrived with a crushed box.",
        "Can I change the delivery address of order {order}?",
        "The parcel says delivered but nothing is at my door.",
        "Do you ship the {product} to Canada?",
        "My order {order} is stuck in customs for {days} days.",
        "Only half of order {order} was in the parcel.",
        "Can I pick up my {product} at a store instead of having it shipped?",
        "The delivery of my {product} is {days} days late.",
    ),
    "technical": (
        "The app crashes every time I open the {feature} screen.",
        "My {product} does not connect to wifi anymore.",
        "I get error code {code} when I try to sync.",
        "The {product} firmware update failed halfway.",
        "The website shows a blank page after I log in.",
        "My {product} keeps rebooting every few minutes.",
        "The {feature} feature stopped working after the latest update.",
        "Bluetooth pairing with my {product} fails with error {code}.",
        "The mobile app freezes when I upload a photo.",
        "My {product} battery drains in an hour since the update.",
        "The export to PDF produces an empty file.",
        "Notifications from the app never show up on my phone.",
    ),
    "account": (
        "I forgot my password and the reset email never comes.",
        "How do I change the email address on my profile?",
        "My account is locked after too many login attempts.",
        "I want to add a second user to my account.",
        "Two-factor authentication codes are not accepted when I sign in.",
        "Please update the phone number on my profile to {phone}.",
        "I cannot log in with my Google account anymore.",
        "How do I change my username?",
        "Someone else seems to have logged into my account.",
        "I want to merge my two accounts into one.",
        "My profile still shows my old address after I edited it.",
        "Please delete the saved address on my profile.",
    ),
    "cancellation": (
        "Please cancel my {plan} subscription at the end of the month.",
        "I want to cancel order {order} before it ships.",
        "How do I stop my membership from renewing?",
        "Cancel my subscription, I no longer need the service.",
        "I signed up for the trial by mistake, please cancel it.",
        "Stop the automatic renewal of my {plan} plan.",
        "I would like to end my contract with you.",
        "Please cancel the {product} I ordered yesterday.",
        "I am moving abroad and need to cancel my service.",
        "Do not renew my annual plan, I want to quit.",
        "Please terminate my {plan} membership today.",
        "I want out of my subscription as soon as possible.",
    ),
    "sales": (
        "Do you offer a discount for {seats} seats on the {plan} plan?",
        "Can someone give us a demo of the {plan} plan?",
        "We want to buy {seats} {product} units for our office, what is the price?",
        "Is there an education discount for schools?",
        "What is the difference between the basic and the {plan} plan?",
        "I would like a quote for {seats} licenses.",
        "Do you have a reseller program?",
        "Can I upgrade to the {plan} plan and what would it cost?",
        "Are there volume prices for the {product}?",
        "Our company wants to become a customer, who should I talk to?",
        "Is the {product} available in bulk for businesses?",
        "Do you offer a free trial of the {plan} plan for teams?",
    ),
}

_GREETINGS = (
    "",
    "Hi,",
    "Hello,",
    "Hello there.",
    "Good morning,",
    "Hey team,",
    "Dear support,",
    "Hi there!",
)
_DETAILS = (
    "",
    "",
    "This is the second time I write about it.",
    "I have been a customer for years.",
    "Please help quickly.",
    "I already tried twice.",
    "It is quite urgent for me.",
    "Thanks for looking into it.",
)
_SIGNOFFS = ("", "", "Thanks.", "Thank you!", "Regards, {name}", "Best, {name}", "Cheers")
_SLOTS: dict[str, tuple[str, ...]] = {
    "order": ("A-10432", "#58213", "77120", "B-2291", "#90017", "C-4410"),
    "amount": ("$19.99", "$49", "$120", "€35", "$8.50", "$299", "£60"),
    "month": ("January", "March", "May", "July", "September", "November"),
    "day": ("2nd", "5th", "12th", "18th", "28th"),
    "plan": ("Pro", "Premium", "Business", "Family", "Team", "Enterprise"),
    "product": ("router", "smart speaker", "headphones", "camera", "thermostat", "tablet"),
    "days": ("three", "five", "seven", "ten", "12", "14"),
    "feature": ("settings", "calendar", "photos", "billing", "dashboard", "search"),
    "code": ("E42", "0x80070005", "503", "ERR_SYNC_7", "E-1009"),
    "phone": ("555-0142", "555-0199", "555-0117"),
    "seats": ("10", "25", "50", "200"),
    "name": ("Ana", "Bob", "Chen", "Dana", "Eli", "Fatima", "Gus"),
}


@dataclass(frozen=True)
class Ticket:
    """One customer message, the label the generator wrote it for and the core template
    it was written from."""

    text: str
    label: str
    template: str = ""


def _reserved(index: int) -> bool:
    """Every fourth core template of a label is reserved for the held-out set."""
    return index % 4 == 3


def _fill(template: str, rng: random.Random) -> str:
    values = {name: rng.choice(options) for name, options in _SLOTS.items()}
    return template.format(**values)


def _compose(core: str, rng: random.Random) -> str:
    greeting, sentence = rng.choice(_GREETINGS), _fill(core, rng)
    if greeting.endswith(",") and not sentence.startswith("I "):
        sentence = sentence[0].lower() + sentence[1:]
    parts = [greeting, sentence, rng.choice(_DETAILS), _fill(rng.choice(_SIGNOFFS), rng)]
    return " ".join(part for part in parts if part)


class TicketGenerator:
    """Draws distinct tickets, labels balanced. ``held_out=True`` draws only from the
    reserved core templates, ``False`` only from the others; a text already drawn by
    this generator (either side) is never drawn again, so sets stay disjoint."""

    def __init__(self, seed: int) -> None:
        self._rng = random.Random(seed)  # noqa: S311 (seeded or non-secret randomness)
        self._seen: set[str] = set()

    def draw(self, count: int, held_out: bool) -> list[Ticket]:
        """``count`` new tickets; raises ``QuickstartError`` when the templates run dry."""
        tickets: list[Ticket] = []
        for position in range(count):
            label = LABELS[position % len(LABELS)]
            cores = [c for i, c in enumerate(_CORES[label]) if _reserved(i) == held_out]
            for _ in range(200):
                core = self._rng.choice(cores)
                text = _compose(core, self._rng)
                if text not in self._seen:
                    break
            else:
                raise QuickstartError(f"no new {label!r} ticket after 200 draws; ask for fewer")
            self._seen.add(text)
            tickets.append(Ticket(text, label, core))
        self._rng.shuffle(tickets)
        return tickets


def is_correct(answer: str, label: str) -> bool:
    """The grader's rule: the answer, normalized like ``normalized_exact``, is the label."""
    return normalize_text(answer) == label
