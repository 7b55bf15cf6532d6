"""The gateway's listening socket, bound before anything slow starts.

``reef serve`` binds its port first, so a taken port is reported at once instead of
after the embedded engine has loaded a model, and hands the socket to uvicorn.
"""

from __future__ import annotations

import errno
import ipaddress
import socket

from reef.config import ConfigError

_WHERE = "choose another with --port or server.port in the config (env REEF_SERVER__PORT)"


class PortUnavailableError(ConfigError):
    """The gateway cannot listen on its host and port; the message names the settings."""


def host_port(host: str, port: int) -> str:
    """``host:port``, with an IPv6 address in brackets."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def bind_listener(host: str, port: int) -> socket.socket:
    """A TCP socket bound to ``host:port`` (0: any free port), not yet listening, so
    connections are refused rather than left waiting until the server listens on it.

    Raises ``PortUnavailableError`` naming ``--port``/``server.port`` when the port is
    taken or not ours to bind, and ``--host``/``server.host`` for an unknown address.
    """
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise PortUnavailableError(
            f"cannot listen on {host!r}: {exc.strerror}; set --host or server.host"
        ) from exc
    family, kind, proto, _, address = infos[0]
    sock = socket.socket(family, kind, proto)
    try:
        # As uvicorn does: a port left in TIME_WAIT by a previous run can be bound again.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            reason = "the address is already in use"
        elif exc.errno == errno.EACCES:
            reason = "permission denied (ports below 1024 need privileges)"
        elif exc.errno == errno.EADDRNOTAVAIL:
            raise PortUnavailableError(
                f"cannot listen on {host_port(host, port)}: {host} is not an address of "
                "this machine; set --host or server.host"
            ) from exc
        else:
            reason = exc.strerror or str(exc)
        raise PortUnavailableError(
            f"cannot listen on {host_port(host, port)}: {reason}; {_WHERE}"
        ) from exc
    return sock


def display_base_url(host: str, port: int) -> str:
    """The URL to print for a listener: a wildcard address shows as loopback (the
    address that works from this machine)."""
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return f"http://{host_port(host, port)}"
    if address.is_unspecified:
        address = ipaddress.ip_address("::1" if address.version == 6 else "127.0.0.1")
    return f"http://{host_port(str(address), port)}"
