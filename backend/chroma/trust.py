"""Is the server at `chroma.url` this user's? Checked on the listening socket itself.

Chroma's server has no authentication rem can turn on (1.5.9 ignores its
token settings), so anything that answers the heartbeat on the recorded
port would be trusted with every summary row. Before rem uses the data
dir's own server it checks who owns the socket listening on that port:
`/proc/net/tcp` and `/proc/net/tcp6` list every socket with its owner's uid
(readable by any user, so this works unprivileged), and psutil names the
listening process when this user may see it. A listener of another uid is
refused with one line; so is a port nobody verifiably owns.

Checked once is not enough: the server can die and another process take its
port between two requests. So every new TCP connection a client of the data
dir's server opens is checked too (`verify_connection`), before a byte is
sent on it: the socket at the other end of the connection (the server's
side, listed in the same tables with its owner) must be this user's.
"""

from __future__ import annotations

import ipaddress
import os
import socket
import struct
import sys
import time
from collections.abc import Iterator
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


def _proc_rows(tables: tuple[Path, ...]) -> Iterator[list[str]] | None:
    """The socket rows of /proc/net/tcp*, split in fields; None when no table is readable."""
    found: list[list[str]] = []
    readable = False
    for table in tables:
        try:
            lines = table.read_text().splitlines()[1:]
        except OSError:
            continue
        readable = True
        found += [fields for fields in (line.split() for line in lines) if len(fields) >= 8]
    return iter(found) if readable else None


def _endpoint(field: str) -> tuple[str, int]:
    """(address, port) of a /proc/net/tcp* `address:port` field; IPv4-mapped IPv6 as IPv4."""
    hex_address, _, hex_port = field.partition(":")
    address = ipaddress.ip_address(_address(hex_address))
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return str(address), int(hex_port, 16)


def proc_listeners(port: int, tables: tuple[Path, ...] = PROC_TABLES) -> list[Listener] | None:
    """Every listening socket on `port` from /proc/net/tcp*, or None when the tables are unreadable."""
    rows = _proc_rows(tables)
    if rows is None:
        return None
    found: list[Listener] = []
    for fields in rows:
        if fields[3] != LISTEN:
            continue
        hex_address, _, hex_port = fields[1].partition(":")
        if int(hex_port, 16) == port:
            found.append(Listener(_address(hex_address), port, int(fields[7])))
    return found


def held_by(port: int, pid: int, tables: tuple[Path, ...] = PROC_TABLES) -> bool | None:
    """Whether the socket listening on `port` is one of process `pid`'s (None: cannot be seen).

    The listening rows of /proc/net/tcp* name their socket's inode; the process holds
    it as an open `socket:[inode]`. No listener: False.
    """
    rows = _proc_rows(tables)
    if rows is None:
        return None
    inodes = {
        f"socket:[{fields[9]}]"
        for fields in rows
        if len(fields) > 9 and fields[3] == LISTEN and int(fields[1].partition(":")[2], 16) == port
    }
    return _holds_any(pid, inodes) if inodes else False


def _holds_any(pid: int, inodes: set[str]) -> bool | None:
    """Whether process `pid` has one of `inodes` (`socket:[N]`) open (None: its fds cannot be read)."""
    try:
        names = list(Path(f"/proc/{pid}/fd").iterdir())
    except OSError:
        return None
    for name in names:
        try:
            if os.readlink(name) in inodes:
                return True
        except OSError:
            continue
    return False


# sock_diag (netlink): the kernel's own lookup of one socket by its addresses, as `ss` does it
NETLINK_SOCK_DIAG = 4
SOCK_DIAG_BY_FAMILY = 20
NLM_F_REQUEST = 1
NLMSG_ERROR = 2
NO_COOKIE = 0xFFFFFFFF
# nlmsghdr (16) + family, state, timer, retrans (4) + sockid (48) + expires, rqueue, wqueue (12)
DIAG_UID_OFFSET = 80


def _diag_address(family: int, host: str) -> bytes:
    raw = ipaddress.ip_address(host).packed
    if family == socket.AF_INET6 and len(raw) == 4:
        raw = ipaddress.IPv6Address(b"\0" * 10 + b"\xff\xff" + raw).packed
    return raw.ljust(16, b"\0")


def _diag_message(family: int, local: tuple[str, int], remote: tuple[str, int]) -> bytes:
    """The netlink message asking sock_diag for the TCP socket between `local` and `remote`."""
    sockid = (
        struct.pack("!HH", local[1], remote[1])
        + _diag_address(family, local[0])
        + _diag_address(family, remote[0])
        + struct.pack("=III", 0, NO_COOKIE, NO_COOKIE)
    )
    request = struct.pack("=BBBBI", family, socket.IPPROTO_TCP, 0, 0, 0xFFFFFFFF) + sockid
    return struct.pack("=IHHII", 16 + len(request), SOCK_DIAG_BY_FAMILY, NLM_F_REQUEST, 1, 0) + request


