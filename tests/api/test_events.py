"""The event streams over HTTP (an httpx client, uvicorn on a real socket): a session's stream from
its first event, resumed from any cursor by `Last-Event-ID` or `?after=` with nothing lost or
repeated; the project stream from its live end; a `reset` for a cursor the store cannot resume from;
one read of the journal per change, fanned out; a slow reader closed, never an event skipped; an
input waited on until its answer; a client leaving mid-turn cancels nothing."""

from __future__ import annotations

import asyncio
import json
import re
import socket
from functools import partial

import httpx
import pytest

from backend import ops
from backend.api.hub import Hub, Subscription, hub_of
from backend.api.pinger import PING
from backend.core import clock
from backend.execution import sessions
from backend.execution.agent import OfflineResponder
from backend.execution.executor import Executor
from backend.runtime.context import Context
from backend.store.db import Database
from backend.store.stream import ORIGIN, Page, Scope, read_sync
from tests.api.serving import Sse, collect, serving, sse_blocks
from tests.helpers import await_until

pytestmark = pytest.mark.both_stores


async def _token(ctx: Context, name: str = "reader", **reach: object) -> dict[str, str]:
    made = await ops.token_create(ctx, name, **(reach or {"all_projects": True}), scopes=["read"])  # type: ignore[arg-type]
    return {"Authorization": f"Bearer {made['token']}"}


async def _fresh_read(db: Database, scope: Scope) -> list[tuple[str, str, dict[str, object]]]:
    page: Page = await db.read_in_thread(partial(read_sync, after=ORIGIN, scope=scope, limit=100_000))
    return [(e.cursor, e.type, e.data) for e in page.events]


def _seen(blocks: list[Sse]) -> list[tuple[str, str, dict[str, object]]]:
    return [(str(b.id), b.event, b.json()) for b in blocks if b.data]


async def _turns(ctx: Context, *texts: str, session: str = "s1", project: str = "alpha") -> None:
    db = await ctx.db()
    for i, text in enumerate(texts):
        await sessions.admit(db, session, text, input_id=f"{session}-in-{i}", project=project)
    await Executor(ctx, once=True, agent=OfflineResponder(delay_ms=0), lease_ms=5_000).run()


async def test_a_session_stream_resumes_from_any_cursor_and_resets_on_a_foreign_one(db_ctx: Context) -> None:
    await _turns(db_ctx, "What is the export format?", "And the import one?")
    await _turns(db_ctx, "Another project's question.", session="s2", project="beta")
    fresh = await _fresh_read(await db_ctx.db(), Scope(session_id="s1"))
    headers = await _token(db_ctx)
    async with serving(db_ctx) as served, httpx.AsyncClient(base_url=served.url, headers=headers) as client:
        url = "/v1/sessions/s1/events"
        async with client.stream("GET", url) as response:
            assert response.headers["content-type"].startswith("text/event-stream")
            blocks = await collect(sse_blocks(response), count=len(fresh))
        assert blocks[0] == Sse(None, "message", "", 1000)  # priming: retry, no position yet
        assert _seen(blocks) == fresh  # from the session's first event, as a fresh read gives it
        for i, (cursor, _type, _data) in enumerate(fresh[:-1]):
            # a reconnecting EventSource sends Last-Event-ID; it wins over the first URL's ?after=
            for kwargs in (
                {"headers": {"Last-Event-ID": cursor}, "params": {"after": fresh[0][0]}},
                {"params": {"after": cursor}},
            ):
                async with client.stream("GET", url, **kwargs) as response:  # type: ignore[arg-type]
                    resumed = await collect(sse_blocks(response), count=len(fresh) - i - 1)
                assert resumed[0].id == cursor and _seen(resumed) == fresh[i + 1 :]
        foreign = fresh[-1][0][:-8] + ("0" * 8 if not fresh[-1][0].endswith("0" * 8) else "1" * 8)
        async with client.stream("GET", url, headers={"Last-Event-ID": foreign}) as response:
            blocks = await collect(sse_blocks(response), count=1 + len(fresh))
        reset = blocks[1]
        assert (reset.event, reset.id) == ("reset", "")  # the id cleared: a reconnect starts fresh
        assert reset.json() == {
            "session_id": "s1",
            "reason": "unknown",
            "cursor": foreign,
            "resumes_at": None,
        }
        assert _seen(blocks[2:]) == fresh
        bad = await client.get(url, params={"after": "12;DROP"})
        assert bad.status_code == 400 and "not one rem gave" in bad.json()["error"]["message"]
        beta_only = await _token(db_ctx, "beta-only", projects=["beta"])
        for path in (url, "/v1/sessions/nope/events"):
            missing = await client.get(path, headers=beta_only)
            assert missing.status_code == 404 and missing.json()["error"]["message"].startswith("no session")
        assert (
            await client.get("/v1/events", params={"project": "alpha"}, headers=beta_only)
        ).status_code == 404


