"""Which job failures are retried: those whose cause can pass, and an unknown one once."""

from __future__ import annotations

import pydantic
import pytest

from reef.core.errors import InvalidInputError, ReefError
from reef.evaluation import EvalRunError, EvaluationFailedError
from reef.experience import StoreUnavailableError
from reef.learning.recipes import RecipeError
from reef.learning.reflect import ReflectError
from reef.learning.retries import failure_message, retry_verdict
from reef.upstream import (
    UpstreamBusyError,
    UpstreamError,
    UpstreamOversizedError,
    UpstreamRejectedError,
    UpstreamTimeoutError,
    UpstreamUnavailableError,
    UpstreamUnsupportedError,
)


def _wrapped(cause: Exception) -> ReflectError:
    try:
        raise ReflectError("reflector at up: failed") from cause
    except ReflectError as error:
        return error


def _validation_error() -> pydantic.ValidationError:
    class Model(pydantic.BaseModel):
        n: int

    with pytest.raises(pydantic.ValidationError) as caught:
        Model.model_validate({"n": "many"})
    return caught.value


@pytest.mark.parametrize(
    "error",
    [
        StoreUnavailableError("database is locked"),
        UpstreamTimeoutError("read timed out"),
        UpstreamUnavailableError("connection refused"),
        UpstreamBusyError("every connection busy"),
        UpstreamError("cut short", status=502),
        TimeoutError("slow"),
        ConnectionResetError("reset"),
        _wrapped(UpstreamTimeoutError("read timed out")),
        EvaluationFailedError("3 of 4 candidate calls failed", transient=True),
    ],
    ids=lambda e: type(e).__name__,
)
def test_failures_that_can_pass_are_retried_even_when_they_repeat(error: Exception) -> None:
    verdict = retry_verdict(error, last_error=failure_message(error))
    assert verdict.retry, verdict.reason


@pytest.mark.parametrize(
    ("error", "reason"),
    [
        (
            EvalRunError("refused the candidate arm", arm="candidate", release_id="c", status=404),
            "a 404 from the gateway will recur",
        ),
        (
            EvaluationFailedError(
                "20 of 72 candidate calls failed",
                transient=False,
                kinds={"refused": 19, "timeout": 1},
            ),
            "refused eval calls will recur",
        ),
        (
            UpstreamRejectedError("context too long", status=400, upstream_status=400),
            "a 400 from the upstream will recur",
        ),
        (_wrapped(UpstreamRejectedError("bad", 400, 400)), "a 400 from the upstream will recur"),
        (UpstreamUnsupportedError("no /v1/responses"), "(501)"),
        (UpstreamOversizedError("past max_response_bytes"), "size limit"),
        (InvalidInputError("messages.2: bad"), "a validation error will recur"),
        (RecipeError("unknown learner 'sftt'"), "a validation error will recur"),
        (_validation_error(), "a validation error will recur"),
    ],
    ids=lambda value: type(value).__name__,
)
def test_failures_that_will_recur_fail_at_once(error: Exception, reason: str) -> None:
    verdict = retry_verdict(error, last_error=None)  # even on a first attempt
    assert not verdict.retry
    assert reason in verdict.reason


def test_an_unknown_failure_is_retried_until_it_repeats_itself() -> None:
    first = retry_verdict(ReefError("learner crashed"), last_error=None)
    assert first.retry
    other = retry_verdict(ReefError("learner crashed"), last_error="disk full")
    assert other.retry
    again = retry_verdict(ReefError("learner crashed"), last_error="learner crashed")
    assert not again.retry
    assert again.reason == "it failed the same way on the previous attempt"
    crash = ValueError("bad value")
    assert not retry_verdict(crash, last_error=failure_message(crash)).retry
    assert failure_message(crash) == "ValueError('bad value')"
