"""A request holds its adapter in use until its response is done, however it ends: read
to the end, not streamed, or a stream whose client left before its first byte (the
adapter's in-use count in /reef/status returns to 0, so the pool may unload it again).

The client that leaves is played on two kinds of server: uvicorn as it is (ASGI 2.3: a
send to a closed connection is dropped, and Starlette cancels the body once it sees the
disconnect), and uvicorn made an ASGI 2.4 server (a send to a closed connection raises
``OSError``, so Starlette stops before it asks the body for a single byte).
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import pytest

from reef.experience import RecordFilter
from reef.releases import ModelComponent, ReleaseChain, ReleaseManifest, open_artifact_store
from tests.fakes.upstream import FakeUpstreamThread
from tests.gateway.harness import GatewayThread, make_settings
from tests.gateway.rawhttp import call, holds_connection, send_unread
from tests.gateway.sdk_calls import turn
from tests.polling import eventually

NEVER_READ = (
    b'{"model": "reef/s", "stream": true, '
    b'"messages": [{"role": "user", "content": "hold-answer nobody reads this"}]}'
)


def _adapter(tmp_path: Path) -> Path:
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text("{}")
    (adapter / "adapter_model.safetensors").write_bytes(b"the fake upstream never reads it")
    return adapter


def _in_use(gateway: GatewayThread) -> dict[str, int]:
    adapters: dict[str, int] = call(gateway.port, "GET", "/reef/status").json()["adapters"]["fake"]
    return adapters


@pytest.mark.parametrize("spec", ["2.3", "2.4"])
def test_a_stream_never_read_releases_its_adapter(
    tmp_path: Path, spec: Literal["2.3", "2.4"]
) -> None:
    with FakeUpstreamThread(adapters=True) as fake:
        settings = make_settings(
            tmp_path,
            fake.base_url,
            scenarios={"s": {"upstream": "fake"}},
            activation={"poll_interval_seconds": 0.1},
        )
        with GatewayThread(settings, asgi_spec=spec) as gateway:
            client = gateway.openai()
            headers = {"x-reef-scenario": "s"}
            old = turn(client, "before", stream=False, headers=headers).release
            assert old is not None
            chain = ReleaseChain(gateway.database)
            digest = open_artifact_store(settings.artifacts_url()).put_dir(
                _adapter(tmp_path), "adapter"
            )
            manifest = ReleaseManifest(model=ModelComponent(base="fake-model", adapter=digest))
            candidate = chain.propose("s", manifest, old, "test", "an adapter")
            new = chain.publish(candidate.id, old, "test", "an adapter", require_passed=False)
            eventually(
                lambda: (
                    call(gateway.port, "GET", "/reef/status").json()["scenarios"]["s"][
                        "serving_release_id"
                    ]
                    == new.id
                ),
                "the adapter release serving",
            )
            (name,) = fake.adapters
            assert _in_use(gateway) == {name: 0}

            for stream in (False, True):  # answered and read: back to 0
                reply = turn(client, "on the adapter", stream=stream, headers=headers)
                assert reply.status == 200 and reply.release == new.id
                assert fake.last_request_body["model"] == name
                assert _in_use(gateway) == {name: 0}

            # a client that leaves while the upstream prepares its stream: the
            # response comes after it has gone, and its body is never read
            sock = send_unread(gateway.port, "/v1/chat/completions", NEVER_READ, headers)
            eventually(lambda: fake.held == 1, "the stream at the upstream")
            assert _in_use(gateway) == {name: 1}
            client_port = sock.getsockname()[1]
            sock.close()
            eventually(
                lambda: not holds_connection(gateway.server, client_port),
                "the gateway to see the client go",
            )
            fake.release_held()
            eventually(lambda: _in_use(gateway) == {name: 0}, "the lease released")

            def outcome() -> list[tuple[str, str | None]]:
                records = gateway.store.list_records("s", RecordFilter(), None, 50).records
                left = [r for r in records if "nobody reads" in str(r.request["messages"])]
                return [(r.status, r.error) for r in left]

            # A stream's record is stored as pending first; its outcome follows.
            eventually(
                lambda: [status for status, _ in outcome()] not in ([], ["pending"]),
                "the exchange's outcome recorded",
            )
            if spec == "2.4":
                assert outcome() == [("aborted", "client disconnected before the first byte")]
            else:  # Starlette may have relayed some or all of it before it saw the client go
                assert outcome()[0][0] in ("ok", "aborted")
