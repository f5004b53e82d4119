"""Admission's hot path (`backend.api.fast_admission`) takes only what the route would take to the
store, reading it as the route does; anything else goes to the route itself with its body replayed
(the HTTP behaviour of both is in test_admission.py, against a real `rem serve`). A store that fails
for real (locked, its connections killed) is answered in the API's JSON shape by whichever of the two
met the failure, and the request retried once it recovers is admitted once."""

from __future__ import annotations

import asyncio
import json
import sqlite3
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import psycopg
import pytest
from starlette.exceptions import HTTPException
from starlette.types import Message

from backend import ops
from backend.api import fast_admission, routes_inputs, wire
from backend.api.fast_admission import (
    Admission,
    KnownTokens,
    admission_of,
    answer_of,
    headers_of,
    input_of,
    read_body,
    replay,
)
from backend.api.models import InputAdmitted, InputIn
from backend.core.datadir import DataDir
from backend.runtime.context import Context
from backend.store import database
from tests.api.serving import serving

TOKEN = "rem_" + "a" * 43
JSON = {"authorization": f"Bearer {TOKEN}", "content-type": "application/json"}


def body(**fields: object) -> bytes:
    return json.dumps({"text": "hello", **fields}).encode()


def test_a_well_formed_admission_is_taken_and_read_as_the_route_reads_it() -> None:
    taken = admission_of("s1", {**JSON, "idempotency-key": "in-1"}, body(delivery="steer"))
    assert isinstance(taken, Admission)
    assert (taken.token, taken.session_id, taken.input_id) == (TOKEN, "s1", "in-1")
    assert (taken.body.text, taken.body.delivery, taken.body.project) == ("hello", "steer", None)
    charset = {**JSON, "content-type": "Application/JSON; charset=utf-8"}
    assert admission_of("s1", charset, body(input_id="in-2")) is not None


@pytest.mark.parametrize(
    ("session_id", "headers", "raw"),
    [
        ("s1", {"content-type": "application/json"}, body()),  # no token: the route's 401
        ("s1", {**JSON, "authorization": f"Basic {TOKEN}"}, body()),
        ("s1", {**JSON, "content-type": "text/plain"}, body()),
        ("s1", {**JSON, "content-type": "application/merge-patch+json"}, body()),  # the route reads it
        ("s1", JSON, b"{not json"),
        ("s1", JSON, b'{"text": "\xff"}'),
        ("s1", JSON, b"[" * 100_000),  # the stdlib's JSON gives up (RecursionError)
        ("s1", JSON, b'["hello"]'),
        ("s1", JSON, body(inputid="x")),
        ("s1", JSON, body(text="   ")),
        ("s1", JSON, body(text="x" * (256 * 1024 + 1))),
        ("s1", JSON, body(delivery="later")),
        ("bad id", JSON, body()),
        ("s1", {**JSON, "idempotency-key": "bad key"}, body()),
        ("s1", {**JSON, "idempotency-key": "in-1"}, body(input_id="in-2")),
    ],
)
def test_anything_else_is_left_to_the_route(session_id: str, headers: dict[str, str], raw: bytes) -> None:
    assert admission_of(session_id, headers, raw) is None


def test_a_repeated_header_counts_by_its_first_value_as_starlette_reads_it() -> None:
    scope = {
        "headers": [
            (b"content-type", b"application/json"),
            (b"authorization", b"Bearer first"),
            (b"authorization", b"Bearer second"),
            (b"x-other", b"ignored"),
        ]
    }
    assert headers_of(scope) == {"content-type": "application/json", "authorization": "Bearer first"}


async def test_a_body_is_read_whole_and_handed_on_as_it_came() -> None:
    arrived: list[Message] = [
        {"type": "http.request", "body": b'{"text":', "more_body": True},
        {"type": "http.request", "body": b' "hi"}', "more_body": False},
    ]
    pending = list(arrived)

    async def receive() -> Message:
        return pending.pop(0) if pending else {"type": "http.disconnect"}

    received, whole, error = await read_body(receive)
    assert whole == b'{"text": "hi"}' and error is None
    again = replay(received, error, receive)
    assert [await again(), await again(), await again()] == [*arrived, {"type": "http.disconnect"}]


