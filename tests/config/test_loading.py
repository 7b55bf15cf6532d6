from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from reef.config import ConfigError, load_settings, masked_dump


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "reef.yaml"
    path.write_text(text)
    return path


def test_defaults_are_embedded_and_offline(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.chdir(tmp_path)
    settings = load_settings()
    assert settings.store_url() == "sqlite:///.reef/reef.db"
    assert settings.upstreams["local"].type == "local"
    assert settings.bind_host() == "127.0.0.1"
    assert settings.store.durability == "sync"


def test_yaml_then_env_override(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "server: {port: 9000}\n"
        "upstreams:\n  vllm: {type: openai, base_url: 'http://127.0.0.1:8000/v1', model: m}\n",
    )
    monkeypatch.setenv("REEF_SERVER__PORT", "9100")
    monkeypatch.setenv("REEF_STORE__DURABILITY", "async")
    settings = load_settings(path)
    assert settings.server.port == 9100
    assert settings.store.durability == "async"
    assert settings.upstreams["vllm"].model == "m"  # env on a sibling keeps the YAML


def test_unknown_key_names_it_and_the_allowed_ones(tmp_path: Path) -> None:
    path = write(tmp_path, "server: {prot: 1}\n")
    with pytest.raises(ConfigError) as info:
        load_settings(path)
    message = str(info.value)
    assert "unknown key 'server.prot'" in message
    assert "host, max_body_bytes, port" in message.replace("access_log, ", "")


def test_unknown_top_level_and_nested_upstream_keys(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="unknown key 'colour'"):
        load_settings(write(tmp_path, "colour: blue\n"))
    path = write(tmp_path, "upstreams:\n  a: {type: openai, base_url: x, timeout: 3}\n")
    with pytest.raises(ConfigError) as info:
        load_settings(path)
    assert "unknown key 'upstreams.a.timeout'" in str(info.value)
    assert "read_timeout_seconds" in str(info.value)


def test_bad_values_and_references(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="needs base_url"):
        load_settings(write(tmp_path, "upstreams:\n  a: {type: openai}\n"))
    with pytest.raises(ConfigError, match="names upstream 'nope'"):
        load_settings(write(tmp_path, "scenarios:\n  s: {upstream: nope}\n"))
    with pytest.raises(ConfigError, match="claimed by scenarios 'a' and 'b'"):
        twice = "scenarios:\n  a: {model_aliases: [bot]}\n  b: {model_aliases: [bot]}\n"
        load_settings(write(tmp_path, twice))
    with pytest.raises(ConfigError, match="without '/'"):
        load_settings(write(tmp_path, "scenarios:\n  a: {model_aliases: [reef/a]}\n"))
    with pytest.raises(ConfigError, match="not a regex"):
        load_settings(write(tmp_path, "capture: {redact_patterns: ['(']}\n"))
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_settings(write(tmp_path, "server: [\n"))
    with pytest.raises(ConfigError, match="does not exist"):
        load_settings(tmp_path / "missing.yaml")


def test_keys_are_hashed_and_secrets_masked(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "auth:\n  keys:\n    - {id: app, key: sk-very-secret}\n"
        "upstreams:\n  u: {type: openai, base_url: 'http://h/v1', api_key: upstream-secret}\n"
        "store: {url: 'postgresql://reef:dbpass@db:5432/reef'}\n",
    )
    settings = load_settings(path)
    key = settings.auth.keys[0]
    assert key.key is None
    assert key.sha256 == hashlib.sha256(b"sk-very-secret").hexdigest()
    assert settings.bind_host() == "0.0.0.0"
    dumped = str(masked_dump(settings))
    for secret in ("sk-very-secret", "upstream-secret", "dbpass", key.sha256):
        assert secret not in dumped
    assert "postgresql://reef:**********@db:5432/reef" in dumped
