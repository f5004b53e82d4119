"""The Chroma server lifecycle: one server per data dir, reuse, stale-URL recovery."""

from __future__ import annotations

import http.server
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from backend.chroma import server as chroma_server
from backend.chroma.collection import ChromaStore
from backend.core.datadir import DataDir
from backend.core.errors import ChromaUnreachable

ASK = textwrap.dedent(
    """
    import json, sys
    from backend.chroma import server as chroma_server
    from backend.core.datadir import DataDir
    server = chroma_server.resolve(DataDir.resolve(sys.argv[1]))
    print(json.dumps({"url": server.url, "started": server.started_here, "pid": server.pid}), flush=True)
    sys.stdin.read()  # hold the server until the test closes our stdin
    server.stop()
    """
)


def _ask(data: DataDir) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", ASK, str(data.root)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )


def test_two_processes_get_the_same_server(tmp_path: Path) -> None:
    data = DataDir(tmp_path / "d").ensure()
    procs = [_ask(data), _ask(data)]
    try:
        answers = [json.loads(p.stdout.readline()) for p in procs]  # type: ignore[union-attr]
    finally:
        for p in procs:
            p.communicate("", timeout=60)
    assert answers[0]["url"] == answers[1]["url"]
    assert sorted(a["started"] for a in answers) == [False, True]
    assert answers[0]["pid"] == answers[1]["pid"]


def test_stale_url_after_sigkill_is_replaced(tmp_path: Path) -> None:
    data = DataDir(tmp_path / "d").ensure()
    first = chroma_server.resolve(data)
    try:
        assert chroma_server.lock_is_held(data)
        assert first.process is not None
        os.kill(first.process.pid, signal.SIGKILL)
        first.process.wait(10)
        assert not chroma_server.lock_is_held(data)  # the kernel released it with the process
        assert chroma_server.live_server(data) is None  # chroma.url is stale now
        second = chroma_server.resolve(data)
        try:
            assert second.started_here and second.process is not None
            assert second.process.pid != first.process.pid
            assert chroma_server.recorded_url(data) == second.url
            assert chroma_server.is_alive(second.url)
        finally:
            second.stop()
    finally:
        first.stop()


def test_no_second_server_while_one_holds_the_lock(tmp_path: Path) -> None:
    data = DataDir(tmp_path / "d").ensure()
    server = chroma_server.resolve(data)
    try:
        assert chroma_server.try_start(data) is None
    finally:
        server.stop()
    assert not chroma_server.lock_is_held(data)


async def test_metadata_round_trip_offline(chroma_url: str, collection: str) -> None:
    store = ChromaStore(lambda: chroma_url, collection=collection)
    meta = {"sessionId": "s1", "memoryCount": 3, "score": 1.0, "flag": True, "note": "héllo ☃"}
    await store.upsert(["summary_s1"], ["a document"], [meta])
    rows = await store.get(["summary_s1", "missing"])
    assert list(rows) == ["summary_s1"]
    document, got = rows["summary_s1"]
    assert document == "a document"
    assert got == meta
    assert type(got["memoryCount"]) is int and type(got["score"]) is float and type(got["flag"]) is bool


class _NotChroma(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = b"<html>hello</html>"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def not_chroma() -> Iterator[str]:
    server = http.server.HTTPServer(("127.0.0.1", 0), _NotChroma)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def test_a_non_chroma_url_is_named(not_chroma: str) -> None:
    with pytest.raises(ChromaUnreachable, match="is not a Chroma server"):
        chroma_server.heartbeat(not_chroma)


def test_a_dead_url_is_named() -> None:
    port = chroma_server.free_port()
    with pytest.raises(ChromaUnreachable, match="unreachable"):
        chroma_server.heartbeat(f"http://127.0.0.1:{port}")