async def test_the_project_stream_starts_at_the_live_end_and_one_read_serves_every_stream(
    db_ctx: Context,
) -> None:
    await _turns(db_ctx, "An old question that came before the streams opened.")
    db = await db_ctx.db()
    headers = await _token(db_ctx)
    async with serving(db_ctx) as served, httpx.AsyncClient(base_url=served.url, headers=headers) as client:
        hub = hub_of(served.app)
        async with (
            client.stream("GET", "/v1/events", params={"project": "alpha"}) as alpha,
            client.stream("GET", "/v1/events") as everything,
        ):
            projects = [sse_blocks(r) for r in (alpha, everything)]
            opened = [await anext(blocks) for blocks in projects]
            assert all(b.id and b.data == "" for b in opened)  # priming names the live end
            followers = [client.stream("GET", "/v1/sessions/s9/events") for _ in range(8)]
            await sessions.admit(db, "s9", "A new question.", input_id="s9-in", project="alpha")
            streams = [sse_blocks(await f.__aenter__()) for f in followers]
            try:
                for blocks in streams:  # the late subscribers catch up from the store
                    assert [b.event for b in await collect(blocks, count=1)][-1] == "input.admitted"
                assert hub.open_streams == 10
                reads = hub.stats.reads
                await sessions.admit(db, "s9", "And one more.", input_id="s9-in-2", project="alpha")
                for blocks in streams:
                    assert [b.json()["input_id"] for b in await collect(blocks, count=1)] == ["s9-in-2"]
                for blocks in projects:  # nothing from before they opened: s1's turn is not there
                    got = [(b.event, b.json()["input_id"]) for b in await collect(blocks, count=2)]
                    assert got == [("input.admitted", "s9-in"), ("input.admitted", "s9-in-2")]
                assert hub.stats.reads - reads <= 3  # one read per change, not one per stream
            finally:
                for follower in followers:
                    await follower.__aexit__(None, None, None)
        await await_until(lambda: _zero(hub.open_streams), message="streams closed when clients leave")


async def _zero(value: int) -> bool:
    return value == 0


async def _above(value: int, floor: int) -> bool:
    return value > floor


async def test_a_slow_reader_is_closed_and_resumes_with_nothing_skipped(db_ctx: Context) -> None:
    """The client stops reading while a burst (2 MB of parts) is journaled: the socket (small kernel
    buffers both ends) fills, the server's write waits, the subscriber's bounded buffer fills, and the hub closes the stream
    rather than skip or hold more. The client reads what was sent, then resumes from its last id."""
    db = await db_ctx.db()
    await sessions.admit(db, "s1", "Tell me everything.", input_id="in-1")
    headers = await _token(db_ctx)
    transport = httpx.AsyncHTTPTransport(socket_options=[(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)])
    async with (
        serving(db_ctx, sndbuf=16_384) as served,
        httpx.AsyncClient(base_url=served.url, headers=headers, transport=transport, timeout=60) as client,
    ):
        hub = hub_of(served.app)
        hub.max_frames = hub.page_rows + 64  # one read's rows fit: only a reader falling behind overflows
        url = "/v1/sessions/s1/events"
        async with client.stream("GET", url) as response:
            blocks = sse_blocks(response)
            await anext(blocks)  # priming
            got = [await anext(blocks)]
            assert got[0].event == "input.admitted"
            await _burst_of_parts(db, "s1", parts=1000, size=2000)
            await await_until(
                lambda: _zero(hub.stats.closed_slow - 1), timeout=60, message="the slow stream closed"
            )
            got += [b async for b in blocks]  # what was in flight, then the end of the stream
        assert hub.open_streams == 0
        fresh = await _fresh_read(db, Scope(session_id="s1"))
        assert 1 < len(got) < len(fresh)  # closed mid-burst, after some of it was written
        resume = {"Last-Event-ID": str(got[-1].id), **headers}
        async with (
            httpx.AsyncClient(base_url=served.url) as fast,
            fast.stream("GET", url, headers=resume) as response,
        ):
            rest = await collect(sse_blocks(response), count=len(fresh) - len(got))
        assert _seen(got) + _seen(rest) == fresh  # all of it, once, in order


