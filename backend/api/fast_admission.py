"""The API's hot path, `POST /v1/sessions/{session_id}/inputs`, answered in front of FastAPI.

FastAPI's per-request machinery (dependency solving, request and response models, its error and
telemetry layers, the middlewares) cost several times the admission itself. `FastAdmission` is the
app's outermost layer (`app.RemApi.__call__`): it takes a request the route (`routes_inputs`)
would take to the store: JSON with a declared length within the bound, a bearer token, and a path,
header and body that the route's own rules accept (read with the stdlib's `json` as the route
reads it, then checked by hand, more strictly than the route's model, and by the rules the
admission applies). It admits it with the token checked inside the admission's transaction
(`ops.send_as`: one trip to the store, and a revocation committed before it refuses it, on any
replica; a bearer not seen live before is read first, outside that transaction, so made-up tokens
never queue for the store's writer: `KnownTokens`), counts it as `stats.Metered` would, and
answers as the route answers (head and body in one write where uvicorn allows: `wire`), in the
one error shape when the store refuses. Any other request goes on to FastAPI and the route itself
(its body replayed, when read), so every refusal of a malformed request is the route's own. The
OpenAPI document describes the route.
"""

from __future__ import annotations

import json
import re
import time
from collections import deque
from collections.abc import Awaitable, Callable
from json.encoder import encode_basestring
from typing import Any, NamedTuple

from fastapi import Request
from fastapi.routing import APIRoute
from starlette.types import Message, Receive, Scope, Send

from backend import ops
from backend.api import errors, routes_inputs
from backend.api.auth import bearer_of, lacks, not_live
from backend.api.models import MAX_TEXT_CHARS
from backend.api.scope import not_found
from backend.api.stats import ApiStats
from backend.api.wire import write_whole
from backend.core.errors import BadInput, RemError, SessionNotFound
from backend.execution.sessions import validate_input
from backend.ops import tokens
from backend.ops.tokens import Unauthorized
from backend.runtime.context import Context

# the route's path, matched as Starlette's router matches it: on the decoded path, one segment
PATH = re.compile(r"/v1/sessions/([^/]+)/inputs")
ROUTE = next(
    r
    for r in routes_inputs.router.routes
    if isinstance(r, APIRoute) and r.endpoint is routes_inputs.admit_input
)
# the headers the hot path reads (ASGI servers give their names in lower case)
READ = (b"authorization", b"content-type", b"idempotency-key", b"content-length")
# the body's fields (`models.InputIn`)
FIELDS = frozenset({"text", "input_id", "delivery", "project"})
ANSWER = b'{"session_id":%s,"input_id":%s,"delivery":%s,"admitted_seq":%d,"duplicate":%s}'

ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


class InputRead(NamedTuple):
    """The body's fields, as `models.InputIn` reads them."""

    text: str
    input_id: str | None = None
    delivery: str = "queue"
    project: str | None = None


class Admission(NamedTuple):
    """A request the hot path takes: its token, its session, its body as the route reads it, its id."""

    token: str
    session_id: str
    body: InputRead
    input_id: str | None


def headers_of(scope: Scope) -> dict[str, str]:
    """The first value of each header the hot path reads, as Starlette's `Headers.get` gives it."""
    found: dict[str, str] = {}
    for name, value in scope["headers"]:
        if name in READ and name.decode() not in found:
            found[name.decode()] = value.decode("latin-1")
    return found


def input_of(parsed: object) -> InputRead | None:
    """The body as `models.InputIn` would read it, or None when the model might answer otherwise
    (stricter than the model: the exact JSON types, no field it would coerce)."""
    if type(parsed) is not dict or not FIELDS.issuperset(parsed):
        return None
    text, delivery = parsed.get("text"), parsed.get("delivery", "queue")
    input_id, project = parsed.get("input_id"), parsed.get("project")
    if type(text) is not str or not 0 < len(text) <= MAX_TEXT_CHARS or delivery not in ("queue", "steer"):
        return None
    # the ids' pattern (`models.Id`) is `validate_input`'s, checked by the caller
    if not all(v is None or type(v) is str for v in (input_id, project)):
        return None
    return InputRead(text, input_id, delivery, project)


def admission_of(session_id: str, headers: dict[str, str], body: bytes) -> Admission | None:
    """The request as the route would take it to the store, or None when anything is off."""
    token = bearer_of(headers)
    media = headers.get("content-type", "").partition(";")[0].strip().lower()
    if token is None or media != "application/json":
        return None
    try:
        read = input_of(json.loads(body))  # the route's reading: the stdlib's JSON
        if read is None:
            return None
        input_id = routes_inputs.input_id_of(read.input_id, headers.get("idempotency-key"))
        validate_input(session_id, read.text, read.delivery, input_id, read.project)
    except (ValueError, RecursionError, BadInput):  # ValueError: bad JSON, UTF-8 or shape
        return None
    return Admission(token, session_id, read, input_id)


async def read_body(receive: Receive) -> tuple[list[Message], bytes | None, Exception | None]:
    """The messages read (to hand on), the body if it came whole, and what cut it short."""
    received: list[Message] = []
    try:
        while not received or received[-1].get("more_body", False):
            received.append(await receive())
            if received[-1]["type"] != "http.request":  # the client went away
                return received, None, None
    except Exception as exc:  # raised again to the route, which answers it
        return received, None, exc
    if len(received) == 1:
        return received, received[0].get("body", b""), None
    return received, b"".join(m.get("body", b"") for m in received), None


