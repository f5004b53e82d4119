"""Who listens on chroma.url's port: /proc/net/tcp* parsing and the same-uid rule."""

from __future__ import annotations

import http.server
import json
import os
import socket
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import ClassVar

import pytest

from backend.chroma import trust
from backend.chroma.collection import ChromaStore
from backend.chroma.server import DataDirTrust
from backend.core.datadir import DataDir
from backend.core.errors import ChromaBadReply, ChromaUnreachable, ChromaUntrusted

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


COLLECTION_ID = "7d2c3f5e-1a2b-4c3d-8e9f-0a1b2c3d4e5f"
# what a Chroma 1.5.9 server answers while chromadb connects and opens a collection; anything else
# gets `{}`, the reply that made Dream crash with `KeyError: 'ids'`
PLAUSIBLE = {
    "/auth/identity": {"user_id": "", "tenant": "default_tenant", "databases": ["default_database"]},
    "/tenants/default_tenant": {"name": "default_tenant"},
    "/databases/default_database": {
        "id": "00000000-0000-0000-0000-000000000001",
        "name": "default_database",
        "tenant": "default_tenant",
    },
    "/collections": {
        "id": COLLECTION_ID,
        "name": "rem_x",
        "metadata": {"rem:embedder": "x", "rem:dim": 2},
        "configuration_json": {},
        "dimension": None,
        "tenant": "default_tenant",
        "database": "default_database",
        "version": 0,
        "log_position": 0,
    },
    "/count": 0,
}


class _Recorder(http.server.BaseHTTPRequestHandler):
    """Answers like a Chroma up to opening a collection, then `{}`; records every request."""

    seen: ClassVar[list[str]] = []
    plausible: ClassVar[bool] = False

    def _any(self) -> None:
        self.seen.append(f"{self.command} {self.path}")
        path = self.path.split("?")[0]
        answer = next((v for k, v in PLAUSIBLE.items() if path.endswith(k)), {}) if self.plausible else {}
        body = json.dumps(answer).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = do_PUT = do_DELETE = _any

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def not_chroma() -> Iterator[tuple[str, list[str]]]:
    """An HTTP server of this user on a loopback port that is not Chroma: its URL and what it was sent."""
    _Recorder.seen, _Recorder.plausible = [], False
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Recorder)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", _Recorder.seen
    finally:
        server.shutdown()
        server.server_close()


def test_the_other_end_of_a_connection_is_seen_with_its_owner() -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        with socket.create_connection(("127.0.0.1", port)) as conn:
            mine, theirs = conn.getsockname(), conn.getpeername()
            assert trust.diag_uid(socket.AF_INET, theirs, mine) == os.geteuid()  # the kernel's answer
            assert trust.peer_uid(conn) == os.geteuid()
            trust.verify_connection(conn, f"http://127.0.0.1:{port}")  # ours: no exception
        assert trust.held_by(port, os.getpid()) is True
        assert trust.held_by(port, os.getppid()) is False
    assert trust.held_by(port, os.getpid()) is False  # nothing listens any more


async def test_a_listener_that_is_not_the_data_dirs_server_is_sent_nothing(
    data_dir: DataDir, not_chroma: tuple[str, list[str]]
) -> None:
    url, seen = not_chroma
    refused: list[ChromaUntrusted] = []
    # this user's socket, but chroma.lock is free: whatever listens is not the data dir's server
    store = ChromaStore(lambda: url, trust=DataDirTrust(data_dir, refused.append), collection="rem_x")
    with pytest.raises(ChromaUntrusted, match="not this data dir's Chroma server"):
        await store.get(["summary_s1"])
    assert seen == [] and len(refused) == 1 and refused[0].url == url


@pytest.mark.parametrize("when", ["connecting", "reading"])
async def test_a_malformed_reply_is_an_error_not_a_crash(
    not_chroma: tuple[str, list[str]], when: str
) -> None:
    url, seen = not_chroma
    _Recorder.plausible = when == "reading"  # a server that opens the collection, then answers `{}`
    store = ChromaStore(lambda: url, embedder=_TwoD(), collection="rem_x")  # an external URL: used as named
    with pytest.raises(
        ChromaBadReply, match="Chroma at .* (did not answer as Chroma|gave a reply that is not)"
    ):
        await store.get(["summary_s1"])
    assert any("/get" in request for request in seen) == (when == "reading"), seen
    assert issubclass(ChromaBadReply, ChromaUnreachable)  # a daemon backs off and retries; it does not die


class _TwoD:
    """An embedder the fake collection's record names (nothing is embedded)."""

    name, dim = "x", 2

    def embed(self, texts: list[str]) -> list[list[float]]:
        return [[1.0, 0.0] for _ in texts]
