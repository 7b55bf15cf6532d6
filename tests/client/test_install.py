"""Installing harnesses from a (stand-in) gateway over real loopback HTTP."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from reef.client import (
    HarnessDigestMismatchError,
    HarnessInstallError,
    HarnessUnavailableError,
    ReleaseNotInstalledError,
    current_release,
    install_harness,
    load_installed,
    render_messages,
    rollback_installed,
)
from reef.core.errors import InvalidInputError, UnauthenticatedError
from reef.harness import Bundle, Example, Harness, Skill, UnsafeBundleError, bundle_digest
from tests.client.harness_server import HarnessServer
from tests.harness.archives import harness_entry, tar_entry, tar_gz


def _bundle(prompt: str, files: dict[str, bytes]) -> Bundle:
    harness = Harness(
        schema_version=1,
        system_prompt=prompt,
        instructions=["Be brief."],
        skills=[Skill(name="math", when_to_use="arithmetic sums", content="Show the steps.")],
        examples=[
            Example(
                messages=[
                    {"role": "user", "content": "2+2"},
                    {"role": "assistant", "content": "4"},
                ]
            )
        ],
    )
    return Bundle(harness, files)


V1 = _bundle("You are version one.", {"skills/math.md": b"# math\n"})
V2 = _bundle("You are version two.", {"files/notes.txt": b"notes"})


@pytest.fixture
def server() -> Iterator[HarnessServer]:
    with HarnessServer() as running:
        yield running


def _current_target(root: Path) -> str:
    return os.readlink(root / "current")


def test_install_points_current_at_the_release(server: HarnessServer, tmp_path: Path) -> None:
    digest = server.publish("travel", "rel-1", V1)
    installed = install_harness(server.url, "travel", tmp_path)
    assert (installed.release_id, installed.digest) == ("rel-1", digest)
    assert installed.path == tmp_path / "releases" / "rel-1"
    assert _current_target(tmp_path) == "releases/rel-1"  # relative link
    assert (tmp_path / "current" / "skills" / "math.md").read_bytes() == b"# math\n"
    assert load_installed(tmp_path) == V1.harness
    assert current_release(tmp_path).digest == digest
    assert server.paths == [
        "/reef/scenarios/travel/harness",
        "/reef/scenarios/travel/harness.tar.gz",
    ]


def test_new_release_repoints_and_rollback_returns(server: HarnessServer, tmp_path: Path) -> None:
    server.publish("travel", "rel-1", V1)
    install_harness(server.url, "travel", tmp_path)
    server.publish("travel", "rel-2", V2)
    install_harness(server.url, "travel", tmp_path)
    assert _current_target(tmp_path) == "releases/rel-2"
    assert load_installed(tmp_path).system_prompt == "You are version two."
    assert (tmp_path / "releases" / "rel-1").is_dir()  # kept for rollback

    back = rollback_installed(tmp_path, "rel-1")
    assert back.release_id == "rel-1" and back.digest == bundle_digest(V1)
    assert _current_target(tmp_path) == "releases/rel-1"
    assert load_installed(tmp_path) == V1.harness
    assert sorted(p.name for p in tmp_path.iterdir()) == ["current", "releases"]


def test_reinstalling_the_same_release_is_harmless(server: HarnessServer, tmp_path: Path) -> None:
    server.publish("travel", "rel-1", V1)
    install_harness(server.url, "travel", tmp_path)
    install_harness(server.url, "travel", tmp_path)
    assert sorted(p.name for p in (tmp_path / "releases").iterdir()) == ["rel-1", "rel-1.json"]


def test_digest_mismatch_is_refused_and_current_unchanged(
    server: HarnessServer, tmp_path: Path
) -> None:
    server.publish("travel", "rel-1", V1)
    install_harness(server.url, "travel", tmp_path)
    server.publish("travel", "rel-2", V2, announced_digest=bundle_digest(V1))
    with pytest.raises(HarnessDigestMismatchError, match="the manifest says"):
        install_harness(server.url, "travel", tmp_path)
    assert _current_target(tmp_path) == "releases/rel-1"
    assert sorted(p.name for p in (tmp_path / "releases").iterdir()) == ["rel-1", "rel-1.json"]
    assert load_installed(tmp_path) == V1.harness


def test_unsafe_bundle_is_refused_and_current_unchanged(
    server: HarnessServer, tmp_path: Path
) -> None:
    server.publish("travel", "rel-1", V1)
    install_harness(server.url, "travel", tmp_path)
    evil = tar_gz(harness_entry(), (tar_entry("../../escape"), b"x"))
    server.publish("travel", "rel-2", V2, archive=evil)
    with pytest.raises(UnsafeBundleError, match=r"'\.\./\.\./escape'"):
        install_harness(server.url, "travel", tmp_path)
    assert _current_target(tmp_path) == "releases/rel-1"
    assert not (tmp_path.parent / "escape").exists()


def test_head_moving_between_requests_is_refused(server: HarnessServer, tmp_path: Path) -> None:
    server.publish("travel", "rel-2", V2, archive_release_id="rel-3")
    with pytest.raises(HarnessInstallError, match="the head moved"):
        install_harness(server.url, "travel", tmp_path)
    assert not os.path.lexists(tmp_path / "current")


def test_http_errors(tmp_path: Path) -> None:
    with HarnessServer(api_key="sekrit") as server:
        server.publish("travel", "rel-1", V1)
        with pytest.raises(UnauthenticatedError, match="401"):
            install_harness(server.url, "travel", tmp_path)
        with pytest.raises(HarnessUnavailableError, match="404"):
            install_harness(server.url, "nope", tmp_path, api_key="sekrit")
        assert (
            install_harness(server.url, "travel", tmp_path, api_key="sekrit").release_id == "rel-1"
        )
        url = server.url
    with pytest.raises(HarnessInstallError, match="cannot fetch"):
        install_harness(url, "travel", tmp_path, timeout_seconds=2)
    assert _current_target(tmp_path) == "releases/rel-1"


def test_only_http_urls_are_fetched(tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    (secret / "reef" / "scenarios" / "travel").mkdir(parents=True)
    with pytest.raises(HarnessInstallError, match="only http and https"):
        install_harness(f"file://{secret}", "travel", tmp_path / "install")
    assert not (tmp_path / "install" / "current").exists()


def test_rollback_refusals(server: HarnessServer, tmp_path: Path) -> None:
    server.publish("travel", "rel-1", V1)
    install_harness(server.url, "travel", tmp_path)
    server.publish("travel", "rel-2", V2)
    install_harness(server.url, "travel", tmp_path)
    with pytest.raises(ReleaseNotInstalledError, match="'rel-9' is not installed"):
        rollback_installed(tmp_path, "rel-9")
    with pytest.raises(InvalidInputError, match="not a safe directory name"):
        rollback_installed(tmp_path, "../rel-1")
    (tmp_path / "releases" / "rel-1" / "harness.yaml").write_text(
        "schema_version: 1\nsystem_prompt: tampered\n"
    )
    with pytest.raises(HarnessDigestMismatchError, match="installed as"):
        rollback_installed(tmp_path, "rel-1")
    assert _current_target(tmp_path) == "releases/rel-2"
    server.publish("travel", "rel-1", V1)  # installing again repairs the copy
    install_harness(server.url, "travel", tmp_path)
    assert load_installed(tmp_path) == V1.harness


def test_load_installed_without_install(tmp_path: Path) -> None:
    with pytest.raises(ReleaseNotInstalledError):
        load_installed(tmp_path)


def test_render_messages(server: HarnessServer, tmp_path: Path) -> None:
    server.publish("travel", "rel-1", V1)
    install_harness(server.url, "travel", tmp_path)
    harness = load_installed(tmp_path)
    messages = [
        {"role": "system", "content": "Agent rules."},
        {"role": "user", "content": "What are the sums of these?"},
    ]
    rendered = render_messages(harness, messages)
    assert rendered[0]["content"].startswith("You are version one.\n\n## Rules\n- Be brief.")
    assert "## Skill: math\nShow the steps." in rendered[0]["content"]
    assert rendered[0]["content"].endswith("Agent rules.")
    assert rendered[1:] == [
        {"role": "user", "content": "2+2"},
        {"role": "assistant", "content": "4"},
        messages[1],
    ]
    assert messages[0] == {"role": "system", "content": "Agent rules."}


def test_client_imports_no_server_or_torch() -> None:
    code = (
        "import sys, reef.client\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in {'torch', 'transformers', "
        "'peft'} or m.startswith(('reef.gateway', 'reef.learning', 'reef.engine')))\n"
        "print(','.join(bad))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == ""