async def _burst_of_parts(db: Database, session_id: str, *, parts: int, size: int, first: int = 0) -> None:
    now = clock.now_ms()
    async with db.tx() as conn:
        if first == 0:
            await conn.execute(
                "INSERT INTO session_message (id, session_id, type, seq, time_created, time_updated, data) "
                "VALUES ('m-burst', ?, 'assistant', 100, ?, ?, '{}')",
                (session_id, now, now),
            )
        await conn.executemany(
            "INSERT INTO session_part (id, message_id, session_id, idx, type, time_created, data) "
            "VALUES (?, 'm-burst', ?, ?, 'text', ?, ?)",
            [
                (f"m-burst:p{i}", session_id, i, now, json.dumps({"text": f"{i:06d}" + "x" * size}))
                for i in range(first, first + parts)
            ],
        )


async def test_an_input_is_waited_on_until_answered_and_a_client_leaving_cancels_nothing(
    db_ctx: Context,
) -> None:
    db = await db_ctx.db()
    await sessions.admit(db, "s1", "What is the export format?", input_id="in-1", project="alpha")
    headers = await _token(db_ctx)
    async with (
        serving(db_ctx) as served,
        httpx.AsyncClient(base_url=served.url, headers=headers, timeout=60) as client,
    ):
        queued = await client.get("/v1/inputs/in-1", params={"wait": 0.2})
        assert queued.status_code == 202
        assert queued.json() == {"input_id": "in-1", "session_id": "s1", "state": "queued", "reply": None}
        waiting = asyncio.create_task(client.get("/v1/inputs/in-1", params={"wait": 30}))
        async with client.stream("GET", "/v1/sessions/s1/events") as response:
            executor = asyncio.create_task(
                Executor(db_ctx, once=True, agent=OfflineResponder(delay_ms=50), lease_ms=5_000).run()
            )
            await collect(sse_blocks(response), until="part")  # mid-turn: the client leaves
        await executor
        answered = await waiting
        assert answered.status_code == 200
        body = answered.json()
        row = await db.fetchone(
            "SELECT id, data FROM session_message WHERE type = 'assistant' AND session_id = 's1'"
        )
        assert row is not None and json.loads(row["data"])["status"] == "completed"  # the turn ran to its end
        assert body["state"] == "answered"
        assert body["reply"] == {"message_id": row["id"], "text": json.loads(row["data"])["text"]}
        beta_only = await _token(db_ctx, "beta-only", projects=["beta"])
        for iid in ("in-1", "nope"):
            missing = await client.get(f"/v1/inputs/{iid}", headers=beta_only)
            assert missing.status_code == 404 and "no input" in missing.json()["error"]["message"]
        assert (await client.get("/v1/inputs/in-1", params={"wait": 61})).status_code == 400


