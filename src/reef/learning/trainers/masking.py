"""What trains: the one masking rule every trainer uses (sft, full, preference, grpo,
episodes), whatever dialect a conversation came in.

A token trains when the model produced it: assistant content, the tool calls it made
(as the chat template renders them), and the token that ends its turn (the
template's end of an assistant turn, e.g. ``<|im_end|>``, ``<|eot_id|>``). Role
headers, template scaffolding (a generation prompt, a default system message, the
newline after an end token), tool results and user or system text never train.

Two forms meet the rule:

- A conversation to re-render (sft, preference): :func:`mask_conversation` renders it
  as the engine serves it (``reef.core.chat_format.render_tools``, then the tokenizer's
  chat template) and finds each assistant turn by character offsets. The template is
  rendered up to the turn with ``add_generation_prompt`` (where the turn starts) and
  with the turn (where it ends); both must be prefixes of the whole rendering, or the
  template is refused (:class:`TemplateMaskError`). Inside a turn's span, tokens after
  its last special token (the end-of-turn token) are scaffolding and do not train.
- Tokens as sampled (grpo, episodes): :func:`sampled_turn`. The prompt ids are the
  sampler's rendering (scaffolding, generation prompt) and never train; the sampled ids
  are what the model produced, its end-of-turn token included, and all train.

Which assistant turns train is the caller's (``turns``): every trainer today trains the
last (the reply; earlier turns are context). Checked per template and dialect by
``tests/learning/test_masking.py``.

Torch-free: it needs only a tokenizer.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from reef.core.chat_format import render_tools, template_takes_tools
from reef.core.errors import InvalidInputError

IGNORE_INDEX = -100
"""The label of a token that does not train (PyTorch's cross-entropy ignore index)."""

TrainTurns = Literal["all", "last"]


class TemplateMaskError(InvalidInputError):
    """A chat template whose rendering of an assistant turn cannot be located: a shorter
    conversation does not render as a prefix of the longer one."""


@dataclass(frozen=True)
class MaskedTokens:
    """Token ids and, per token, whether it trains."""

    input_ids: list[int]
    train: list[bool]

    @property
    def labels(self) -> list[int]:
        """The ids, with ``IGNORE_INDEX`` where a token does not train."""
        return [
            t if keep else IGNORE_INDEX for t, keep in zip(self.input_ids, self.train, strict=True)
        ]

    @property
    def prompt_length(self) -> int:
        """How many leading tokens do not train (all of them when none does)."""
        return next((i for i, keep in enumerate(self.train) if keep), len(self.train))


def sampled_turn(prompt_ids: Sequence[int], completion_ids: Sequence[int]) -> MaskedTokens:
    """An assistant turn as sampled: ``prompt_ids`` (never train) then
    ``completion_ids`` (all train: what the model produced, its end token included)."""
    ids = [*prompt_ids, *completion_ids]
    return MaskedTokens(ids, [False] * len(prompt_ids) + [True] * len(completion_ids))


@dataclass(frozen=True)
class TemplateChat:
    """A conversation as the chat template takes it: ``messages`` and the keyword
    arguments (``tools``) to pass with them."""

    messages: list[dict[str, Any]]
    extra: dict[str, Any]


def template_chat(
    tokenizer: Any, messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]]
) -> TemplateChat:
    """``messages`` with ``tools`` rendered as the engine renders a request
    (``reef.core.chat_format.render_tools``) when tools are offered or the conversation
    holds calls or results; else as they are."""
    uses_tools = bool(tools) or any(
        m.get("tool_calls") or m.get("role") == "tool" for m in messages
    )
    if not uses_tools:
        return TemplateChat([dict(m) for m in messages], {})
    template = tokenizer.chat_template
    takes = template_takes_tools(template if isinstance(template, str) else None)
    rendered = render_tools(messages, tools, template_takes_tools=takes)
    extra: dict[str, Any] = {"tools": rendered.template_tools} if rendered.template_tools else {}
    return TemplateChat(rendered.messages, extra)


