"""Who may pin what with ``x-reef-release``: inference keys pin their scenario's releases
only; candidates serve the gate's key while the gate or a canary decides them and admin
keys always (as ``eval`` once nobody decides them); a candidate's harness downloads are
the admin's alone (``reef.gateway.serving.pins``). Real gateway, official OpenAI SDK."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import openai
import pytest

from reef.harness import Bundle, Harness, pack_bundle
from reef.releases import Candidate, Release, ReleaseChain, open_artifact_store
from tests.gateway.harness import GatewayThread
from tests.gateway.rawhttp import call

KEYS = [
    {"id": "app", "key": "sk-app", "role": "inference", "scenarios": ["support"]},
    {"id": "billing-app", "key": "sk-billing", "role": "inference", "scenarios": ["billing"]},
    {"id": "gate", "key": "sk-gate", "role": "inference"},
    {"id": "ops", "key": "sk-ops", "role": "admin"},
]


@dataclass
class World:
    gateway: GatewayThread
    chain: ReleaseChain
    first: Release  # support's first release, no longer the head
    head: Release  # support's head
    billing: Release  # billing's head

    def candidate(self, prompt: str, state: str | None = None) -> Candidate:
        """A support candidate with a harness of its own, moved to ``state``."""
        artifacts = open_artifact_store(self.gateway.settings.artifacts_url())
        bundle = Bundle(harness=Harness(schema_version=1, system_prompt=prompt), files={})
        manifest = self.head.manifest.model_copy(
            update={"harness": artifacts.put_bytes(pack_bundle(bundle), "harness")}
        )
        made = self.chain.propose("support", manifest, self.head.id, "test", "pin me")
        path = {
            "evaluating": ["evaluating"],
            "rejected": ["evaluating", "rejected"],
            "abandoned": ["abandoned"],
        }
        for step in path.get(state or "", []):
            made = self.chain.set_candidate_state(made.id, step)  # type: ignore[arg-type]
        return made


def ask(world: World, key: str, pin: str, **headers: str) -> tuple[str, str]:
    """A pinned chat completion by ``key``: (release that served it, record purpose)."""
    client = world.gateway.openai(key, **{"x-reef-release": pin, **headers})
    raw = client.chat.completions.with_raw_response.create(
        model="reef/support", messages=[{"role": "user", "content": "hello"}]
    )
    record = world.gateway.store.get_record(raw.headers["x-reef-record-id"])
    assert record.release_id == raw.headers["x-reef-release-id"]
    return raw.headers["x-reef-release-id"], record.purpose


@pytest.fixture
def world(make_gateway: Callable[..., GatewayThread]) -> World:
    gateway = make_gateway(
        auth={"keys": KEYS},
        evaluation={"api_key": "sk-gate"},
        scenarios={"support": {"upstream": "fake"}, "billing": {"upstream": "fake"}},
    )
    for key, scenario in (("sk-app", "support"), ("sk-billing", "billing")):
        gateway.openai(key).chat.completions.create(
            model=f"reef/{scenario}", messages=[{"role": "user", "content": "create"}]
        )
    chain = ReleaseChain(gateway.database)
    first, billing = chain.head("support"), chain.head("billing")
    assert first is not None and billing is not None
    again = chain.propose("support", first.manifest, first.id, "test", "a second release")
    head = chain.publish(again.id, first.id, "test", "setup", require_passed=False)
    return World(gateway, chain, first, head, billing)


def test_an_inference_key_pins_a_release_on_its_scenarios_chain(world: World) -> None:
    # an older release of the chain, not the head: served, recorded as asked
    assert ask(world, "sk-app", world.first.id) == (world.first.id, "serve")
    assert ask(world, "sk-app", world.first.id, **{"x-reef-purpose": "eval"}) == (
        world.first.id,
        "eval",
    )


def test_another_scenarios_release_is_refused_like_a_missing_one(world: World) -> None:
    with pytest.raises(openai.NotFoundError) as foreign:
        ask(world, "sk-app", world.billing.id)
    with pytest.raises(openai.NotFoundError) as missing:
        ask(world, "sk-app", "01a2-no-such-release")
    message = foreign.value.message
    assert f"no release or candidate {world.billing.id!r} on the chain of scenario 'support'" in (
        message
    )
    assert message == missing.value.message.replace("01a2-no-such-release", world.billing.id)
    assert "billing" not in message  # nothing about the scenario that owns it
    # the unlimited admin is told whose it is
    with pytest.raises(openai.BadRequestError) as admin:
        ask(world, "sk-ops", world.billing.id)
    assert "belongs to scenario 'billing'" in admin.value.message


def test_a_rejected_candidate_serves_an_admin_only_and_as_eval(world: World) -> None:
    rejected = world.candidate("rejected harness", "rejected")
    before = len(list(world.gateway.store.iter_export("support")))
    with pytest.raises(openai.PermissionDeniedError) as refused:
        ask(world, "sk-app", rejected.id)
    assert "is a candidate of scenario 'support', not a release" in refused.value.message
    assert "key 'app' may pin the scenario's releases" in refused.value.message
    with pytest.raises(openai.PermissionDeniedError) as gate:
        ask(world, "sk-gate", rejected.id)
    assert "is rejected" in gate.value.message
    assert len(list(world.gateway.store.iter_export("support"))) == before  # nothing served
    # an admin is served, and the record is eval whatever the request asked
    assert ask(world, "sk-ops", rejected.id) == (rejected.id, "eval")
    assert ask(world, "sk-ops", rejected.id, **{"x-reef-purpose": "serve"}) == (rejected.id, "eval")
    abandoned = world.candidate("abandoned harness", "abandoned")
    assert ask(world, "sk-ops", abandoned.id) == (abandoned.id, "eval")


def test_the_gates_key_pins_a_candidate_only_while_it_is_evaluated(world: World) -> None:
    candidate = world.candidate("under evaluation", "evaluating")
    with pytest.raises(openai.PermissionDeniedError):
        ask(world, "sk-app", candidate.id)
    evaluated = ask(world, "sk-gate", candidate.id, **{"x-reef-purpose": "eval"})
    assert evaluated == (candidate.id, "eval")
    assert ask(world, "sk-ops", candidate.id) == (candidate.id, "serve")
    # the state is read on every pin: once rejected, the staged candidate serves no gate
    world.chain.set_candidate_state(candidate.id, "rejected")
    with pytest.raises(openai.PermissionDeniedError):
        ask(world, "sk-gate", candidate.id, **{"x-reef-purpose": "eval"})
    assert ask(world, "sk-ops", candidate.id) == (candidate.id, "eval")


def test_another_scenarios_candidate_looks_missing(world: World) -> None:
    candidate = world.candidate("support only", "evaluating")
    with pytest.raises(openai.NotFoundError) as info:
        world.gateway.openai(
            "sk-billing", **{"x-reef-release": candidate.id}
        ).chat.completions.create(
            model="reef/billing", messages=[{"role": "user", "content": "hello"}]
        )
    assert "no release or candidate" in info.value.message and "support" not in info.value.message


@pytest.mark.parametrize("route", ["harness", "harness.tar.gz"])
def test_a_candidates_harness_downloads_are_admin_only(world: World, route: str) -> None:
    candidate = world.candidate("secret candidate prompt", "evaluating")
    path = f"/reef/scenarios/support/{route}?release={candidate.id}"
    for key in ("sk-app", "sk-gate"):
        refused = call(world.gateway.port, "GET", path, headers={"authorization": f"Bearer {key}"})
        assert refused.status == 403, refused.body
        assert b"secret candidate prompt" not in refused.body
    admin = call(world.gateway.port, "GET", path, headers={"authorization": "Bearer sk-ops"})
    assert admin.status == 200 and admin.headers["x-reef-release-id"] == candidate.id
    if route == "harness":
        assert admin.json()["harness"]["system_prompt"] == "secret candidate prompt"
    # a release's harness stays the inference key's to download
    release = world.candidate("released prompt")
    published = world.chain.publish(
        release.id, world.head.id, "test", "release it", require_passed=False
    )
    path = f"/reef/scenarios/support/{route}?release={published.id}"
    ok = call(world.gateway.port, "GET", path, headers={"authorization": "Bearer sk-app"})
    assert ok.status == 200 and ok.headers["x-reef-release-id"] == published.id
