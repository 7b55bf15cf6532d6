"""Logit distillation in the SFT trainer (``reef.learning.trainers.logit_distill``): the
teacher's token strings aligned with tiny-random's byte-level tokenizer, the KL term
against hand-computed values, and the term as ``labelled_loss`` adds it on a real batch."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from reef.engine.models import LoadedModel, load_model
from reef.learning.trainers import lora_sft
from reef.learning.trainers.logit_distill import (
    TeacherTarget,
    align_teacher_tokens,
    teacher_batch,
    teacher_kl,
)
from reef.learning.trainers.lora_sft import (
    LogitTerm,
    build_features,
    collate,
    labelled_loss,
)
from reef.learning.trainers.spec import SFTExample, TeacherToken, teacher_tokens

TINY = "tiny-random"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> LoadedModel:
    return load_model(TINY, tmp_path_factory.mktemp("home"))


def one_id(loaded: LoadedModel, text: str) -> int:
    ids = loaded.tokenizer.encode(text, add_special_tokens=False)
    assert len(ids) == 1
    return int(ids[0])


def example(target: str, tokens: list[TeacherToken], prompt: str = "Greet me.") -> SFTExample:
    return SFTExample(
        messages=[{"role": "user", "content": prompt}], target=target, teacher_tokens=tokens
    )


def test_teacher_tokens_align_one_to_one_and_the_rest_are_skipped(tiny: LoadedModel) -> None:
    # tiny-random's tokenizer has one token per byte: "H", "i" and "!" are each one of
    # its tokens, " yo" is three (skipped), and "x" is not what the answer says there.
    tokens = [
        TeacherToken(token="H", logprob=-0.1, top=[("H", -0.1), ("J", -2.5), ("Hello", -3.0)]),
        TeacherToken(token="i", logprob=-0.7, top=[("a", -0.6)]),  # chosen not in its top
        TeacherToken(token=" yo", logprob=-0.2, top=[(" yo", -0.2)]),
        TeacherToken(token="x", logprob=-0.3, top=[("x", -0.3)]),
        TeacherToken(token="!", logprob=-0.05, top=[("!", -0.05), ("!", -4.0), ("?", -3.0)]),
    ]
    features = build_features(tiny.tokenizer, example("Hi yo!!", tokens), 512, align=True)
    ids, labels = features.input_ids, features.labels
    found = align_teacher_tokens(tiny.tokenizer, ids, labels, tokens)
    assert (found.aligned, found.skipped) == (3, 2)
    assert features.teacher == found.targets and features.teacher_skipped == 2
    h, i, bang = found.targets
    reply = [p for p, label in enumerate(labels) if label != -100]
    # Each is for the student's token of the same text and offset: the 1st, 2nd, 7th.
    assert [h.position, i.position, bang.position] == [reply[0], reply[1], reply[6]]
    assert ids[h.position] == one_id(tiny, "H")
    # "Hello" is no single student token: left out of the distribution.
    assert h.ids == (one_id(tiny, "H"), one_id(tiny, "J")) and h.logprobs == (-0.1, -2.5)
    # The chosen token joins its alternatives with its own logprob.
    assert i.ids == (one_id(tiny, "a"), one_id(tiny, "i")) and i.logprobs == (-0.6, -0.7)
    # A repeated alternative counts once (the first, most likely).
    assert bang.ids == (one_id(tiny, "!"), one_id(tiny, "?")) and bang.logprobs == (-0.05, -3.0)
    # Off: no alignment, whatever the example carries.
    assert build_features(tiny.tokenizer, example("Hi yo!!", tokens), 512).teacher == ()


def test_an_upstreams_logprobs_become_teacher_tokens() -> None:
    content = [
        {"token": "A", "logprob": -0.5, "bytes": [65], "top_logprobs": [
            {"token": "A", "logprob": -0.5}, {"token": "B", "logprob": -1.0},
            {"token": "C", "logprob": float("-inf")},
        ]},
        {"token": "b", "logprob": None},  # cannot be placed: it ends the tokens
        {"token": "c", "logprob": -0.1, "top_logprobs": []},
    ]  # fmt: skip
    assert teacher_tokens(content) == [
        TeacherToken(token="A", logprob=-0.5, top=[("A", -0.5), ("B", -1.0)])
    ]


def hand_kl(student: list[float], teacher: list[float], temperature: float) -> float:
    """KL(p || q) with p, q the softmax of ``teacher`` and ``student`` at ``temperature``."""

    def softmax(values: list[float]) -> list[float]:
        exps = [math.exp(v / temperature) for v in values]
        return [e / sum(exps) for e in exps]

    p, q = softmax(teacher), softmax(student)
    return sum(pi * math.log(pi / qi) for pi, qi in zip(p, q, strict=True))


def test_the_kl_term_is_the_hand_computed_value() -> None:
    torch.manual_seed(0)
    logits = torch.randn(5, 12)  # five labelled positions of a batch, 12-token vocabulary
    labels_a = [-100, -100, 7, 8, -100]  # row a: positions 2 and 3 train
    labels_b = [-100, 1, 2, 3]  # row b: positions 1, 2 and 3 train
    targets_a = [TeacherTarget(3, (4, 9, 1), (-0.2, -1.9, -3.1))]
    targets_b = [TeacherTarget(1, (5, 6), (-0.1, -2.4)), TeacherTarget(3, (0, 11, 2), (-1, -1, -2))]
    rows = [(labels_a, targets_a, 1.0), (labels_b, targets_b, 2.0)]
    batch = teacher_batch(rows, torch.device("cpu"))
    assert batch is not None
    # Flat order: a@2, a@3, b@1, b@2, b@3 -> the targets are at 1, 2 and 4.
    assert batch["index"].tolist() == [1, 2, 4]
    for temperature in (1.0, 2.0):
        got = float(teacher_kl(logits, batch, temperature))
        kls = [
            hand_kl([float(logits[row, i]) for i in t.ids], list(t.logprobs), temperature)
            for row, t in zip([1, 2, 4], [*targets_a, *targets_b], strict=True)
        ]
        expected = (kls[0] * 1.0 + (kls[1] + kls[2]) * 2.0) / (1.0 + 2.0 + 2.0)
        assert got == pytest.approx(expected, rel=1e-5)
        assert got > 0


def test_the_kl_term_is_zero_when_the_student_agrees_with_the_teacher() -> None:
    torch.manual_seed(1)
    logits = torch.randn(3, 12)
    target = TeacherTarget(3, (3, 7, 10), (-0.3, -1.6, -2.2))  # the 2nd labelled position
    # The student's logits of the candidates: the teacher's logprobs plus a constant
    # (the rest of its vocabulary does not matter: it is renormalised over the three).
    logits[1, [3, 7, 10]] = torch.tensor([-0.3, -1.6, -2.2]) + 5.0
    batch = teacher_batch([([-100, -100, 4, 5], [target], 1.0)], torch.device("cpu"))
    assert batch is not None and batch["index"].tolist() == [1]
    assert float(teacher_kl(logits, batch, 1.0)) == pytest.approx(0.0, abs=1e-6)


@pytest.mark.parametrize("head", ["labelled positions only", "whole sequence"])
def test_labelled_loss_adds_the_weighted_kl_at_the_aligned_positions(
    tiny: LoadedModel, head: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    if head == "whole sequence":  # the path of architectures whose head is not plain
        monkeypatch.setattr(lora_sft, "PLAIN_HEAD_TYPES", frozenset())
    tokenizer = tiny.tokenizer
    torch.manual_seed(0)
    chars = [TeacherToken(token=c, logprob=-0.2, top=[(c, -0.2), ("z", -1.7)]) for c in "Okay"]
    prompt = "Greet me in as few words as you can, please."  # long enough to be shared
    examples = [example("Okay", chars, prompt), example("Hm", [], prompt)]  # 2nd: no teacher
    features = [build_features(tokenizer, e, 512, align=True) for e in examples]
    batch = collate(features, 0, torch.device("cpu"))
    assert batch["shared"] > 0  # the rows' prompt runs once (``decoder_states``)
    model = tiny.model.eval()
    term = LogitTerm(weight=0.5, temperature=1.0, curve=[])
    with torch.no_grad():
        plain = float(labelled_loss(model, batch))
        with_term = float(labelled_loss(model, batch, term))
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    # By hand from the full logits: the prediction of position p is at p - 1 of row 0.
    kls = [
        hand_kl([float(logits[0, t.position - 1, i]) for i in t.ids], list(t.logprobs), 1.0)
        for t in features[0].teacher
    ]
    assert len(kls) == 4
    assert term.curve == [pytest.approx(sum(kls) / 4, abs=1e-5)]
    assert with_term - plain == pytest.approx(0.5 * sum(kls) / 4, abs=1e-5)


def test_a_spec_round_trips_its_teacher_tokens(tmp_path: Path) -> None:
    from reef.learning.trainers import SFTSpec

    tokens = [TeacherToken(token="O", logprob=-0.1, top=[("O", -0.1)])]
    spec = SFTSpec(
        model=TINY,
        home=tmp_path,
        examples=[example("O", tokens)],
        output_dir=tmp_path / "out",
        logit_weight=0.5,
    )
    assert SFTSpec.model_validate_json(spec.model_dump_json()) == spec
