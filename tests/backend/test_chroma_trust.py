"""Who listens on chroma.url's port: /proc/net/tcp* parsing and the same-uid rule."""

from __future__ import annotations

import os
import socket
import sys
from pathlib import Path

import pytest

from backend.chroma import trust
from backend.core.errors import ChromaUntrusted

HEADER = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"


def _line(address: str, port: int, state: str, uid: int) -> str:
    return f"   0: {address}:{port:04X} 00000000:0000 {state} 00000000:00000000 00:00000000 00000000 {uid:5d} 0 1 1\n"


@pytest.mark.skipif(
    sys.byteorder != "little", reason="the sample table is what a little-endian kernel prints"
)
def test_listeners_are_read_from_the_proc_tables(tmp_path: Path) -> None:
    tcp = tmp_path / "tcp"
    tcp.write_text(
        HEADER
        + _line("0100007F", 8000, "0A", 1000)  # 127.0.0.1:8000 LISTEN, uid 1000
        + _line("0100007F", 8000, "01", 0)  # an established connection: not a listener
        + _line("00000000", 9000, "0A", 0)  # 0.0.0.0:9000
    )
    tcp6 = tmp_path / "tcp6"
    tcp6.write_text(HEADER + _line("00000000000000000000000001000000", 8000, "0A", 65534))  # [::1]:8000
    found = trust.proc_listeners(8000, (tcp, tcp6))
    assert found == [
        trust.Listener("127.0.0.1", 8000, 1000),
        trust.Listener("::1", 8000, 65534),
    ]
    assert trust.proc_listeners(9000, (tcp, tcp6)) == [trust.Listener("0.0.0.0", 9000, 0)]
    assert trust.proc_listeners(8000, (tmp_path / "none",)) is None


def test_a_listener_of_this_user_is_trusted_and_the_tables_agree_with_psutil() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        trust.check_listener(f"http://127.0.0.1:{port}")  # no exception: it is ours
        (listener,) = trust.proc_listeners(port) or []
        assert (listener.address, listener.uid) == ("127.0.0.1", os.geteuid())
        assert trust.psutil_listeners(port) == [listener]
        assert os.getpid() in trust.listener_pids(port)


def test_nothing_verifiable_or_not_loopback_is_refused() -> None:
    with pytest.raises(ChromaUntrusted, match="not a loopback address"):
        trust.check_listener("http://10.1.2.3:8000")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # bound, not listening: nobody answers there
    with pytest.raises(ChromaUntrusted, match="no socket this host can see"):
        trust.check_listener(f"http://127.0.0.1:{port}")