async def test_a_body_cut_short_is_not_taken_and_its_cause_is_raised_again_to_the_route() -> None:
    sent: list[Message] = [{"type": "http.request", "body": b"{", "more_body": True}]

    async def over_the_bound() -> Message:
        if sent:
            return sent.pop(0)
        raise HTTPException(413)

    received, whole, error = await read_body(over_the_bound)
    assert whole is None and isinstance(error, HTTPException)
    again = replay(received, error, over_the_bound)
    assert (await again())["body"] == b"{"
    with pytest.raises(HTTPException):
        await again()

    left: list[Message] = [
        {"type": "http.request", "body": b"{", "more_body": True},
        {"type": "http.disconnect"},
    ]

    async def gone() -> Message:
        return left.pop(0)

    received, whole, error = await read_body(gone)
    assert whole is None and error is None and received[-1]["type"] == "http.disconnect"


async def test_only_a_live_write_token_goes_on_to_the_write_transaction(ctx: Context) -> None:
    """A made-up bearer (or one without `write`) is read and left to the route: a flood of them never
    queues for the store's writer. A known one goes straight on, and is forgotten at its refusal there."""
    known = KnownTokens()
    assert not await known.vouch(ctx, TOKEN) and not known.digests
    reader = (await ops.token_create(ctx, "reader", all_projects=True, scopes=["read"]))["token"]
    assert not await known.vouch(ctx, reader) and not known.digests
    writer = (await ops.token_create(ctx, "writer", all_projects=True, scopes=["write"]))["token"]
    assert await known.vouch(ctx, writer) and len(known.digests) == 1
    await ops.token_revoke(ctx, "writer")
    assert await known.vouch(ctx, writer)  # still known: the admission's transaction refuses it
    known.discard(writer)
    assert not await known.vouch(ctx, writer) and not known.digests


@pytest.mark.parametrize(
    "fields",
    [
        {"text": None},
        {"text": True},
        {"text": 5},
        {"text": ["hello"]},
        {"text": {"a": "b"}},
        {"text": ""},
        {"text": "x" * (256 * 1024 + 1)},
        {"text": "hello", "delivery": None},
        {"text": "hello", "delivery": 1},
        {"text": "hello", "delivery": "Queue"},
        {"text": "hello", "input_id": 5},
        {"text": "hello", "input_id": ["in-1"]},
        {"text": "hello", "project": True},
        {"text": "hello", "project": {"p": 1}},
        {"text": "hello", "extra": 1},
        {"input_id": "in-1"},
    ],
)
def test_the_body_is_taken_only_in_the_exact_json_types_the_model_reads(fields: dict[str, object]) -> None:
    """The hot path reads the body by hand: whatever it would read differently from the route's
    model (a type the model refuses or coerces, a field it forbids or misses) is left to the route."""
    assert input_of(fields) is None
    assert admission_of("s1", JSON, json.dumps(fields).encode()) is None


@pytest.mark.parametrize(
    "fields",
    [
        {"text": "hello"},
        {"text": "hello", "input_id": None, "project": None},
        {"text": "h\u00e9llo \u2603", "input_id": "in-1", "delivery": "steer", "project": "alpha"},
        {"text": "x" * (256 * 1024)},
    ],
)
def test_a_body_the_hot_path_takes_reads_as_the_model_reads_it(fields: dict[str, object]) -> None:
    read = input_of(json.loads(json.dumps(fields)))
    model = InputIn.model_validate(fields)
    assert read is not None
    assert (read.text, read.input_id, read.delivery, read.project) == (
        model.text,
        model.input_id,
        model.delivery,
        model.project,
    )


@pytest.mark.parametrize("duplicate", [False, True])
def test_the_answer_is_the_routes_answer_byte_for_byte(duplicate: bool) -> None:
    admitted = {
        "session_id": "s-1.a_b",
        "input_id": "in_0190abcdef12",
        "delivery": "steer",
        "admitted_seq": 12345678901,
        "promoted_seq": None,
        "duplicate": duplicate,
        "session_created": False,
    }
    headers, content = answer_of(admitted)
    assert content == InputAdmitted.model_validate(admitted).model_dump_json().encode()
    expected = {k.lower(): v for k, v in routes_inputs.answer_headers(admitted).items()}
    assert dict((k.decode(), v.decode()) for k, v in headers) == {
        "content-type": "application/json",
        "content-length": str(len(content)),
        **expected,
    }


