"""Admission's hot path (`backend.api.fast_admission`) takes only what the route would take to the
store, reading it as the route does; anything else goes to the route itself with its body replayed
(the HTTP behaviour of both is in test_admission.py, against a real `rem serve`)."""

from __future__ import annotations

import json

import pytest
from starlette.exceptions import HTTPException
from starlette.types import Message

from backend import ops
from backend.api.fast_admission import Admission, KnownTokens, admission_of, headers_of, read_body, replay
from backend.runtime.context import Context

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
