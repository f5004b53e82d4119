"""Is the server at `chroma.url` this user's? Checked on the listening socket itself.

Chroma's server has no authentication rem can turn on (1.5.9 ignores its
token settings), so anything that answers the heartbeat on the recorded
port would be trusted with every summary row. Before rem uses the data
dir's own server it checks who owns the socket listening on that port:
`/proc/net/tcp` and `/proc/net/tcp6` list every socket with its owner's uid
(readable by any user, so this works unprivileged), and psutil names the
listening process when this user may see it. A listener of another uid is
refused with one line; so is a port nobody verifiably owns.
"""

from __future__ import annotations

import ipaddress
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

import psutil

from backend.core.errors import ChromaUntrusted
from backend.core.private import user_name

PROC_TABLES = (Path("/proc/net/tcp"), Path("/proc/net/tcp6"))
LISTEN = "0A"


@dataclass(frozen=True)
class Listener:
    """A listening TCP socket: where it listens and the uid that owns it."""

    address: str
    port: int
    uid: int


def _address(hex_address: str) -> str:
    """The text form of a /proc/net/tcp* address (host byte order words, little-endian here)."""
    raw = bytes.fromhex(hex_address)
    if sys.byteorder == "little":  # each 32-bit word is printed in host order: back to network order
        raw = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
    return str(ipaddress.ip_address(raw))


def proc_listeners(port: int, tables: tuple[Path, ...] = PROC_TABLES) -> list[Listener] | None:
    """Every listening socket on `port` from /proc/net/tcp*, or None when the tables are unreadable."""
    found: list[Listener] = []
    readable = False
    for table in tables:
        try:
            lines = table.read_text().splitlines()[1:]
        except OSError:
            continue
        readable = True
        for line in lines:
            fields = line.split()
            if len(fields) < 8 or fields[3] != LISTEN:
                continue
            hex_address, _, hex_port = fields[1].partition(":")
            if int(hex_port, 16) == port:
                found.append(Listener(_address(hex_address), port, int(fields[7])))
    return found if readable else None


def psutil_listeners(port: int) -> list[Listener] | None:
    """The same from psutil (a process's uid), for systems without /proc/net; None if not allowed."""
    try:
        connections = psutil.net_connections(kind="tcp")
    except (psutil.Error, OSError):
        return None
    found = []
    for conn in connections:
        if conn.status != psutil.CONN_LISTEN or not conn.laddr or conn.laddr.port != port:
            continue
        if conn.pid is None:
            return None  # a listener whose owner this user may not see: unverifiable
        try:
            uid = psutil.Process(conn.pid).uids().effective
        except psutil.Error:
            return None
        found.append(Listener(conn.laddr.ip, port, uid))
    return found


def listener_pids(port: int) -> list[int]:
    """The pids listening on `port` that this user may see (for messages; may be empty)."""
    try:
        return sorted(
            {
                c.pid
                for c in psutil.net_connections(kind="tcp")
                if c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port and c.pid
            }
        )
    except (psutil.Error, OSError):
        return []


def _reaches(listener: Listener, host: str) -> bool:
    """Would a connection to `host` on the port land on this socket (its address, or a wildcard)?"""
    address = ipaddress.ip_address(listener.address)
    if address.is_unspecified:
        return True
    target = ipaddress.ip_address(host)
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return address == target


def check_listener(url: str, *, source: str = "chroma.url") -> None:
    """Refuse `url` unless the socket listening on its loopback port belongs to this user (uid)."""
    parsed = urlparse(url)
    host, port = parsed.hostname or "", parsed.port
    try:
        loopback = ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = False
    if not loopback or port is None:
        raise ChromaUntrusted(
            f"{source} names {url}, not a loopback address and port; rem records only its own "
            "loopback server there: remove the file and run `rem up`"
        )
    found = proc_listeners(port)
    if found is None:
        found = psutil_listeners(port)
    me = os.geteuid()
    if found is None:
        raise ChromaUntrusted(
            f"cannot verify who listens on {url} (no /proc/net/tcp, and psutil may not see it); "
            "rem will not trust it: pass --chroma-url to use it knowingly"
        )
    reaching = [listener for listener in found if _reaches(listener, host)]
    if not reaching:
        raise ChromaUntrusted(
            f"no socket this host can see listens on {url} ({source}), yet something answers there "
            "(another network namespace?); rem will not trust it: pass --chroma-url to use it knowingly"
        )
    strangers = sorted({listener.uid for listener in reaching if listener.uid != me})
    if strangers:
        who = ", ".join(f"{user_name(uid)} (uid {uid})" for uid in strangers)
        pids = listener_pids(port)
        shown = f", pid {', '.join(map(str, pids))}" if pids else ""
        raise ChromaUntrusted(
            f"refusing the Chroma server at {url} ({source}): the socket on port {port} belongs to "
            f"{who}{shown}, not to you ({user_name(me)}, uid {me}); stop that process, "
            "then run `rem up` (it starts a server of your own)"
        )