def test_a_known_token_is_held_by_its_digest_alone() -> None:
    known = KnownTokens()
    assert not known.holds(TOKEN)
    known.digests.add(fast_admission.tokens.token_hash(TOKEN))
    assert known.holds(TOKEN) and TOKEN not in known.digests
    known.discard(TOKEN)
    assert not known.holds(TOKEN)


async def read_answer(reader: asyncio.StreamReader) -> tuple[int, dict[str, str], bytes]:
    """One HTTP/1.1 answer off the connection: its status, headers (lower case) and body."""
    head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
    fields = dict(line.split(": ", 1) for line in head[1:] if line)
    headers = {k.lower(): v for k, v in fields.items()}
    return int(head[0].split()[1]), headers, await reader.readexactly(int(headers["content-length"]))


async def test_an_answer_written_whole_leaves_the_connection_as_uvicorn_would(
    ctx: Context, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two admissions pipelined on one connection are each answered whole (one write: `wire`), with
    uvicorn's own headers, and the connection serves on; a request asking to close falls back to
    uvicorn's own two writes, and the connection closes after its answer. The route's answer (a
    `+json` body, which the hot path leaves alone) carries the same headers."""
    token = (await ops.token_create(ctx, "wire", all_projects=True, scopes=["write"]))["token"]
    whole: list[bool] = []

    def spied(*args: object) -> bool:
        whole.append(wire.write_whole(*args))  # type: ignore[arg-type]
        return whole[-1]

    monkeypatch.setattr(fast_admission, "write_whole", spied)

    def request(n: int, kind: str = "application/json", close: bool = False) -> bytes:
        raw = json.dumps({"text": f"hello {n}", "input_id": f"wire-{n}"}).encode()
        return (
            f"POST /v1/sessions/wire/inputs HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {token}\r\n"
            f"Content-Type: {kind}\r\nContent-Length: {len(raw)}\r\n{'Connection: close' + chr(13) + chr(10) if close else ''}\r\n"
        ).encode() + raw

    async with serving(ctx) as served:
        host, port = served.url.removeprefix("http://").split(":")
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(request(1) + request(2))  # pipelined: the second waits for the first's answer
        answers = [await read_answer(reader), await read_answer(reader)]
        writer.write(request(3, "application/vnd.rem+json"))
        by_route = await read_answer(reader)
        writer.write(request(4, close=True))
        closing = await read_answer(reader)
        assert await reader.read() == b""  # closed by the server after the answer
        writer.close()
    assert whole == [True, True, False]
    for n, (status, headers, body) in enumerate([*answers, by_route, closing], start=1):
        assert status == 202 and json.loads(body)["input_id"] == f"wire-{n}"
        assert headers["location"] == f"/v1/inputs/wire-{n}"
    names = {*by_route[1]}
    assert {*answers[0][1]} == {*answers[1][1]} == names >= {"date", "server", "content-length"}
    assert closing[1]["connection"] == "close" and {*closing[1]} == names | {"connection"}


@pytest.mark.parametrize("store", ["postgres"], indirect=True)
@pytest.mark.parametrize("failure", ["locked", "terminated"])
async def test_a_store_failing_while_a_new_token_is_read_is_answered_by_the_route(
    data_dir: DataDir, db_url: str, failure: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A bearer the hot path has not seen is read before the write transaction. When the store
    fails that read (the token table locked past the lock timeout; every connection of the server
    killed), the request goes to the route, which answers the store's error in the API's JSON shape,
    never uvicorn's plain-text 500, having written nothing. Once the store answers again, the same
    request is admitted once, and its retry is the first admission again."""
    monkeypatch.setenv("REM_BUSY_TIMEOUT_MS", "300")  # the lock timeout of the connections opened below
    ctx = Context(data_dir, start_chroma=False, db_url=db_url)
    await ctx.db()
    token = (await ops.token_create(ctx, "writer", all_projects=True, scopes=["read", "write"]))["token"]
    send = {"text": "hello", "input_id": "in-1"}
    try:
        async with (
            serving(ctx) as served,
            httpx.AsyncClient(base_url=served.url, headers={"Authorization": f"Bearer {token}"}) as client,
            await psycopg.AsyncConnection.connect(db_url, autocommit=True) as admin,
        ):
            fast = served.app.fast
            assert fast is not None and not fast.known.holds(token)
            # a read through the server first: its reading connection is open when the store fails
            assert (await client.get("/v1/sessions")).status_code == 200
            async with _store_failing(admin, failure):
                failed = await client.post("/v1/sessions/s1/inputs", json=send)
            assert failed.headers["content-type"] == "application/json", failed.text
            code = {"locked": "store_busy", "terminated": "store_unreachable"}[failure]
            assert (failed.status_code, failed.json()["error"]["code"]) == (503, code)
            assert not fast.known.holds(token)  # the hot path never got an answer about it
            admitted = await client.post("/v1/sessions/s1/inputs", json=send)
            assert admitted.status_code == 202 and admitted.json()["duplicate"] is False, admitted.text
            assert fast.known.holds(token)  # vouched for this time: the hot path admitted it
            again = await client.post("/v1/sessions/s1/inputs", json=send)
            assert again.status_code == 202 and again.json() == {**admitted.json(), "duplicate": True}
            rows = await (
                await admin.execute("SELECT id FROM session_input WHERE session_id = 's1'")
            ).fetchall()
            assert rows == [("in-1",)]
    finally:
        await ctx.close()


@asynccontextmanager
async def _store_failing(admin: psycopg.AsyncConnection[Any], failure: str) -> AsyncIterator[None]:
    """The store failing for real while the block runs: `locked` holds the token table in a lock no
    read can share, past the lock timeout; `terminated` kills every other connection to the database."""
    if failure == "terminated":
        await admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
        yield
        return
    async with admin.transaction():
        await admin.execute("LOCK TABLE api_token IN ACCESS EXCLUSIVE MODE")
        yield


@pytest.mark.both_stores
async def test_a_store_whose_writer_is_locked_fails_the_admission_not_the_token_read(
    data_dir: DataDir, db_url: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another writer holds the store past its busy (lock) timeout: a token's read never waits for a
    writer (SQLite's WAL, PostgreSQL's MVCC), so the hot path vouches for it and its own admission
    answers the busy store in the API's JSON shape, having written nothing; once the writer is gone
    the same request is admitted once."""
    monkeypatch.setenv("REM_BUSY_TIMEOUT_MS", "300")  # PostgreSQL's lock timeout, read as it connects
    monkeypatch.setattr(database, "BUSY_TIMEOUT_MS", 300)  # SQLite's, read at import
    ctx = Context(data_dir, start_chroma=False, db_url=db_url)
    await ctx.db()
    token = (await ops.token_create(ctx, "writer", all_projects=True, scopes=["write"]))["token"]
    send = {"text": "hello", "input_id": "in-1"}
    try:
        async with (
            serving(ctx) as served,
            httpx.AsyncClient(base_url=served.url, headers={"Authorization": f"Bearer {token}"}) as client,
        ):
            fast = served.app.fast
            assert fast is not None
            async with _writer_held(ctx):
                failed = await client.post("/v1/sessions/s1/inputs", json=send)
            assert failed.headers["content-type"] == "application/json", failed.text
            assert (failed.status_code, failed.json()["error"]["code"]) == (503, "store_busy")
            assert fast.known.holds(token)  # the token was read: the admission itself was refused
            assert await _inputs(ctx) == []
            admitted = await client.post("/v1/sessions/s1/inputs", json=send)
            assert admitted.status_code == 202 and admitted.json()["duplicate"] is False, admitted.text
            again = await client.post("/v1/sessions/s1/inputs", json=send)
            assert again.status_code == 202 and again.json() == {**admitted.json(), "duplicate": True}
            assert await _inputs(ctx) == ["in-1"]
    finally:
        await ctx.close()


@asynccontextmanager
async def _writer_held(ctx: Context) -> AsyncIterator[None]:
    """Another connection holding the store's write lock (SQLite) or the inputs' table against
    writers (PostgreSQL) while the block runs, readers let through."""
    if ctx.db_url is None:
        holder = sqlite3.connect(ctx.data.state_db, isolation_level=None)
        try:
            holder.execute("BEGIN IMMEDIATE")
            yield
            holder.execute("ROLLBACK")
        finally:
            holder.close()
        return
    async with await psycopg.AsyncConnection.connect(ctx.db_url, autocommit=True) as holder:
        async with holder.transaction():
            await holder.execute("LOCK TABLE session_input IN EXCLUSIVE MODE")
            yield


async def _inputs(ctx: Context) -> list[str]:
    db = await ctx.db()
    return [row["id"] for row in await db.fetchall_beside("SELECT id FROM session_input ORDER BY id")]
