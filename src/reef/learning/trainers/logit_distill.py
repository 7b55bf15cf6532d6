"""Logit distillation: the term the SFT loss adds when the teacher's answer came with its
top-k logprobs (``SFTSpec.logit_weight``; docs/distillation.md#logit-distillation).
Imports torch: only the training child or a test imports it.

Alignment (:func:`align_teacher_tokens`): the teacher's tokens are strings, the
student's are ids of its own vocabulary. A teacher position trains when its token is
exactly one student token of the answer as the student tokenizes it: the same text at
the same character offset of the answer, and the teacher's token text encodes to that
one student id. Its top-k alternatives are mapped the same way (text that is not one
student token is left out of the distribution); any other position is skipped and
counted. The chosen token is always among the candidates.

The term (:func:`teacher_kl`): at each aligned position, KL(p || q), where p is the
teacher's top-k distribution renormalised over the mapped candidates and q the
student's distribution restricted to the same tokens and renormalised, both at a
temperature; averaged over the aligned positions, each weighted by its example's
weight (as the cross entropy weighs tokens).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from transformers import PreTrainedTokenizerBase

from reef.learning.trainers.masking import IGNORE_INDEX
from reef.learning.trainers.spec import TeacherToken

# The logit of a padding candidate: far below any real one, yet finite, so that a
# padded row's products stay 0 rather than NaN.
_PAD_LOGIT = -1e9


@dataclass(frozen=True)
class TeacherTarget:
    """The teacher's distribution at one position of a tokenized example: ``position``
    indexes the token it is for (its label trains), ``ids`` the student ids of the
    teacher's candidates and ``logprobs`` the teacher's logprobs of them."""

    position: int
    ids: tuple[int, ...]
    logprobs: tuple[float, ...]


@dataclass(frozen=True)
class Alignment:
    """What :func:`align_teacher_tokens` made of one answer: its targets, and how many
    teacher positions aligned and were skipped."""

    targets: tuple[TeacherTarget, ...]
    aligned: int
    skipped: int


def align_teacher_tokens(
    tokenizer: PreTrainedTokenizerBase,
    input_ids: Sequence[int],
    labels: Sequence[int],
    teacher: Sequence[TeacherToken],
) -> Alignment:
    """The teacher's positions of an answer (``teacher``, in order) aligned with the
    student's tokens of it: the labelled tokens of ``input_ids`` (``labels`` not
    ``IGNORE_INDEX``), the answer's tokens then its end of turn (module docstring)."""
    positions = [p for p in range(1, len(input_ids)) if labels[p] != IGNORE_INDEX]
    spans = _student_spans(tokenizer, [input_ids[p] for p in positions])
    by_span = {span: (p, text) for p, (span, text) in zip(positions, spans, strict=True) if text}
    single: dict[str, int | None] = {}

    def student_id(text: str) -> int | None:
        if text not in single:
            ids = tokenizer.encode(text, add_special_tokens=False)
            ok = len(ids) == 1 and str(tokenizer.decode(ids)) == text
            single[text] = int(ids[0]) if ok else None
        return single[text]

    targets: list[TeacherTarget] = []
    offset = 0
    for token in teacher:
        span = (offset, offset + len(token.token))
        offset = span[1]
        found = by_span.get(span)
        if not token.token or found is None or found[1] != token.token:
            continue
        position = found[0]
        chosen = student_id(token.token)
        if chosen is None or chosen != input_ids[position]:
            continue
        candidates: dict[int, float] = {}
        for text, logprob in token.top:
            mapped = student_id(text)
            if mapped is not None and mapped not in candidates:
                candidates[mapped] = logprob
        candidates.setdefault(chosen, token.logprob)
        targets.append(TeacherTarget(position, tuple(candidates), tuple(candidates.values())))
    return Alignment(tuple(targets), len(targets), len(teacher) - len(targets))


def _student_spans(
    tokenizer: PreTrainedTokenizerBase, ids: Sequence[int]
) -> list[tuple[tuple[int, int], str]]:
    """Each of ``ids``' character span in their decoded text and its text there
    (empty where a token does not decode on its own: part of a character)."""
    out: list[tuple[tuple[int, int], str]] = []
    before = ""
    for end in range(1, len(ids) + 1):
        text = str(tokenizer.decode(list(ids[:end])))
        piece = text[len(before) :] if text.startswith(before) else ""
        out.append(((len(before), len(text)), "" if "\ufffd" in piece else piece))
        before = text
    return out


def teacher_batch(
    rows: Sequence[tuple[Sequence[int], Sequence[TeacherTarget], float]],
    device: torch.device,
) -> dict[str, torch.Tensor] | None:
    """The teacher targets of a batch's rows (each: its labels, its targets, its
    example's weight) as tensors: ``index`` of each target among the batch's labelled
    positions in the order the loss flattens them (row by row; a label at position
    ``p`` is the prediction at ``p - 1``), ``ids`` and ``logprobs`` padded to the most
    candidates, ``mask`` where a candidate is real, and the row's ``weights``. None
    when no row has a target."""
    index: list[int] = []
    ids: list[list[int]] = []
    logprobs: list[list[float]] = []
    weights: list[float] = []
    before = 0
    for labels, targets, weight in rows:
        rank = {
            p: i
            for i, p in enumerate(q for q in range(1, len(labels)) if labels[q] != IGNORE_INDEX)
        }
        for target in targets:
            index.append(before + rank[target.position])
            ids.append(list(target.ids))
            logprobs.append(list(target.logprobs))
            weights.append(weight)
        before += len(rank)
    if not index:
        return None
    width = max(len(row) for row in ids)
    mask = [[True] * len(row) + [False] * (width - len(row)) for row in ids]
    return {
        "index": torch.tensor(index, device=device),
        "ids": torch.tensor([row + [0] * (width - len(row)) for row in ids], device=device),
        "logprobs": torch.tensor(
            [row + [_PAD_LOGIT] * (width - len(row)) for row in logprobs], device=device
        ),
        "mask": torch.tensor(mask, device=device),
        "weights": torch.tensor(weights, device=device),
    }


def teacher_kl(
    logits: torch.Tensor, teacher: dict[str, torch.Tensor], temperature: float
) -> torch.Tensor:
    """The weighted mean KL(teacher || student) over the aligned positions (module
    docstring). ``logits``: the student's logits at the batch's labelled positions,
    flattened row by row ([labelled, vocabulary]); ``teacher``: :func:`teacher_batch`."""
    mask = teacher["mask"]
    student = logits[teacher["index"]].float().gather(1, teacher["ids"]) / temperature
    student = student.masked_fill(~mask, _PAD_LOGIT)
    log_q = torch.log_softmax(student, dim=-1)
    log_p = torch.log_softmax(teacher["logprobs"].float() / temperature, dim=-1)
    terms = torch.where(mask, log_p.exp() * (log_p - log_q), torch.zeros_like(log_q))
    weights = teacher["weights"].float()
    kl: torch.Tensor = (terms.sum(dim=-1) * weights).sum() / weights.sum().clamp(min=1e-8)
    return kl