def replay(received: list[Message], error: Exception | None, receive: Receive) -> Receive:
    """A `receive` that gives what was read, then raises what cut it short, then reads on."""
    pending = deque(received)

    async def replayed() -> Message:
        if pending:
            return pending.popleft()
        if error is not None:
            raise error
        return await receive()

    return replayed


def answer_of(admitted: dict[str, Any]) -> tuple[list[tuple[bytes, bytes]], bytes]:
    """The route's 202: its headers (`routes_inputs.answer_headers`) and its body (as
    `models.InputAdmitted` writes it: compact JSON, text as UTF-8)."""
    content = ANSWER % (
        encode_basestring(admitted["session_id"]).encode(),
        encode_basestring(admitted["input_id"]).encode(),
        encode_basestring(admitted["delivery"]).encode(),
        admitted["admitted_seq"],
        b"true" if admitted["duplicate"] else b"false",
    )
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", b"%d" % len(content)),
        (b"location", f"/v1/inputs/{admitted['input_id']}".encode()),
    ]
    if admitted["duplicate"]:
        headers.append((b"idempotent-replayed", b"true"))
    return headers, content


async def admit(
    ctx: Context, scope: Scope, admission: Admission, receive: Receive, send: Send, known: KnownTokens
) -> int:
    """Admit, and answer as the route would: 202 with the admission, or the store's refusal; the status."""
    body = admission.body
    try:
        admitted = await ops.send_as(
            ctx,
            admission.token,
            admission.session_id,
            body.text,
            delivery=body.delivery,
            input_id=admission.input_id,
            project=body.project,
            validated=True,  # by `admission_of`
        )
    except Unauthorized as exc:
        known.discard(admission.token)
        refusal = errors.answer(not_live(Request(scope)) if exc.who is None else lacks(exc.who, exc.scope))
    except SessionNotFound:  # missing, or kept out by the token's projects: the one answer
        refusal = errors.answer(not_found(admission.session_id))
    except RemError as exc:
        refusal = errors.answer(exc)
    except Exception as exc:  # in front of FastAPI's stack: the 500 its error layer would answer
        refusal = errors.internal(exc)
    else:
        headers, content = answer_of(admitted)
        if not write_whole(send, 202, headers, content):
            await send({"type": "http.response.start", "status": 202, "headers": headers})
            await send({"type": "http.response.body", "body": content})
        return 202
    await refusal(scope, receive, send)
    return refusal.status_code


class KnownTokens:
    """The bearers that were live tokens with the `write` scope when last seen, by digest: only
    those reach the admission's write transaction. Another bearer is read first, outside it, so
    requests with a made-up token never queue for the store's writer; a revoked one leaves at its
    first refusal there. Bounded: emptied when full (the next request of each reads again)."""

    LIMIT = 1024

    def __init__(self) -> None:
        self.digests: set[str] = set()

    def holds(self, token: str) -> bool:
        """Whether `token` was a live token with the `write` scope when last seen."""
        return tokens.token_hash(token) in self.digests

    async def vouch(self, ctx: Context, token: str) -> bool:
        """Whether `token` may go to the admission's transaction (checked there again)."""
        digest = tokens.token_hash(token)
        if digest in self.digests:
            return True
        who = await tokens.authenticate(ctx, token)
        if who is None or not who.may("write"):
            return False  # the route answers it, reading the token itself
        if len(self.digests) >= self.LIMIT:
            self.digests.clear()
        self.digests.add(digest)
        return True

    def discard(self, token: str) -> None:
        self.digests.discard(tokens.token_hash(token))


class FastAdmission:
    """The hot path of `POST /v1/sessions/{session_id}/inputs` (see the module), in front of `onward`
    (FastAPI's whole stack), counted in `stats` as `stats.Metered` counts the others."""

    def __init__(self, ctx: Context, stats: ApiStats) -> None:
        self.ctx, self.stats = ctx, stats
        self.known = KnownTokens()

    async def __call__(
        self, session_id: str, scope: Scope, receive: Receive, send: Send, onward: ASGIApp
    ) -> None:
        headers = headers_of(scope)
        declared = headers.get("content-length", "")
        if self.ctx.read_only or not declared.isdigit() or int(declared) > errors.MAX_BODY_BYTES:
            # read-only: the route refuses after the token; no length or over it: the bound answers
            await onward(scope, receive, send)
            return
        began = time.perf_counter()
        received, body, error = await read_body(receive)
        admission = None if body is None else admission_of(session_id, headers, body)
        if admission is None or not (
            self.known.holds(admission.token) or await self.vouched(admission.token)
        ):
            await onward(scope, replay(received, error, receive), send)  # counted by the meter there
            return
        stats = self.stats
        stats.in_flight += 1
        status = 500  # what the client gets when this raises before answering
        try:
            status = await admit(self.ctx, scope, admission, receive, send, self.known)
            stats.started("POST", ROUTE.path, time.perf_counter() - began)  # as the meter: to the answer
        finally:
            stats.in_flight -= 1
            stats.finished("POST", ROUTE.path, status)

    async def vouched(self, token: str) -> bool:
        """`KnownTokens.vouch`; a store that cannot say is the route's to answer (503, or what fits)."""
        try:
            return await self.known.vouch(self.ctx, token)
        except Exception:
            return False