async def test_an_idle_stream_gets_heartbeats_and_a_drain_ends_it(
    db_ctx: Context, monkeypatch: pytest.MonkeyPatch
) -> None:
    from backend.api import hub as hub_module

    monkeypatch.setattr(hub_module, "HEARTBEAT_S", 0.05)  # the real tick, sooner than its 15 s
    headers = await _token(db_ctx)
    async with serving(db_ctx) as served, httpx.AsyncClient(base_url=served.url, headers=headers) as client:
        async with client.stream("GET", "/v1/events") as response:
            lines = response.aiter_lines()
            assert (await anext(lines)).startswith("retry: ")
            pings = 0
            async for line in lines:
                pings += line == ": ping"
                if pings == 3:
                    break
            hub = hub_of(served.app)
            # the ticker wrote each onto the idle stream's connection: the stream's task never woke
            assert hub.stats.pings_written >= 3 and hub.stats.pings_woken == 0, hub.stats
            await hub.close()  # what a drain does first: every stream ends now
            assert [line async for line in lines] in ([], [""])
        refused = await client.get("/v1/events")
        assert refused.status_code == 503 and refused.json()["error"]["code"] == "draining"


async def test_a_heartbeat_never_writes_onto_a_paused_connection_nor_into_an_event(
    db_ctx: Context, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A raw client (small kernel buffers both ends) stops reading while parts are journaled one at a
    time: the write of one fills the socket past uvicorn's high-water mark and the connection's writes
    pause, with the stream's task idle again. The ticker must not write `: ping` there (it would pile
    up on a reader that reads nothing); it wakes the stream, whose own `send` waits for the reader.
    Nothing queued passes the hub's bound, so the stream stays open. Read again, the client gets every
    event whole (each chunk one event or one ping), in order, none skipped, and the stream lives on."""
    from backend.api import hub as hub_module

    monkeypatch.setattr(hub_module, "HEARTBEAT_S", 3600.0)  # no tick while the socket fills
    db = await db_ctx.db()
    await sessions.admit(db, "s1", "Tell me everything.", input_id="in-1")
    headers = await _token(db_ctx)
    async with serving(db_ctx, sndbuf=4096) as served:
        hub = hub_of(served.app)
        raw = await _RawStream.open(served.url, "/v1/sessions/s1/events", headers, rcvbuf=4096)
        try:
            assert b"transfer-encoding: chunked" in (await raw.head()).lower()
            assert await raw.chunk() == b"retry: 1000\n\n"  # priming
            assert b"event: input.admitted" in await raw.chunk()
            (sub,) = hub._subs.all()
            (conn,) = served.server.server_state.connections
            parts = 0
            while not conn.flow.write_paused:  # one part at a time, each written before the next
                assert parts < 300, "the connection's writes never paused"
                frames = hub.stats.frames
                await _burst_of_parts(db, "s1", parts=1, size=8000, first=parts)
                parts += 1
                await await_until(partial(_written, sub, hub, frames), message="the part written")
            assert sub.idle and parts > 1
            written, woken = hub.stats.pings_written, hub.stats.pings_woken
            monkeypatch.setattr(hub_module, "HEARTBEAT_S", 0.05)
            hub._tick.cancel()  # type: ignore[union-attr]
            hub._heartbeat()  # the ticker's own pass, now (it ticks every 50 ms from here)
            # the stream's task was idle, so only the paused writes kept the ping off the connection
            assert (hub.stats.pings_written, hub.stats.pings_woken) == (written, woken + 1)
            await await_until(lambda: _above(hub.stats.pings_woken, woken + 3), message="more ticks")
            assert conn.flow.write_paused and hub.stats.pings_written == written, hub.stats
            assert hub.stats.closed_slow == 0 and hub.open_streams == 1
            fresh = await _fresh_read(db, Scope(session_id="s1"))
            chunks = [await raw.chunk() for _ in range(len(fresh) - 1)]  # the rest of the events
            chunks.append(await raw.chunk())  # then the heartbeat the woken stream carried itself
            assert chunks[-1] == PING and PING not in chunks[:-1]
            await _burst_of_parts(db, "s1", parts=1, size=10, first=parts)  # the stream lives on
            chunks.append(await raw.chunk(skip_pings=True))
            events = [_event_of(c) for c in chunks if c != PING]
            assert events == (await _fresh_read(db, Scope(session_id="s1")))[1:]
            assert hub.stats.closed_slow == 0  # (drained, its pings go straight on again)
        finally:
            raw.sock.close()


class _RawStream:
    """An HTTP/1.1 event stream read off a bare socket, one chunk at a time, only when asked."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock, self.buf = sock, b""

    @classmethod
    async def open(cls, url: str, path: str, headers: dict[str, str], *, rcvbuf: int) -> _RawStream:
        host, port = httpx.URL(url).host, httpx.URL(url).port
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)  # before connecting: the window
        sock.setblocking(False)
        loop = asyncio.get_running_loop()
        await loop.sock_connect(sock, (host, port))
        lines = [f"GET {path} HTTP/1.1", f"Host: {host}:{port}", "Accept: text/event-stream"]
        lines += [f"{name}: {value}" for name, value in headers.items()]
        await loop.sock_sendall(sock, ("\r\n".join(lines) + "\r\n\r\n").encode())
        return cls(sock)

    async def _more(self) -> None:
        data = await asyncio.wait_for(asyncio.get_running_loop().sock_recv(self.sock, 65536), 30)
        assert data, "the server ended the stream"
        self.buf += data

    async def head(self) -> bytes:
        while b"\r\n\r\n" not in self.buf:
            await self._more()
        head, _, self.buf = self.buf.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200"), head
        return head

    async def chunk(self, *, skip_pings: bool = False) -> bytes:
        while True:
            size, sep, rest = self.buf.partition(b"\r\n")
            if sep and len(rest) >= int(size, 16) + 2:
                body, self.buf = rest[: int(size, 16)], rest[int(size, 16) + 2 :]
                assert rest[int(size, 16) : int(size, 16) + 2] == b"\r\n"
                if not (skip_pings and body == PING):
                    return body
                continue
            await self._more()