def diag_uid(family: int, local: tuple[str, int], remote: tuple[str, int]) -> int | None:
    """The uid owning the TCP socket that holds `local` and talks to `remote` (None: not found).

    One exact sock_diag request (tens of microseconds, where reading /proc/net/tcp*
    walks every socket of the host: milliseconds). The kernel answers with the socket a
    packet from `remote` to `local` would reach: the connection's own end, or the
    listener on `local` itself when no connection matches.
    """
    try:
        with socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, NETLINK_SOCK_DIAG) as link:
            link.settimeout(1.0)
            link.sendto(_diag_message(family, local, remote), (0, 0))
            reply = link.recv(65536)
    except (OSError, AttributeError):  # no netlink here (not Linux, or a sandbox): /proc decides
        return None
    if len(reply) < DIAG_UID_OFFSET + 4 or struct.unpack_from("=H", reply, 4)[0] == NLMSG_ERROR:
        return None
    return int(struct.unpack_from("=I", reply, DIAG_UID_OFFSET)[0])


def peer_uid(sock: socket.socket, tables: tuple[Path, ...] = PROC_TABLES) -> int | None:
    """The uid owning the other end of a TCP connection to a socket of this host, or None if unseen.

    Asked of the kernel (`diag_uid`), else read from /proc/net/tcp*: the row whose local
    address is this socket's peer and whose remote address is this socket. Its uid is the
    listener's from the moment the handshake completes (before the server accepts it).
    """
    try:
        mine = _plain(sock.getsockname())
        theirs = _plain(sock.getpeername())
    except OSError:
        return None
    for family in (socket.AF_INET, socket.AF_INET6) if ":" not in theirs[0] else (socket.AF_INET6,):
        uid = diag_uid(family, theirs, mine)
        if uid is not None:
            return uid
    rows = _proc_rows(tables)
    for fields in rows or ():
        if fields[3] != LISTEN and _endpoint(fields[1]) == theirs and _endpoint(fields[2]) == mine:
            return int(fields[7])
    return None


def _plain(address: tuple[object, ...]) -> tuple[str, int]:
    host = ipaddress.ip_address(str(address[0]).split("%")[0])
    if isinstance(host, ipaddress.IPv6Address) and host.ipv4_mapped is not None:
        host = host.ipv4_mapped
    return str(host), int(str(address[1]))


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


def _loopback_port(url: str, source: str) -> tuple[str, int]:
    parsed = urlparse(url)
    host, port = parsed.hostname or "", parsed.port
    try:
        loopback = ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = False
    if not loopback or port is None:
        raise ChromaUntrusted(
            f"{source} names {url}, not a loopback address and port; rem records only its own "
            "loopback server there: remove the file and run `rem up`",
            url=url,
        )
    return host, port


def refuse_stranger(url: str, port: int, strangers: list[int], source: str) -> ChromaUntrusted:
    """The one-line refusal of a socket of another uid, naming who it is."""
    me = os.geteuid()
    who = ", ".join(f"{user_name(uid)} (uid {uid})" for uid in strangers)
    pids = listener_pids(port)
    shown = f", pid {', '.join(map(str, pids))}" if pids else ""
    return ChromaUntrusted(
        f"refusing the Chroma server at {url} ({source}): the socket on port {port} belongs to "
        f"{who}{shown}, not to you ({user_name(me)}, uid {me}); stop that process, "
        "then run `rem up` (it starts a server of your own)",
        url=url,
        uids=tuple(strangers),
        pids=tuple(pids),
    )


def _reaching_listeners(url: str, host: str, found: list[Listener] | None, source: str) -> list[Listener]:
    """The listeners `found` that a connection to `host` reaches; ChromaUntrusted when none can be seen."""
    if found is None:
        raise ChromaUntrusted(
            f"cannot verify who listens on {url} (no /proc/net/tcp, and psutil may not see it); "
            "rem will not trust it: pass --chroma-url to use it knowingly",
            url=url,
        )
    reaching = [listener for listener in found if _reaches(listener, host)]
    if not reaching:
        raise ChromaUntrusted(
            f"no socket this host can see listens on {url} ({source}), yet something answers there "
            "(another network namespace?); rem will not trust it: pass --chroma-url to use it knowingly",
            url=url,
        )
    return reaching


def check_listener(url: str, *, source: str = "chroma.url", absent_ok: bool = False) -> bool:
    """Refuse `url` unless the socket listening on its loopback port belongs to this user (uid).

    `absent_ok`: nothing listening at all is not refused but answered False (the server is
    down, which the caller reports in its own words); True otherwise.
    """
    host, port = _loopback_port(url, source)
    found = proc_listeners(port)
    if found is None:
        found = psutil_listeners(port)
    if absent_ok and found == []:
        return False
    reaching = _reaching_listeners(url, host, found, source)
    strangers = sorted({listener.uid for listener in reaching if listener.uid != os.geteuid()})
    if strangers:
        raise refuse_stranger(url, port, strangers, source)
    return True


# the server's end of a loopback connection is listed once the handshake is done, which on
# loopback is as good as at once: looked for again after these pauses before falling back
PEER_PAUSES = (0.0, 0.001, 0.005, 0.02)


def verify_connection(sock: socket.socket, url: str, *, source: str = "chroma.url") -> None:
    """Refuse a new connection to `url` whose other end is not this user's (nothing sent on it yet).

    Falls back to the listening socket's owner when the connection's other end
    is not listed (no /proc), as `check_listener` does.
    """
    _, port = _loopback_port(url, source)
    for pause in PEER_PAUSES:
        time.sleep(pause)
        uid = peer_uid(sock)
        if uid is not None:
            if uid != os.geteuid():
                raise refuse_stranger(url, port, [uid], source)
            return
    check_listener(url, source=source)
