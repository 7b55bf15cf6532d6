"""The shadow arm: live requests also sent to the scenario's evaluating candidate, after
the live answer went out (``gate.shadow``; ``reef.evaluation.shadow`` scores them).

``ShadowArm.offer`` is called by ``InferenceRoutes.serve`` once a live response has been
sent in full, for a 200 on chat completions or messages that was served live (purpose
``serve``, no pin) and recorded. It never awaits: the client already has its answer and
nothing here can change it (``test_shadow_never_changes_the_live_answer``).

- The scenario's ``evaluating`` candidate and its settings (``evidence["shadow"]``, put
  there by the gate) are read from the chain at most every ``refresh_seconds``, off the
  response path.
- A request is sampled with probability ``fraction`` (drawn from its record id); past
  ``max_requests`` calls for the candidate (counted by this gateway) nothing is sent;
  with ``concurrency`` calls in flight a sampled request is dropped, never queued.
  Each outcome is counted in ``reef_shadow_requests_total{scenario, outcome}``.
- The call is the request as the client sent it, with the candidate's harness and
  weights, as one non-streaming call (a streamed request too) capped at ``max_tokens``.
  Tool calls in its answer are recorded, never run. The record has purpose ``shadow``,
  a session of its own, no continuation hash (no later turn continues it) and tag
  ``reef.shadow_of`` naming the live record.
- Shadow calls are Reef's own spend, never held against a client's budget: each is
  counted by a learning meter (``reef.experience.learning_spend``) as purpose ``shadow``,
  under the scenario's ``learning_budget`` and the budgets of the candidate's recipe that
  the gate put in its evidence (``reef.evaluation.shadow.with_shadow_settings``). With a
  budget counting ``shadow`` (or ``total``) spent in its window, a sampled request is
  not sent (outcome ``budget``); admission reads the ledger and a call adds after its
  answer, so calls in flight (at most ``concurrency``) may overshoot a limit.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from starlette.requests import Request

from reef.core.prices import Price
from reef.evaluation import ShadowConfig, shadow_settings
from reef.experience import LearningBudgetExhaustedError, LearningMeter
from reef.gateway.capture import Exchange
from reef.gateway.serving.activation import Activation
from reef.gateway.serving.release import ServingRelease

log = logging.getLogger("reef.gateway.shadow")

ShadowOutcome = Literal["sent", "failed", "dropped", "capped", "skipped", "budget"]
# The call's usage (any API's shape) and price when an answer came; None when none did.
ShadowCall = Callable[
    [Exchange, Request, ServingRelease, int], Awaitable[tuple[Any, Price | None] | None]
]
MeterFor = Callable[[str, Mapping[str, Any] | None], LearningMeter]
SHADOWED_APIS = frozenset({"openai.chat", "anthropic.messages"})


@dataclass(frozen=True)
class _Target:
    candidate_id: str | None
    config: ShadowConfig | None
    fetched: float
    meter: LearningMeter | None = None


class ShadowArm:
    """Samples live requests for the evaluating candidate of their scenario and sends
    them with ``call`` (``InferenceRoutes.shadow_call``: the answer's usage and price),
    each counted by the meter ``meter_for`` makes for the scenario and the candidate's
    evidence."""

    refresh_seconds = 5.0

    def __init__(
        self,
        activation: Activation,
        call: ShadowCall,
        count: Callable[[str, ShadowOutcome], None],
        meter_for: MeterFor,
    ) -> None:
        self.activation = activation
        self.call = call
        self.count = count
        self.meter_for = meter_for
        self.in_flight = 0
        self.sent: Counter[str] = Counter()
        self._targets: dict[str, _Target] = {}
        self._refreshing: set[str] = set()
        self._tasks: set[asyncio.Task[None]] = set()

    @staticmethod
    def eligible(exchange: Exchange) -> bool:
        """Whether ``exchange`` may be shadowed: live (purpose ``serve``, no pin),
        recorded, on chat completions or messages."""
        return (
            exchange.purpose == "serve"
            and exchange.headers.release is None
            and exchange.capture
            and exchange.responses is None
            and exchange.api in SHADOWED_APIS
        )

    def offer(self, exchange: Exchange, request: Request) -> None:
        """Maybe shadow ``exchange`` (its live answer was sent); never waits."""
        scenario = exchange.scenario
        target = self._targets.get(scenario)
        if target is None or time.monotonic() - target.fetched > self.refresh_seconds:
            if scenario not in self._refreshing:
                self._refreshing.add(scenario)
                self._spawn(self._refresh_then_offer(exchange, request))
            return
        self._sample(target, exchange, request)

    async def close(self) -> None:
        """Cancel the shadow calls in flight (the gateway stops)."""
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def _spawn(self, work: Awaitable[None]) -> None:
        async def run() -> None:
            await work

        task = asyncio.get_running_loop().create_task(run())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _refresh_then_offer(self, exchange: Exchange, request: Request) -> None:
        scenario = exchange.scenario
        try:
            target = await asyncio.to_thread(self._read_target, scenario)
        except Exception:  # the chain unreadable: no shadow now, try again later
            log.warning("shadow: could not read the candidates of %r", scenario, exc_info=True)
            target = _Target(None, None, time.monotonic())
        finally:
            self._refreshing.discard(scenario)
        self._targets[scenario] = target
        self._sample(target, exchange, request)

    def _read_target(self, scenario: str) -> _Target:
        evaluating = self.activation.chain.candidates(scenario, state="evaluating", limit=1)
        now = time.monotonic()
        if not evaluating:
            return _Target(None, None, now)
        candidate = evaluating[0]
        meter = self.meter_for(scenario, candidate.evidence)
        return _Target(candidate.id, shadow_settings(candidate.evidence), now, meter)

    def _sample(self, target: _Target, exchange: Exchange, request: Request) -> None:
        config, candidate_id = target.config, target.candidate_id
        if config is None or candidate_id is None or not _drawn(exchange, config.fraction):
            return
        if self.sent[candidate_id] >= config.max_requests:
            self.count(exchange.scenario, "capped")
            return
        if self.in_flight >= config.concurrency:
            self.count(exchange.scenario, "dropped")
            return
        self.sent[candidate_id] += 1
        self.in_flight += 1
        self._spawn(self._shadow(exchange, request, candidate_id, config, target.meter))

    async def _shadow(
        self,
        exchange: Exchange,
        request: Request,
        candidate_id: str,
        config: ShadowConfig,
        meter: LearningMeter | None,
    ) -> None:
        outcome: ShadowOutcome = "failed"
        budgeted = meter is not None and meter.counts("shadow")
        try:
            if meter is not None and budgeted:
                try:
                    await asyncio.to_thread(meter.admit, "shadow")
                except LearningBudgetExhaustedError as error:
                    self.sent[candidate_id] -= 1  # not sent: max_requests not used up
                    outcome = "budget"
                    log.info("shadow call for %s not sent: %s", candidate_id, error)
                    return
            activation = self.activation
            pinned = await activation.pinned(
                exchange.scenario, candidate_id, exchange.principal, "gate", state_read=True
            )
            serving = pinned.serving
            if not activation.admits(serving):  # in-place weights elsewhere: not now
                outcome = "skipped"
                return
            lease = activation.lease(serving)
            with lease if lease is not None else contextlib.nullcontext():
                answered = await self.call(exchange, request, serving, config.max_tokens)
            outcome = "sent" if answered is not None else "failed"
            if meter is not None and answered is not None:
                usage, price = answered
                if budgeted:  # the ledger is in the store
                    await asyncio.to_thread(meter.charge, "shadow", usage, price)
                else:
                    meter.charge("shadow", usage, price)
        except Exception:  # a shadow call never disturbs serving: logged, counted
            log.warning("shadow call for %s failed", candidate_id, exc_info=True)
        finally:
            self.in_flight -= 1
            self.count(exchange.scenario, outcome)


def _drawn(exchange: Exchange, fraction: float) -> bool:
    """Whether the live record (its id is random) falls in the sampled ``fraction``."""
    draw = hashlib.sha256(exchange.record_id.encode()).digest()
    return int.from_bytes(draw[:8]) / 2**64 < fraction