def render_text(tokenizer: Any, chat: TemplateChat, count: int, generation: bool = False) -> str:
    """The template's text of the first ``count`` messages of ``chat``."""
    text = tokenizer.apply_chat_template(
        chat.messages[:count], tokenize=False, add_generation_prompt=generation, **chat.extra
    )
    if not isinstance(text, str):
        raise TemplateMaskError("the chat template rendered no text")
    return text


def assistant_spans(
    tokenizer: Any, chat: TemplateChat, turns: TrainTurns
) -> tuple[str, list[tuple[int, int]]]:
    """The whole conversation's text and the character span of each assistant turn
    that trains (``turns``): from the end of the generation prompt to the end of the
    turn's rendering. Raises ``TemplateMaskError`` when a prefix does not render as
    the start of the whole."""
    whole = render_text(tokenizer, chat, len(chat.messages))
    chosen = [i for i, m in enumerate(chat.messages) if m.get("role") == "assistant"]
    if turns == "last":
        chosen = chosen[-1:]
    spans: list[tuple[int, int]] = []
    for index in chosen:
        start = render_text(tokenizer, chat, index, generation=True)
        end = render_text(tokenizer, chat, index + 1)
        if not (end.startswith(start) and whole.startswith(end)):
            raise TemplateMaskError(
                f"the chat template does not render message {index} (an assistant turn) "
                "as an extension of the conversation before it, so its tokens cannot be "
                "told from the template's"
            )
        spans.append((len(start), len(end)))
    return whole, spans


def mask_conversation(
    tokenizer: Any,
    messages: Sequence[Mapping[str, Any]],
    tools: Sequence[Mapping[str, Any]] = (),
    turns: TrainTurns = "all",
) -> MaskedTokens:
    """``messages`` (OpenAI chat form, as ``reef.learning.learners`` hands them to the
    trainers) and ``tools`` tokenized as the engine serves them, with the module's rule
    for which tokens train; ``turns`` says which assistant turns do. Tokens after the
    last trained one (the template's closing scaffolding) are left out: a served reply
    ends at its end token. The ids are exactly the template's
    (``apply_chat_template(tokenize=True)``). Raises ``TemplateMaskError`` for a
    template whose turns cannot be located, ``TypeError`` for a tokenizer without
    offsets (not a fast tokenizer)."""
    chat = template_chat(tokenizer, messages, tools)
    whole, spans = assistant_spans(tokenizer, chat, turns)
    if not getattr(tokenizer, "is_fast", False):
        raise TypeError("masking needs a fast tokenizer (character offsets of its tokens)")
    encoded = tokenizer(whole, add_special_tokens=False, return_offsets_mapping=True)
    ids = [int(t) for t in encoded["input_ids"]]
    starts = [int(start) for start, _ in encoded["offset_mapping"]]
    train = [False] * len(ids)
    special = set(tokenizer.all_special_ids) | _special_added_ids(tokenizer)
    for begin, end in spans:
        inside = [i for i, s in enumerate(starts) if begin <= s < end]
        for i in _through_end_token(inside, ids, special):
            train[i] = True
    last = max((i for i, keep in enumerate(train) if keep), default=len(ids) - 1)
    return MaskedTokens(ids[: last + 1], train[: last + 1])


def _special_added_ids(tokenizer: Any) -> set[int]:
    decoder = getattr(tokenizer, "added_tokens_decoder", {}) or {}
    return {int(i) for i, token in decoder.items() if getattr(token, "special", False)}


def _through_end_token(inside: list[int], ids: list[int], special: set[int]) -> list[int]:
    """The positions of a turn that train: up to and including its last special token
    (the end of the turn); all of them when the template ends a turn with none."""
    ends = [n for n, i in enumerate(inside) if ids[i] in special]
    return inside[: ends[-1] + 1] if ends else inside
