"""Which failed learning jobs are worth another attempt (``retry_verdict``).

A job is retried only when its cause can pass: an upstream that was down, slow or
rate-limited, a store that was unavailable, an evaluation whose failed calls were all
of those kinds. A failure that the same input meets again (a 4xx from the gateway or
the upstream, a validation error, a bad recipe, an evaluation with refused items) fails
the job at once: another attempt would spend minutes to fail the same way. An error of
no known kind is retried once: if the next attempt fails with the same message, it is
not retried again.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import pydantic

from reef.core.errors import InvalidInputError, ReefError
from reef.evaluation import TRANSIENT_ERROR_KINDS, EvalRunError, EvaluationFailedError
from reef.experience import StoreUnavailableError
from reef.upstream import (
    UpstreamError,
    UpstreamOversizedError,
    UpstreamRejectedError,
    UpstreamUnsupportedError,
)

UNKNOWN_REASON = "an error of no known kind may pass once"


@dataclass(frozen=True)
class RetryVerdict:
    """Whether to retry a failed attempt, and ``reason``: why, in words for the log."""

    retry: bool
    reason: str


def failure_message(error: BaseException) -> str:
    """What a job stores as its error: a ``ReefError``'s message, else the repr."""
    return error.message if isinstance(error, ReefError) else repr(error)


def retry_verdict(error: BaseException, last_error: str | None) -> RetryVerdict:
    """Whether a job attempt that raised ``error`` should be retried (see the module
    docstring). ``last_error`` is the error the job's previous attempt stored (None on a
    first attempt): an unknown error with the same message is not retried again. The
    cause chain (``raise … from``) is read too, so a learner's error wrapping an upstream
    timeout counts as a timeout."""
    for cause in _causes(error):
        verdict = _known(cause)
        if verdict is not None:
            return verdict
    if last_error is not None and failure_message(error) == last_error:
        return RetryVerdict(False, "it failed the same way on the previous attempt")
    return RetryVerdict(True, UNKNOWN_REASON)


def _known(error: BaseException) -> RetryVerdict | None:
    """The verdict on an error of a known kind; None for any other."""
    if isinstance(error, EvaluationFailedError):
        if error.transient:
            return RetryVerdict(True, "every failed eval call was transient")
        lasting = sorted(kind for kind in error.kinds if kind not in TRANSIENT_ERROR_KINDS)
        return RetryVerdict(False, f"{' and '.join(lasting) or 'failed'} eval calls will recur")
    return _recurring(error) or _passing(error)


def _recurring(error: BaseException) -> RetryVerdict | None:
    """Errors the same input meets again."""
    if isinstance(error, EvalRunError):
        return RetryVerdict(False, f"a {error.status} from the gateway will recur")
    if isinstance(error, UpstreamRejectedError):
        status = error.upstream_status or error.status
        return RetryVerdict(False, f"a {status} from the upstream will recur")
    if isinstance(error, InvalidInputError | pydantic.ValidationError):
        return RetryVerdict(False, "a validation error will recur")
    if isinstance(error, UpstreamUnsupportedError):
        return RetryVerdict(False, "the upstream does not serve this (501) and will not")
    if isinstance(error, UpstreamOversizedError):
        return RetryVerdict(False, "an answer past the gateway's size limit will recur")
    return None


def _passing(error: BaseException) -> RetryVerdict | None:
    """Outages: errors a later attempt may not meet."""
    if isinstance(error, StoreUnavailableError):
        return RetryVerdict(True, "the store was unavailable")
    if isinstance(error, UpstreamError) and error.status >= 500:
        # 502/503/504: down, busy, slow, or an answer cut short or garbled in transit.
        return RetryVerdict(True, f"the upstream failed ({error.reason})")
    if isinstance(error, TimeoutError | ConnectionError):
        return RetryVerdict(True, f"a {type(error).__name__} may pass")
    return None


def _causes(error: BaseException) -> Iterator[BaseException]:
    """``error``, then what it was raised from, outermost first (cycles cut)."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__
