"""Following the release chain: stage a new head (artifacts, checkpoint or adapter,
warm-up), then flip.

A release whose model names a checkpoint (full fine-tuned weights) is staged by loading
the checkpoint into the upstream beside the weights serving now, under a name of its
own (``<scenario>@ckpt-<digest12>``); the flip sends new requests to that name; after
it, checkpoints beyond ``activation.max_checkpoints`` that nothing serves or uses are
unloaded, and the upstream frees their weights once their last request is done (the
embedded engine's leases). A checkpoint the upstream has no memory for (507) is loaded
again after unloading the least recently used checkpoint nothing serves or uses, until
it fits or none is left. A release with an adapter on top of a checkpoint loads the
checkpoint, then the adapter on it (``<scenario>@<adapter12>@ckpt-<digest12>``: the same
adapter on other weights is another model); the engine keeps the checkpoint's weights
while an adapter runs on them.

Every adapter or checkpoint loaded is then probed with the fingerprint its trainer
recorded (``reef.gateway.serving.verify``): weights that answer otherwise are unloaded
and fail the staging (the head, a canary, or a pin: the gate's candidate arm). Right
after a head's flip (``_probe_after_flip``) and every
``activation.verify_interval_seconds`` (``verify_tick``) the weights that serve are probed
again and loaded again when the upstream evicted or changed them.

Every request freezes the ``ServingRelease`` of its scenario when it arrives and is served
and recorded by it to the end, whatever flips meanwhile. A head that fails to stage never
serves: the previous release keeps serving and the failure shows in ``/reef/status`` and
``reef_activation_failures_total``.

An upstream that reloads its one set of weights in place (``checkpoint_loading: vllm`` or
``sglang``) is swapped instead of staged beside: ``reef.gateway.serving.inplace`` holds new
requests, drains those in flight, reloads, flips, and lets the held ones go. Only the
serving release's weights can be reached there: a canary must share them, and a pinned
request for other weights is refused.

A pinned release or candidate (``x-reef-release``) is staged on demand, once
``reef.gateway.serving.pins`` says the caller may be served by it: releases on the
scenario's chain for every key, candidates for the gate and admin keys only.

Live canaries are followed the same way, on the same poll: a canary is staged in the
background and only then given its share of live traffic (``canaries``); one that fails
to stage leaves all traffic to the head, shows in ``/reef/status``, and is retried after
``CANARY_RETRY_SECONDS``. No request ever waits for a canary.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from reef.config import ConfigError, ReefSettings
from reef.core import dumps
from reef.core.checkpoints import check_checkpoint_directory
from reef.core.errors import ConflictError, NotFoundError, ReefError
from reef.gateway.auth import Principal
from reef.gateway.serving.adapter_cache import AdapterCacheTelemetry
from reef.gateway.serving.canary_arm import CanaryRoute, CanaryStatus
from reef.gateway.serving.drift import (
    CLIENT_CHOSEN_MODEL,
    configured_model,
    initial_routing,
    warn_on_drift,
)
from reef.gateway.serving.inplace import (
    BASE,
    InPlaceLease,
    InPlaceWeights,
    WeightsNotResidentError,
)
from reef.gateway.serving.pins import PinAccess, PinTarget, check_pin, gate_key_id
from reef.gateway.serving.release import ServingRelease
from reef.gateway.serving.verify import (
    Verifications,
    WeightsMismatchError,
    base_check,
    base_gap_warning,
    load_fingerprint,
    mismatch_error,
    probe,
)
from reef.harness import Harness, load_bundle, pack_bundle, read_bundle_archive
from reef.harness import bundle_digest as compute_bundle_digest
from reef.releases import (
    ArtifactStore,
    Candidate,
    ModelComponent,
    Release,
    ReleaseChain,
    ReleaseManifest,
)
from reef.upstream import (
    AdapterAlreadyLoadedError,
    Upstream,
    UpstreamError,
    UpstreamRequest,
)

log = logging.getLogger("reef.gateway.serving.activation")

_PINNED_CACHE = 32
# How long a canary that failed to stage leaves all its scenario's traffic to the head.
CANARY_RETRY_SECONDS = 30.0


@dataclass(frozen=True)
class PinnedServing:
    """A pinned request's release or candidate, and whether it serves only as ``eval``
    (an admin's pin of a candidate that neither the gate nor a canary is deciding)."""

    serving: ServingRelease
    eval_only: bool = False


@dataclass
class ScenarioStatus:
    """Activation state of one scenario, as ``/reef/status`` shows it."""

    head_release_id: str | None = None
    serving_release_id: str | None = None
    state: str = "serving"  # serving | staging | failed
    error: str | None = None
    activated_at: float | None = None
    failures: int = 0
    canary: CanaryStatus | None = None
    verification: dict[str, Any] | None = None  # of the weights that serve (verify.py)

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready."""
        return {
            "verification": self.verification,
            "head_release_id": self.head_release_id,
            "serving_release_id": self.serving_release_id,
            "state": self.state,
            "error": self.error,
            "activated_at": self.activated_at,
            "failures": self.failures,
            "canary": None if self.canary is None else self.canary.as_dict(),
        }


@dataclass
class _AdapterSlot:
    last_used: float
    in_use: int = 0
    on: str | None = None  # an adapter loaded on this checkpoint


@dataclass
class AdapterPool:
    """Adapters loaded in one upstream, least recently used unloaded beyond a limit.

    An adapter that a request still uses, or that a scenario serves now, is never
    unloaded, so in-flight requests finish on the adapter they started with.
    """

    upstream: Upstream
    limit: int
    unload: bool = True
    slots: OrderedDict[str, _AdapterSlot] = field(default_factory=OrderedDict)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    kind: Literal["adapter", "checkpoint"] = "adapter"  # what it loads: the same rules
    on_unload: Callable[[str], None] | None = None  # told each name it unloaded
    # a checkpoint pool's adapters: those loaded on a checkpoint it unloads go with it
    # (unless in use), so the engine can free the checkpoint's weights
    dependents: AdapterPool | None = None

    async def _load(self, name: str, path: Path, digest: str, on: str | None) -> None:
        if self.kind == "checkpoint":
            await self.upstream.load_checkpoint(name, str(path), digest)
        else:
            await self.upstream.load_adapter(name, str(path), digest, on)

    async def _unload(self, name: str) -> None:
        if self.kind == "checkpoint":
            await self.upstream.unload_checkpoint(name)
        else:
            await self.upstream.unload_adapter(name)

    async def ensure(
        self, name: str, path: Path, digest: str, keep: set[str], on: str | None = None
    ) -> bool:
        """Load ``name`` unless loaded (True when it was loaded now); then unload the
        least recently used extras (unless ``unload`` is off: shared upstreams).

        An upstream that says ``name`` is already loaded counts as loaded: another
        gateway sharing the upstream loaded it, and names carry the adapter's digest
        (``<scenario>@<digest12>``), so the same name is the same weights.
        """
        async with self.lock:
            if name in self.slots:
                self.slots.move_to_end(name)
                return False
            await self._load_making_room(name, path, digest, keep, on)
            self.slots[name] = _AdapterSlot(last_used=time.monotonic(), on=on)
            await self._trim(keep | {name})
            return True

    async def _load_making_room(
        self, name: str, path: Path, digest: str, keep: set[str], on: str | None
    ) -> None:
        """Load ``name``; a checkpoint the upstream has no memory for (507) is retried
        after unloading the least recently used checkpoint that nothing keeps or uses,
        one at a time, until it fits or none is left to unload (then the 507 stands)."""
        while True:
            try:
                await self._load(name, path, digest, on)
                return
            except AdapterAlreadyLoadedError:
                log.info("%s %s was already loaded in %s", self.kind, name, self.upstream.name)
                return
            except UpstreamError as exc:
                if self.kind != "checkpoint" or exc.upstream_status != 507 or not self.unload:
                    raise
                victim = self._least_recent(keep | {name})
                if victim is None:
                    raise
                log.info(
                    "no memory for checkpoint %s in %s: unloading %s and retrying",
                    name,
                    self.upstream.name,
                    victim,
                )
                await self._evict(victim)

    def _least_recent(self, keep: set[str]) -> str | None:
        """The least recently used name that nothing keeps or uses, if any."""
        return next(
            (v for v, slot in self.slots.items() if v not in keep and not slot.in_use), None
        )

    async def _evict(self, victim: str) -> None:
        del self.slots[victim]
        if self.on_unload is not None:
            self.on_unload(victim)
        try:
            await self._unload(victim)
        except ReefError as exc:
            log.warning("could not unload %s %s: %s", self.kind, victim, exc.message)
        if self.dependents is not None:
            await self.dependents.unload_on(victim)

    async def drop(self, name: str) -> None:
        """Unload ``name`` now, in use or not (its weights failed verification: no
        request may reach them again under this name)."""
        async with self.lock:
            if name in self.slots:
                await self._evict(name)

    def forget(self, name: str) -> None:
        """Stop counting ``name`` as loaded, unloading nothing (the upstream no longer
        has it: evicted by the upstream itself)."""
        self.slots.pop(name, None)

    async def unload_on(self, checkpoint: str) -> None:
        """Unload the adapters loaded on ``checkpoint`` that no request uses."""
        async with self.lock:
            for name, slot in list(self.slots.items()):
                if slot.on == checkpoint and not slot.in_use:
                    await self._evict(name)

    async def trim(self, keep: set[str]) -> None:
        """Unload the least recently used beyond the limit, except ``keep`` and those in
        use (after a flip: the weights no release serves any more go)."""
        async with self.lock:
            await self._trim(keep)

    async def _trim(self, keep: set[str]) -> None:
        if not self.unload:
            return
        for victim in list(self.slots):
            if len(self.slots) <= self.limit:
                break
            slot = self.slots[victim]
            if victim in keep or slot.in_use:
                continue
            await self._evict(victim)

    def acquire(self, name: str) -> None:
        """A request starts using ``name``."""
        slot = self.slots.get(name)
        if slot is not None:
            slot.in_use += 1
            slot.last_used = time.monotonic()

    def release(self, name: str) -> None:
        """A request stopped using ``name``."""
        slot = self.slots.get(name)
        if slot is not None and slot.in_use:
            slot.in_use -= 1


class _AdapterLease:
    """One request's use of one adapter in one pool."""

    __slots__ = ("name", "pool")

    def __init__(self, pool: AdapterPool, name: str) -> None:
        self.pool = pool
        self.name = name

    def __enter__(self) -> None:
        self.pool.acquire(self.name)

    def __exit__(self, *exc: object) -> None:
        self.pool.release(self.name)


class Activation:
    """The serving release of every scenario, kept in step with the chain's heads."""

    def __init__(
        self,
        settings: ReefSettings,
        chain: ReleaseChain,
        artifacts: ArtifactStore,
        upstreams: dict[str, Upstream],
    ) -> None:
        self.settings = settings
        self.chain = chain
        self.artifacts = artifacts
        self.upstreams = upstreams
        self.serving: dict[str, ServingRelease] = {}
        # Only staged canaries: the hot path's one extra lookup.
        self.canaries: dict[str, CanaryRoute] = {}
        self.status: dict[str, ScenarioStatus] = {}
        self.pools = {
            name: AdapterPool(
                upstream,
                settings.activation.max_adapters,
                settings.activation.unload_adapters,
                on_unload=self._unloaded,
            )
            for name, upstream in upstreams.items()
        }
        self.checkpoint_pools = {
            name: AdapterPool(
                upstream,
                settings.activation.max_checkpoints,
                settings.activation.unload_adapters,
                kind="checkpoint",
                on_unload=self._unloaded,
            )
            for name, upstream in upstreams.items()
        }
        for name, pool in self.checkpoint_pools.items():
            pool.dependents = self.pools[name]
        # upstreams that reload their one set of weights in place (vLLM, SGLang)
        self.inplace = {
            name: InPlaceWeights(upstream)
            for name, upstream in upstreams.items()
            if name in settings.upstreams
            and settings.upstreams[name].checkpoint_loading != "engine"
        }
        self.adapter_cache = AdapterCacheTelemetry(
            {
                name: (config.adapter_slots.max_loras, config.adapter_slots.max_cpu_loras)
                for name, config in settings.upstreams.items()
            }
        )
        self.gate_key = gate_key_id(settings)  # the key the gate pins candidates with
        self.failures_total = 0
        self.flips_total = 0
        self.canary_failures_total = 0
        self.verifications = Verifications()
        self._pinned: OrderedDict[str, tuple[PinTarget, ServingRelease]] = OrderedDict()
        self._staging: dict[str, asyncio.Task[None]] = {}
        self._canary_staging: dict[str, asyncio.Task[None]] = {}
        self._created: set[str] = set()
        self._create_lock = asyncio.Lock()
        self._poller: asyncio.Task[None] | None = None
        self._verifier: asyncio.Task[None] | None = None
        self._after_flip: set[asyncio.Task[None]] = set()  # probes after a flip

    # -- lifecycle -------------------------------------------------------------------

    async def start(self) -> None:
        """Create configured scenarios' first releases, warn about each whose head serves
        another model than the configuration names (``reef.gateway.serving.drift``), stage
        every head, start polling."""
        for scenario in self.settings.scenarios:
            await self.ensure_scenario(scenario)
        await asyncio.to_thread(warn_on_drift, self.settings, self.chain)
        await self.sync_once(wait=True)
        self._poller = asyncio.get_running_loop().create_task(self._poll())
        if self.settings.activation.verify and self.settings.activation.verify_interval_seconds:
            self._verifier = asyncio.get_running_loop().create_task(self._verify_every())

    async def stop(self) -> None:
        """Stop polling and staging."""
        running = (
            self._poller,
            self._verifier,
            *self._staging.values(),
            *self._canary_staging.values(),
            *self._after_flip,
        )
        tasks = [t for t in running if t is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    # -- the hot path ----------------------------------------------------------------

    async def current(self, scenario: str) -> ServingRelease:
        """The release a request for ``scenario`` freezes now."""
        serving = self.serving.get(scenario)
        if serving is not None:
            return serving
        await self.ensure_scenario(scenario)
        await self.sync_once(wait=True, only=scenario)
        return self.serving.get(scenario) or self._unreleased(scenario)

    async def pinned(
        self,
        scenario: str,
        release_id: str,
        principal: Principal,
        access: PinAccess,
        state_read: bool = False,
    ) -> PinnedServing:
        """The release or candidate ``release_id`` of ``scenario``, staged on demand, if
        ``principal`` (who may pin as ``access``) may be served by it
        (``reef.gateway.serving.pins``).

        A release's owner is read once (releases never change); a candidate's state is
        read on every pin, so a candidate the gate has just rejected stops serving at once,
        unless the caller has just read it itself (``state_read``: the shadow arm, which
        re-reads the evaluating candidate every few seconds; a pin's two chain reads cost
        as much CPU as a live request, ``bench/shadow_overhead.py``).
        Raises ``NotFoundError``, ``InvalidInputError`` or ``PermissionDeniedError`` as
        ``check_pin`` does.
        """
        serving = self.serving.get(scenario)
        if serving is not None and serving.release_id == release_id:
            return PinnedServing(serving)  # the head: a release on this chain
        cached = self._pinned.get(release_id)
        if cached is not None and (cached[0].candidate_state is None or state_read):
            target: PinTarget | None = cached[0]
        else:
            target = await asyncio.to_thread(self._find, release_id)
        eval_only = check_pin(target, release_id, scenario, principal, access)
        assert target is not None  # check_pin raised otherwise
        if cached is not None:
            self._pinned[release_id] = (target, cached[1])
            self._pinned.move_to_end(release_id)
            return PinnedServing(cached[1], eval_only)
        staged = await self._stage(scenario, release_id, target.manifest)
        self._pinned[release_id] = (target, staged)
        while len(self._pinned) > _PINNED_CACHE:
            self._pinned.popitem(last=False)
        return PinnedServing(staged, eval_only)

    def lease(self, serving: ServingRelease) -> AbstractContextManager[None] | None:
        """Hold the adapter of ``serving`` in use for the block: no pool unloads an
        adapter while a request inside such a block may still need it.

        The gateway holds one lease per request around its whole response (sent,
        streamed, cut short or never read), so the in-use counts in ``/reef/status``
        fall back to 0 when the request is done, however it ended.
        """
        inner: _AdapterLease | None = None
        if serving.adapter_name is not None:
            inner = _AdapterLease(self.pools[serving.upstream], serving.adapter_name)
        elif serving.checkpoint_name is not None:
            pool = self.checkpoint_pools[serving.upstream]
            inner = _AdapterLease(pool, serving.checkpoint_name)
        weights = self.inplace.get(serving.upstream) if self.inplace else None
        if weights is not None:
            return InPlaceLease(weights, inner)
        return inner  # most requests: None, nothing to hold, nothing to allocate

    def admits(self, serving: ServingRelease) -> bool:
        """Whether a request frozen on ``serving`` may go upstream now: always, except on
        an in-place upstream that is swapping or holds other weights. The caller enters
        ``lease(serving)`` right after a True, with no await between."""
        if not self.inplace:
            return True
        weights = self.inplace.get(serving.upstream)
        return weights is None or weights.admits(_weights_key(serving))

    async def settle(self, serving: ServingRelease, pinned: bool) -> None:
        """What a request that ``admits`` refused waits for before it chooses its
        release again: the swap under way; or, when ``serving`` is what its scenario
        serves and the upstream holds other weights (a reload that failed midway), a
        reload of its weights. A ``pinned`` request to weights the upstream does not
        hold raises ``WeightsNotResidentError`` (409)."""
        weights = self.inplace[serving.upstream]
        if weights.swapping:
            await weights.idle()
            return
        key = _weights_key(serving)
        if weights.admits(key):
            return
        if pinned:
            raise WeightsNotResidentError(
                f"release {serving.release_id!r} of scenario {serving.scenario!r} is served "
                f"by {_describe(key)}, but upstream {serving.upstream!r} reloads its one set "
                f"of weights in place and holds {_describe(weights.resident)} now: a pinned "
                "request reaches only the weights that serve (docs/releases.md, in-place "
                "checkpoints)"
            )
        head = self.serving.get(serving.scenario)
        if head is not None and head is not serving:
            return  # the scenario serves another release now: choose again
        # What the scenario serves (or, before its first release stages, the base) is
        # not what the server holds: a reload failed midway, or none worked yet. Load
        # it now; when the server refuses, the request fails with the reason.
        await asyncio.wait_for(
            self._swap(weights, serving, flip=False),
            self.settings.activation.stage_timeout_seconds,
        )

    def _unloaded(self, name: str) -> None:
        """A pool unloaded ``name``."""
        self._forget_pins(name)
        self.verifications.forget(name)

    def _forget_pins(self, name: str) -> None:
        """A pool unloaded ``name``: pinned releases staged on it must stage again."""
        for release_id, (_target, staged) in list(self._pinned.items()):
            if name in (staged.adapter_name, staged.checkpoint_name):
                del self._pinned[release_id]

    def _resident(self) -> set[str]:
        """The weight names that serve now (heads and staged canaries): adapters and
        checkpoints, an adapter's checkpoint too."""
        resident = (*self.serving.values(), *(r.serving for r in self.canaries.values()))
        names = {s.weights_name for s in resident if s.weights_name}
        return names | {s.checkpoint_name for s in resident if s.checkpoint_name}

    # -- following heads -------------------------------------------------------------

    def forget(self, scenario: str) -> None:
        """Stop serving a scenario the store no longer has (``ReleaseChain.forget_scenario``):
        a later request for it creates it again."""
        self.serving.pop(scenario, None)
        self.status.pop(scenario, None)
        self._created.discard(scenario)

    async def ensure_scenario(self, scenario: str) -> None:
        """Give ``scenario`` its ``create`` release from the config if it has none."""
        if scenario in self._created:
            return
        async with self._create_lock:
            if scenario in self._created:
                return
            # A name the config does not know is most often a typo: say so once, when
            # this gateway is the one that creates it.
            unconfigured = scenario not in self.settings.scenarios and scenario != "default"
            new = unconfigured and await asyncio.to_thread(self.chain.head, scenario) is None
            manifest = await asyncio.to_thread(self._initial_manifest, scenario)
            await asyncio.to_thread(
                self.chain.create, scenario, manifest, "gateway", "scenario first served"
            )
            self._created.add(scenario)
            if new:
                log.info(
                    "created scenario %r on first request; set server.unknown_scenarios: "
                    "reject to refuse misspelled names",
                    scenario,
                )

    async def sync_once(self, wait: bool = False, only: str | None = None) -> None:
        """Compare heads and live canaries with what serves and stage what moved
        (awaited when ``wait``; a failed head or canary is then retried at once)."""
        heads, canaries = await asyncio.to_thread(self._snapshot)
        started = self._follow_canaries(canaries, wait, only)
        behind: list[asyncio.Task[None]] = []  # staging what may no longer be the head
        for scenario, (release_id, _seq) in heads.items():
            if only is not None and scenario != only:
                continue
            status = self.status.setdefault(scenario, ScenarioStatus())
            status.head_release_id = release_id
            serving = self.serving.get(scenario)
            if serving is not None and serving.release_id == release_id:
                continue
            if scenario in self._staging:
                behind.append(self._staging[scenario])
                continue
            if status.state == "failed" and not wait:
                continue  # a failed head is retried when it moves again or a request waits
            task = asyncio.get_running_loop().create_task(self._activate(scenario, release_id))
            self._staging[scenario] = task
            started.append(task)
        if wait and (started or behind):
            await asyncio.gather(*started, *behind, return_exceptions=True)
        if wait and behind:
            # A staging begun before the head moved (a rollback, a publish) has ended:
            # stage the head as it is now, so a caller that waits sees it serve.
            await self.sync_once(wait=True, only=only)

    def _snapshot(self) -> tuple[dict[str, tuple[str, int]], dict[str, Candidate]]:
        return self.chain.heads_snapshot(), self.chain.canaries()

    def _follow_canaries(
        self, live: dict[str, Candidate], wait: bool, only: str | None
    ) -> list[asyncio.Task[None]]:
        """Keep routing to the staged canaries still live, stop routing to ended ones,
        start staging new ones (all scenarios, or ``only``)."""

        def followed(scenario: str) -> bool:
            return only is None or scenario == only

        self.canaries = {
            scenario: route
            for scenario, route in self.canaries.items()
            if not followed(scenario)
            or (scenario in live and live[scenario].id == route.candidate_id)
        }
        for scenario, status in self.status.items():
            if followed(scenario) and scenario not in live:
                status.canary = None  # ended: published or abandoned
        started = []
        now = time.monotonic()
        for scenario, candidate in live.items():
            fraction = candidate.canary_fraction
            if not followed(scenario) or fraction is None:
                continue
            status = self.status.setdefault(scenario, ScenarioStatus())
            if status.canary is None or status.canary.candidate_id != candidate.id:
                status.canary = CanaryStatus(candidate.id, fraction)
            if scenario in self.canaries or scenario in self._canary_staging:
                continue
            if status.canary.state == "failed" and not wait and now < status.canary.retry_at:
                continue
            task = asyncio.get_running_loop().create_task(
                self._activate_canary(scenario, candidate, fraction)
            )
            self._canary_staging[scenario] = task
            started.append(task)
        return started

    async def _activate_canary(self, scenario: str, candidate: Candidate, fraction: float) -> None:
        if (canary := self._canary_status(scenario, candidate.id)) is not None:
            canary.state = "staging"
        try:
            staged = await asyncio.wait_for(
                self._stage(scenario, candidate.id, candidate.manifest),
                self.settings.activation.stage_timeout_seconds,
            )
            self._check_canary_weights(staged)
        except Exception as exc:  # whatever breaks, the head keeps all the traffic
            message = exc.message if isinstance(exc, ReefError) else repr(exc)
            self.canary_failures_total += 1
            if (canary := self._canary_status(scenario, candidate.id)) is not None:
                canary.state, canary.error = "failed", message
                canary.failures += 1
                canary.retry_at = time.monotonic() + CANARY_RETRY_SECONDS
            log.warning(
                "canary %s of %s failed to stage; the head serves all traffic: %s",
                candidate.id,
                scenario,
                message,
            )
        else:
            if (canary := self._canary_status(scenario, candidate.id)) is None:
                return  # it ended while staging
            self.canaries = {**self.canaries, scenario: CanaryRoute(candidate.id, fraction, staged)}
            # a pin of the candidate reuses it (its state is read again on each pin)
            self._pinned[candidate.id] = (PinTarget(scenario, candidate.manifest, "canary"), staged)
            canary.state, canary.error, canary.activated_at = "serving", None, time.time()
            log.info(
                "scenario %s serves canary %s to %.0f%%", scenario, candidate.id, fraction * 100
            )
        finally:
            self._canary_staging.pop(scenario, None)

    def _check_canary_weights(self, staged: ServingRelease) -> None:
        """A canary on an in-place upstream must run on the weights that serve (a
        harness or an adapter on them); one that needs other weights is refused."""
        weights = self.inplace.get(staged.upstream) if self.inplace else None
        head = self.serving.get(staged.scenario)
        if weights is None or head is None or _weights_key(head) == _weights_key(staged):
            return
        raise ConflictError(
            f"canary {staged.release_id!r} needs {_describe(_weights_key(staged))}, but "
            f"upstream {staged.upstream!r} reloads its one set of weights in place and "
            f"serves {_describe(_weights_key(head))}: a checkpoint cannot be canaried "
            "there (publish it, or canary it on an upstream that stages beside)"
        )

    def _canary_status(self, scenario: str, candidate_id: str) -> CanaryStatus | None:
        """The scenario's canary status while ``candidate_id`` is still its live canary."""
        status = self.status.get(scenario)
        canary = None if status is None else status.canary
        return canary if canary is not None and canary.candidate_id == candidate_id else None

    async def _poll(self) -> None:
        interval = self.settings.activation.poll_interval_seconds
        cache_interval = self.settings.activation.adapter_cache_interval_seconds
        cache_checked = float("-inf")
        while True:
            try:
                await self.sync_once()
            except ReefError as exc:
                log.warning("could not read the release heads: %s", exc.message)
            except Exception:
                log.exception("release head polling failed")
            if time.monotonic() - cache_checked >= cache_interval:
                cache_checked = time.monotonic()
                try:
                    await self.check_adapter_cache()
                except Exception:
                    log.exception("adapter cache check failed")
            await asyncio.sleep(interval)

    async def _verify_every(self) -> None:
        interval = self.settings.activation.verify_interval_seconds
        while True:
            await asyncio.sleep(interval)
            try:
                await self.verify_tick()
            except Exception:
                log.exception("continuous verification failed")

    async def verify_tick(self) -> None:
        """Re-probe the weights every scenario serves (``activation.verify_interval_seconds``
        calls it; tests call it directly): weights the upstream no longer lists (evicted)
        or that answer otherwise than their fingerprint are loaded again and verified; a
        re-stage that fails logs an error, counts ``verify_failures_total`` and shows in
        the scenario's status, and the scenario's release stays as it is."""
        async with self.verifications.lock:
            for serving in list(self.serving.values()):
                if serving.weights_name is not None:
                    await self._reverify(serving)
                elif serving.checkpoint_digest is not None:
                    await self._reverify_in_place(serving)

    def _probe_after_flip(self, scenario: str) -> None:
        """Probe the weights ``scenario`` now serves once more, in the background (the
        flip waits for nothing): weights the upstream dropped or changed between their
        staging and the flip (another load evicting them from vLLM's cache) are found
        at once, not at the next ``verify_interval_seconds``, and loaded again."""
        serving = self.serving.get(scenario)
        if serving is None or not self.settings.activation.verify:
            return
        last = self.verifications.get(_verified_name(serving))
        if last is None or last.state != "verified":  # nothing was probed: nothing to repeat
            return
        task = asyncio.get_running_loop().create_task(self._verify_flipped(serving))
        self._after_flip.add(task)
        task.add_done_callback(self._after_flip.discard)

    async def _verify_flipped(self, flipped: ServingRelease) -> None:
        try:
            async with self.verifications.lock:
                if self.serving.get(flipped.scenario) is not flipped:
                    return  # flipped again meanwhile: that flip probes its own
                if flipped.weights_name is not None:
                    await self._reverify(flipped)
                else:
                    await self._reverify_in_place(flipped)
        except Exception:
            log.exception("verification after the flip of %s failed", flipped.scenario)

    async def _reverify_in_place(self, serving: ServingRelease) -> None:
        """Probe an in-place upstream's checkpoint; weights that answer otherwise are
        marked unknown, so the next request reloads them (``settle``)."""
        weights = self.inplace.get(serving.upstream) if self.inplace else None
        name, digest = serving.base_model, serving.checkpoint_digest
        if weights is None or name is None or digest is None or weights.swapping:
            return
        try:
            await self.verify_weights(serving.upstream, "checkpoint", name, digest)
        except WeightsMismatchError:
            weights.resident = None
            self.verifications.restaged_total += 1
        except ReefError as exc:
            log.warning("could not re-verify checkpoint %s: %s", digest, exc.message)

    async def _reverify(self, serving: ServingRelease) -> None:
        name = serving.weights_name
        assert name is not None
        kind: Literal["adapter", "checkpoint"] = "adapter" if serving.adapter_name else "checkpoint"
        digest = serving.adapter_digest if serving.adapter_name else serving.checkpoint_digest
        assert digest is not None
        upstream = self.upstreams[serving.upstream]
        try:
            if name in await upstream.list_models():
                await self.verify_weights(serving.upstream, kind, name, digest)
                return
            reason = f"upstream {serving.upstream!r} no longer lists {kind} {name!r}"
            self.verifications.record(name, digest, "failed", reason)
        except WeightsMismatchError as exc:
            reason = exc.message
        except ReefError as exc:
            log.warning("could not re-verify %s %s: %s", kind, name, exc.message)
            return
        log.error("scenario %s: %s; loading it again", serving.scenario, reason)
        pool = (self.checkpoint_pools if kind == "checkpoint" else self.pools)[serving.upstream]
        on = serving.checkpoint_name if kind == "adapter" else None
        try:
            # loaded again and verified; weights that still answer otherwise stay loaded
            # (requests for the release keep an answer; their records carry no verified
            # digest) and the next tick tries again
            await pool.drop(name)
            path = await asyncio.to_thread(self.artifacts.materialize, digest)
            await pool.ensure(name, path, digest, self._resident(), on)
            await self.verify_weights(serving.upstream, kind, name, digest, path)
        except (ReefError, OSError) as exc:
            message = exc.message if isinstance(exc, ReefError) else repr(exc)
            self.verifications.record(name, digest, "failed", f"{reason}; re-staging: {message}")
            log.error(
                "scenario %s: could not stage %s %s again: %s",
                serving.scenario,
                kind,
                name,
                message,
            )
        else:
            self.verifications.restaged_total += 1
            log.info("scenario %s: %s %s loaded again and verified", serving.scenario, kind, name)

    def pinned_candidate(self, release_id: str | None) -> bool:
        """Whether ``release_id`` was pinned here as a candidate (not a release): a
        distilled candidate's pinned requests are the student's first (the gate measures
        the student as it would serve at full share, escalations included)."""
        cached = self._pinned.get(release_id) if release_id is not None else None
        return cached is not None and cached[0].candidate_state is not None

    def _needed_adapters(self) -> dict[str, set[str]]:
        """Per upstream, the adapters Reef needs active: every head's, every staged
        canary's, and every pinned candidate's the gate or a canary is deciding (the gate's
        runs and the shadow arm pin them)."""
        needed: dict[str, set[str]] = {}
        staged = [*self.serving.values(), *(r.serving for r in self.canaries.values())]
        staged += [
            serving
            for target, serving in self._pinned.values()
            if target.candidate_state in ("evaluating", "canary")
        ]
        for serving in staged:
            if serving.adapter_name is not None:
                needed.setdefault(serving.upstream, set()).add(serving.adapter_name)
        return needed

    async def check_adapter_cache(self) -> None:
        """Update the adapter cache telemetry (``reef.gateway.serving.adapter_cache``) of
        every OpenAI-dialect upstream that has adapter slots configured, adapters Reef
        loaded, or adapters Reef needs."""
        needed = self._needed_adapters()
        for name, upstream in self.upstreams.items():
            config = self.settings.upstreams.get(name)
            slots = config is not None and (
                config.adapter_slots.max_loras is not None
                or config.adapter_slots.max_cpu_loras is not None
            )
            loaded = set(self.pools[name].slots)
            if upstream.dialect != "openai" or not (slots or loaded or name in needed):
                continue
            await self.adapter_cache.check(upstream, loaded, needed.get(name, set()))

    async def _activate(self, scenario: str, release_id: str) -> None:
        status = self.status.setdefault(scenario, ScenarioStatus())
        status.state = "staging"
        try:
            target = await asyncio.to_thread(self._find, release_id)
            if target is None:
                raise NotFoundError(f"no release {release_id!r}")
            staged = await asyncio.wait_for(
                self._stage_head(scenario, release_id, target.manifest),
                self.settings.activation.stage_timeout_seconds,
            )
        except (ReefError, TimeoutError, OSError) as exc:
            message = exc.message if isinstance(exc, ReefError) else repr(exc)
            if isinstance(exc, TimeoutError):
                message = self._timed_out(scenario)
            status.state, status.error = "failed", message
            status.failures += 1
            self.failures_total += 1
            log.error("release %s of %s failed to stage: %s", release_id, scenario, message)
        else:
            status.state, status.error = "serving", None
            status.serving_release_id = release_id
            status.activated_at = time.time()
            self.flips_total += 1
            log.info("scenario %s now serves release %s", scenario, release_id)
            self._probe_after_flip(scenario)
            # drain and free: checkpoints nothing serves any more, beyond the limit
            await self.checkpoint_pools[staged.upstream].trim(self._resident())
        finally:
            self._staging.pop(scenario, None)

    def _timed_out(self, scenario: str) -> str:
        limit = self.settings.activation.stage_timeout_seconds
        message = f"staging took longer than activation.stage_timeout_seconds ({limit:g} s)"
        upstream = self.settings.upstream_for(scenario)[0]
        weights = self.inplace.get(upstream) if self.inplace else None
        if weights is not None and weights.in_flight:
            message += (
                f": {weights.in_flight} request(s) were still running on upstream "
                f"{upstream!r}'s old weights, which a reload in place waits for; nothing "
                "was reloaded, and the previous release serves on"
            )
        return message

    # -- staging ---------------------------------------------------------------------

    async def _stage_head(
        self, scenario: str, release_id: str, manifest: ReleaseManifest
    ) -> ServingRelease:
        """Stage the head and flip to it: one assignment, or, on an in-place upstream,
        a swap of its weights that flips before the requests it held go on."""
        staged = await self._stage(scenario, release_id, manifest)
        weights = self.inplace.get(staged.upstream) if self.inplace else None
        if weights is None:
            self.serving[scenario] = staged  # the flip: one assignment
        else:
            await self._swap(weights, staged)
        return staged

    async def _swap(
        self, weights: InPlaceWeights, staged: ServingRelease, flip: bool = True
    ) -> None:
        """Make ``staged``'s weights the in-place upstream's and (``flip``) its scenario's
        serving release."""
        key = _weights_key(staged)
        others = sorted(
            s.scenario
            for s in self.serving.values()
            if s.upstream == staged.upstream
            and s.scenario != staged.scenario
            and _weights_key(s) != key
        )
        if others:
            raise ConflictError(
                f"upstream {staged.upstream!r} reloads its one set of weights in place, and "
                f"scenario(s) {', '.join(others)} serve other weights there: "
                f"release {staged.release_id!r} of {staged.scenario!r} needs "
                f"{_describe(key)}; give each scenario with checkpoints an upstream of its own"
            )

        async def directory() -> str:  # verified only when it is to be reloaded
            digest = staged.checkpoint_digest
            if digest is None:
                return await weights.upstream.base_weights()
            return str(await asyncio.to_thread(self._checkpoint_dir, digest))

        def flipped() -> None:
            if not flip:
                return
            self.serving[staged.scenario] = staged
            route = self.canaries.get(staged.scenario)
            if route is not None and _weights_key(route.serving) != key:
                # a canary on the old weights can no longer be reached
                self.canaries = {k: v for k, v in self.canaries.items() if k != staged.scenario}

        async def verified() -> None:
            name = staged.base_model  # an in-place checkpoint serves under the model's name
            if staged.checkpoint_digest is not None and name is not None:
                await self.verify_weights(
                    staged.upstream, "checkpoint", name, staged.checkpoint_digest
                )

        reloaded = await weights.swap(key, directory, flipped, verified)
        if reloaded:
            log.info(
                "upstream %s reloaded %s in place for release %s of %s",
                staged.upstream,
                _describe(key),
                staged.release_id,
                staged.scenario,
            )

    def _checkpoint_dir(self, digest: str) -> Path:
        """The checkpoint's verified directory in the artifact cache: every file's
        digest, no pickle, no truncated shard (what the engine checks before it loads)."""
        path = self.artifacts.materialize(digest)
        check_checkpoint_directory(path, digest)
        return path

    def _find(self, release_id: str) -> PinTarget | None:
        """What ``release_id`` names: a release, else a candidate (with its state now),
        else None."""
        try:
            release: Release = self.chain.get_release(release_id)
            return PinTarget(release.scenario, release.manifest)
        except NotFoundError:
            pass
        try:
            candidate = self.chain.get_candidate(release_id)
        except NotFoundError:
            return None
        return PinTarget(candidate.scenario, candidate.manifest, candidate.state)

    async def _stage(
        self, scenario: str, release_id: str, manifest: ReleaseManifest
    ) -> ServingRelease:
        upstream_name, _config = self.settings.upstream_for(scenario)
        harness = bundle_digest = None
        if manifest.harness is not None:
            harness, bundle_digest = await asyncio.to_thread(self._read_harness, manifest.harness)
        adapter_name = checkpoint_name = None
        adapter, checkpoint = manifest.model.adapter, manifest.model.checkpoint
        in_place = upstream_name in self.inplace  # its checkpoint is swapped in, not loaded
        if checkpoint is not None and not in_place:
            checkpoint_name = f"{scenario}@ckpt-{checkpoint.removeprefix('sha256:')[:12]}"
            await self._ensure(upstream_name, "checkpoint", checkpoint_name, checkpoint)
        if adapter is not None:
            adapter_name = f"{scenario}@{adapter.removeprefix('sha256:')[:12]}"
            if checkpoint is not None:  # the same adapter on other weights: another model
                adapter_name += f"@ckpt-{checkpoint.removeprefix('sha256:')[:12]}"
            await self._ensure(upstream_name, "adapter", adapter_name, adapter, checkpoint_name)
        return ServingRelease(
            scenario=scenario,
            release_id=release_id,
            base_model=None if manifest.model.base == CLIENT_CHOSEN_MODEL else manifest.model.base,
            adapter_name=adapter_name,
            adapter_digest=adapter,
            harness=harness,
            harness_digest=manifest.harness,
            bundle_digest=bundle_digest,
            upstream=upstream_name,
            checkpoint_name=checkpoint_name,
            checkpoint_digest=checkpoint,
            routing=manifest.routing,
        )

    async def _ensure(
        self,
        upstream: str,
        kind: Literal["adapter", "checkpoint"],
        name: str,
        digest: str,
        on: str | None = None,
    ) -> None:
        """Materialize ``digest`` (verified, streamed to disk) and load it into
        ``upstream`` as the ``kind`` ``name`` unless loaded (an adapter on the loaded
        checkpoint ``on`` when given), then warm it up."""
        pool = (self.checkpoint_pools if kind == "checkpoint" else self.pools)[upstream]
        path = await asyncio.to_thread(self.artifacts.materialize, digest)
        loaded = await pool.ensure(name, path, digest, self._resident(), on)
        if loaded and self.settings.activation.warmup:  # a resident one is warm
            await self._warm(upstream, name)
        if loaded or name not in self.verifications.by_name:
            try:
                await self.verify_weights(upstream, kind, name, digest, path)
            except WeightsMismatchError:
                await pool.drop(name)  # a retry loads it again; nothing reaches it meanwhile
                raise

    async def verify_weights(
        self, upstream: str, kind: str, name: str, digest: str, path: Path | None = None
    ) -> None:
        """Probe ``name`` on ``upstream`` with the fingerprint of ``digest`` (the
        materialized artifact at ``path``, else materialized now) and remember what was
        found (``reef.gateway.serving.verify``). Raises ``WeightsMismatchError`` (and
        logs an error) when the answers differ; an artifact without a fingerprint is
        noted ``unverified``, with a warning; off (``activation.verify``) it does
        nothing."""
        if not self.settings.activation.verify:
            return
        if path is None:
            path = await asyncio.to_thread(self.artifacts.materialize, digest)
        fingerprint = await asyncio.to_thread(load_fingerprint, path)
        if fingerprint is None:
            log.warning(
                "%s %s (%s) has no fingerprint (made before fingerprints): it serves unverified",
                kind,
                name,
                digest,
            )
            self.verifications.record(name, digest, "unverified")
            return
        # A local upstream's precision (``dtype``; still set once its engine started
        # and the upstream points at it over HTTP; float32, the fingerprint's own, for
        # any other upstream).
        config = self.settings.upstreams.get(upstream)
        served = config.dtype if config is not None else None
        mismatch = await probe(self.upstreams[upstream], name, fingerprint, served)
        distinguishes, tolerance = base_check(fingerprint, served)
        if distinguishes is False and (name, digest) not in self.verifications.warned_base:
            self.verifications.warned_base.add((name, digest))
            log.warning("%s", base_gap_warning(kind, name, fingerprint, tolerance))
        if mismatch is None:
            self.verifications.record(name, digest, "verified", None, distinguishes)
            return
        self.verifications.record(name, digest, "failed", mismatch.describe(), distinguishes)
        message = mismatch_error(kind, name, upstream, mismatch)
        log.error("verification failed: %s", message)
        raise WeightsMismatchError(message)

    async def _warm(self, upstream_name: str, model: str) -> None:
        """One short request so the adapter's first real request pays no lazy load."""
        upstream = self.upstreams[upstream_name]
        if upstream.dialect != "openai":
            return
        body = {"model": model, "max_tokens": 1, "messages": [{"role": "user", "content": "hi"}]}
        await upstream.send(UpstreamRequest("/chat/completions", dumps(body), False))

    def _read_harness(self, digest: str) -> tuple[Harness, str]:
        bundle = read_bundle_archive(self.artifacts.read_bytes(digest))
        return bundle.harness, compute_bundle_digest(bundle)

    def _initial_manifest(self, scenario: str) -> ReleaseManifest:
        config = self.settings.scenario(scenario)
        base = configured_model(self.settings, scenario).name
        harness = None
        if config.initial_harness is not None:
            try:
                bundle = load_bundle(config.initial_harness)
            except (ReefError, OSError) as exc:
                # name the setting: ``reef serve`` checks it first, other hosts may not
                detail = exc.message if isinstance(exc, ReefError) else str(exc)
                raise ConfigError(
                    f"scenarios.{scenario}.initial_harness: {config.initial_harness}: {detail}"
                ) from exc
            harness = self.artifacts.put_bytes(pack_bundle(bundle), "harness")
        routing = initial_routing(self.settings, scenario)
        return ReleaseManifest(model=ModelComponent(base=base), harness=harness, routing=routing)

    def _unreleased(self, scenario: str) -> ServingRelease:
        upstream_name, upstream = self.settings.upstream_for(scenario)
        return ServingRelease(
            scenario=scenario,
            release_id=None,
            base_model=self.settings.scenario(scenario).model or upstream.model,
            adapter_name=None,
            adapter_digest=None,
            harness=None,
            harness_digest=None,
            bundle_digest=None,
            upstream=upstream_name,
            routing=initial_routing(self.settings, scenario),
        )

    def _scenario_status(self, scenario: str, status: ScenarioStatus) -> dict[str, Any]:
        """A scenario's status with the verification of the weights it serves."""
        shown = status.as_dict()
        serving = self.serving.get(scenario)
        name = None if serving is None else _verified_name(serving)
        found = self.verifications.get(name)
        if found is not None:
            shown["verification"] = {"weights": name, **found.as_dict()}
        return shown

    def verified_digest(self, serving: ServingRelease) -> str | None:
        """The digest last verified for the weights ``serving`` runs on (None: the base
        model, or not verified)."""
        found = self.verifications.get(_verified_name(serving))
        return found.digest if found is not None and found.state == "verified" else None

    def status_json(self) -> dict[str, Any]:
        """Activation state for ``/reef/status``."""
        return {
            "scenarios": {
                name: self._scenario_status(name, status)
                for name, status in sorted(self.status.items())
            },
            "adapters": {
                name: {adapter: slot.in_use for adapter, slot in pool.slots.items()}
                for name, pool in self.pools.items()
            },
            "checkpoints": {
                name: {checkpoint: slot.in_use for checkpoint, slot in pool.slots.items()}
                for name, pool in self.checkpoint_pools.items()
            },
            "in_place": {name: weights.as_dict() for name, weights in self.inplace.items()},
            "adapter_cache": self.adapter_cache.status_json(),
            "flips_total": self.flips_total,
            "failures_total": self.failures_total,
            "canary_failures_total": self.canary_failures_total,
            "verify_failures_total": self.verifications.failures_total,
            "verify_restaged_total": self.verifications.restaged_total,
        }


def _verified_name(serving: ServingRelease) -> str | None:
    """The name ``serving``'s own weights are verified under: its adapter or checkpoint,
    or, for a checkpoint reloaded in place, the model's name."""
    if serving.weights_name is not None:
        return serving.weights_name
    return serving.base_model if serving.checkpoint_digest is not None else None


def _weights_key(serving: ServingRelease) -> str:
    """What an in-place upstream must hold to serve ``serving``: its checkpoint's digest,
    or ``BASE``."""
    return serving.checkpoint_digest or BASE


def _describe(key: str | None) -> str:
    if key is None:
        return "weights it has not confirmed (none reloaded yet, or a reload failed midway)"
    if key == BASE:
        return "the base model"
    return f"checkpoint {key}"
