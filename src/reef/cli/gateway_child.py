"""One gateway process of several, as ``reef serve --workers N`` starts it
(``python -m reef.cli.gateway_child``): it reads its start message (settings, the
descriptor of the channel its connections come on, its index) from the parent on
stdin, serves the connections the parent accepts and sends it with the gateway of
``reef.cli.serving``, and says it is ready on a pipe. The supervisor that starts and
restarts these is ``reef.cli.gateway_workers``, which imports neither this
module nor ``reef.cli.serving``.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import sys

from reef.config import ReefSettings
from reef.core.errors import ReefError

log = logging.getLogger("reef.serve")


def child_main() -> None:
    """Serve as one gateway process of several, until the parent stops it."""
    start = json.loads(sys.stdin.buffer.read())  # from our parent, on a pipe
    from reef.engine.process import exit_with_parent

    exit_with_parent(int(start["parent_pid"]))  # SIGTERM, so a lost parent still drains us
    index = int(start["index"])
    logging.basicConfig(
        level=str(start["log_level"]),
        format=f"%(asctime)s %(levelname)s %(name)s[{index}]: %(message)s",
        stream=sys.stderr,
    )
    logging.getLogger("alembic").setLevel(logging.WARNING)
    from reef.cli.serving import serve_gateway_process

    settings = ReefSettings.model_validate_json(start["settings"])
    connections = socket.socket(fileno=int(start["connections_fd"]))
    ready = os.fdopen(int(start["ready_fd"]), "wb", buffering=0)

    def said_ready() -> None:
        ready.write(b"R")
        ready.close()

    try:
        serve_gateway_process(settings, connections, said_ready, index)
    except KeyboardInterrupt:
        raise SystemExit(130) from None
    except ReefError as exc:
        log.error("%s", exc)
        raise SystemExit(1) from exc


if __name__ == "__main__":
    child_main()
