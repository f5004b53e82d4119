"""The API's hot path, `POST /v1/sessions/{session_id}/inputs`, answered in front of FastAPI.

FastAPI's per-request machinery (dependency solving, request and response models, its error and
telemetry layers) cost about three times the admission itself. `FastAdmission` takes a request the
route (`routes_inputs`) would take to the store: JSON, a bearer token, and a path, header and body
that the route's own models and rules accept. It admits it with the token checked inside the
admission's transaction (`ops.send_as`: one trip to the store, and a revocation committed before it
refuses it, on any replica; a bearer not seen live before is read first, outside that transaction,
so made-up tokens never queue for the store's writer: `KnownTokens`), and answers as the route answers, in the one error shape when the store
refuses. Any other request goes on to FastAPI and the route itself, its body replayed, so every
refusal of a malformed request is the route's own. The OpenAPI document describes the route.
"""

from __future__ import annotations

import json
import re
from collections import deque
from dataclasses import dataclass

from fastapi import Request
from fastapi.routing import APIRoute
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from backend import ops
from backend.api import errors, routes_inputs
from backend.api.auth import bearer_of, lacks, not_live
from backend.api.models import InputAdmitted, InputIn
from backend.api.scope import one_answer
from backend.core.errors import BadInput, RemError
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
# the headers the route reads (ASGI servers give their names in lower case)
READ = (b"authorization", b"content-type", b"idempotency-key")


@dataclass(frozen=True)
class Admission:
    """A request the hot path takes: its token, its session, its body as the route reads it, its id."""

    token: str
    session_id: str
    body: InputIn
    input_id: str | None


def headers_of(scope: Scope) -> dict[str, str]:
    """The first value of each header the route reads, as Starlette's `Headers.get` gives it."""
    found: dict[str, str] = {}
    for name, value in scope["headers"]:
        if name in READ and name.decode() not in found:
            found[name.decode()] = value.decode("latin-1")
    return found


def admission_of(session_id: str, headers: dict[str, str], body: bytes) -> Admission | None:
    """The request as the route would take it to the store, or None when anything is off."""
    token = bearer_of(headers)
    media = headers.get("content-type", "").partition(";")[0].strip().lower()
    if token is None or media != "application/json":
        return None
    try:
        # the route's reading: the stdlib's JSON, then the route's own model and rules
        read = InputIn.model_validate(json.loads(body))
        input_id = routes_inputs.input_id_of(read.input_id, headers.get("idempotency-key"))
        validate_input(session_id, read.text, read.delivery, input_id, read.project)
    except (ValueError, RecursionError, BadInput):  # ValueError: bad JSON, UTF-8 or shape
        return None
    return Admission(token, session_id, read, input_id)


async def read_body(receive: Receive) -> tuple[list[Message], bytes | None, Exception | None]:
    """The messages read (to hand on), the body if it came whole, and what cut it short (the bound)."""
    received: list[Message] = []
    try:
        while not received or received[-1].get("more_body", False):
            received.append(await receive())
            if received[-1]["type"] != "http.request":  # the client went away
                return received, None, None
    except Exception as exc:  # BoundedBody's 413, raised again to the route, which answers it
        return received, None, exc
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


async def admit(
    ctx: Context, scope: Scope, admission: Admission, receive: Receive, send: Send, known: KnownTokens
) -> None:
    """Admit, and answer as the route would: 202 with the admission, or the store's refusal."""
    body = admission.body
    try:
        with one_answer(admission.session_id):
            admitted = await ops.send_as(
                ctx,
                admission.token,
                admission.session_id,
                body.text,
                delivery=body.delivery,
                input_id=admission.input_id,
                project=body.project,
            )
    except Unauthorized as exc:
        known.discard(admission.token)
        refusal = errors.answer(not_live(Request(scope)) if exc.who is None else lacks(exc.who, exc.scope))
    except RemError as exc:
        refusal = errors.answer(exc)
    except Exception as exc:  # in front of FastAPI's stack: the 500 its error layer would answer
        refusal = errors.internal(exc)
    else:
        content = InputAdmitted.model_validate(admitted).model_dump_json().encode()
        headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(content))]
        headers += [
            (k.lower().encode(), v.encode()) for k, v in routes_inputs.answer_headers(admitted).items()
        ]
        await send({"type": "http.response.start", "status": 202, "headers": headers})
        await send({"type": "http.response.body", "body": content})
        return
    await refusal(scope, receive, send)


class KnownTokens:
    """The bearers that were live tokens with the `write` scope when last seen, by digest: only
    those reach the admission's write transaction. Another bearer is read first, outside it, so
    requests with a made-up token never queue for the store's writer; a revoked one leaves at its
    first refusal there. Bounded: emptied when full (the next request of each reads again)."""

    LIMIT = 1024

    def __init__(self) -> None:
        self.digests: set[str] = set()

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
    """An ASGI middleware: the hot path of `POST /v1/sessions/{session_id}/inputs` (see the module)."""

    def __init__(self, app: ASGIApp, ctx: Context) -> None:
        self.app, self.ctx = app, ctx
        self.known = KnownTokens()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = (
            PATH.fullmatch(scope["path"]) if scope["type"] == "http" and scope["method"] == "POST" else None
        )
        if path is None or self.ctx.read_only:  # read-only: the route refuses after the token
            await self.app(scope, receive, send)
            return
        received, body, error = await read_body(receive)
        admission = None if body is None else admission_of(path[1], headers_of(scope), body)
        if admission is None or not await self.known.vouch(self.ctx, admission.token):
            await self.app(scope, replay(received, error, receive), send)
            return
        scope["route"] = ROUTE  # what Metered counts it under
        await admit(self.ctx, scope, admission, receive, send, self.known)
