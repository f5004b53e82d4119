"""Where `rem serve` listens: `HOST:PORT`, loopback unless the operator says otherwise.

Apart from the server (no uvicorn, no FastAPI) so `rem up --serve` checks its address at once,
before any child starts, without loading them.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

from backend.core.errors import BadInput

DEFAULT_LISTEN = "127.0.0.1:8765"


@dataclass(frozen=True)
class Listen:
    """Where the server listens: a host (an address) and a port (0: any free one)."""

    host: str
    port: int

    @property
    def loopback(self) -> bool:
        try:
            return ipaddress.ip_address(self.host).is_loopback
        except ValueError:
            return self.host == "localhost"

    def url(self, port: int | None = None) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port if port is None else port}"


def parse_listen(value: str, *, allow_remote: bool = False) -> Listen:
    """`HOST:PORT` (`[::1]:PORT` for IPv6); a non-loopback host only with `allow_remote`."""
    host, sep, port = value.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise BadInput(f"--listen {value[:80]!r} is not HOST:PORT (e.g. 127.0.0.1:8765)")
    listen = Listen(host, int(port))
    if not listen.loopback and not allow_remote:
        raise BadInput(
            f"--listen {value[:80]} is not a loopback address: rem serves plain HTTP; put it behind a "
            "TLS-terminating proxy and pass --allow-remote to listen there"
        )
    return listen