def _event_of(chunk: bytes) -> tuple[str, str, dict[str, object]]:
    """One whole SSE event as the hub encodes it (`hub.Frame`), the chunk holding nothing else."""
    match = re.fullmatch(rb"id: ([^\n]+)\nevent: ([^\n]+)\ndata: ([^\n]+)\n\n", chunk)
    assert match is not None, chunk[:200]
    return match[1].decode(), match[2].decode(), json.loads(match[3])


async def _written(sub: Subscription, hub: Hub, frames: int) -> bool:
    """Whether a frame came after `frames` and the stream's task took it and waits again."""
    return sub.idle and hub.stats.frames > frames


async def test_a_hub_nobody_follows_reads_nothing_and_the_next_stream_misses_nothing(db_ctx: Context) -> None:
    db = await db_ctx.db()
    headers = await _token(db_ctx)
    async with serving(db_ctx) as served, httpx.AsyncClient(base_url=served.url, headers=headers) as client:
        hub = hub_of(served.app)
        async with client.stream("GET", "/v1/events") as response:  # the hub starts, then nobody follows
            await anext(sse_blocks(response))
        await await_until(lambda: _zero(hub.subscribers), message="the stream gone")
        reads, unread = hub.stats.reads, hub.stats.unread
        for i in range(3):
            await sessions.admit(db, "s9", f"Question {i}.", input_id=f"s9-in-{i}", project="alpha")
        await await_until(lambda: _above(hub.stats.unread, unread), message="changes heard, unread")
        assert hub.stats.reads == reads
        async with client.stream("GET", "/v1/events") as response:
            blocks = sse_blocks(response)
            primed = await anext(blocks)
            end = (await _fresh_read(db, Scope()))[-1][0]
            assert primed.id == end  # the live end, though the hub read nothing meanwhile
            await sessions.admit(db, "s9", "One more.", input_id="s9-in-3", project="alpha")
            got = await collect(blocks, count=1)
            assert [b.json()["input_id"] for b in got if b.data] == ["s9-in-3"]
        async with client.stream("GET", "/v1/sessions/s9/events") as response:
            blocks = sse_blocks(response)
            got = await collect(blocks, count=4)
            assert [b.json()["input_id"] for b in got if b.data] == [f"s9-in-{i}" for i in range(4)]
            await sessions.admit(db, "s9", "And the last.", input_id="s9-in-4", project="alpha")
            assert [b.json()["input_id"] for b in await collect(blocks, count=1)] == ["s9-in-4"]
