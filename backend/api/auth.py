"""Who a request is: its bearer token as a `Principal`, and the scope a route needs.

Every route but `/healthz` depends on `principal` (or `require(scope)`): a
missing, malformed, unknown or revoked token is a 401 carrying
`WWW-Authenticate: Bearer` with the protected-resource metadata's URL (RFC
9728, what an MCP client follows); a token without the route's scope is a
403. The token itself is never logged, echoed or put in an error.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable, Mapping
from typing import Annotated

from fastapi import Depends, Request, Security
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from backend import ops
from backend.api.errors import ApiError
from backend.ops.tokens import Principal
from backend.runtime.context import Context

METADATA_PATH = "/.well-known/oauth-protected-resource"
# only for the OpenAPI document (its security scheme); `principal` reads the header itself, so a
# missing token is rem's 401 with the challenge, not FastAPI's
BEARER = HTTPBearer(
    auto_error=False,
    scheme_name="token",
    description="A token from `rem token create`, as `Authorization: Bearer TOKEN`.",
)


def context_of(request: Request) -> Context:
    """The server's library `Context` (one per process, made by `app.create_app`)."""
    ctx: Context = request.app.state.ctx
    return ctx


def challenge(request: Request, error: str | None = None) -> dict[str, str]:
    """The `WWW-Authenticate` header of a 401: Bearer, with where the resource metadata is."""
    base = str(request.base_url).rstrip("/")
    value = f'Bearer realm="rem", resource_metadata="{base}{METADATA_PATH}"'
    if error:
        value += f', error="{error}"'
    return {"WWW-Authenticate": value}


def bearer_of(headers: Mapping[str, str]) -> str | None:
    """The request's bearer token, or None when it carries none (or another scheme)."""
    header = headers.get("authorization", "")
    scheme, _, value = header.partition(" ")
    if scheme.lower() != "bearer" or not value.strip():
        return None
    return value.strip()


def acting(ctx: Context, who: Principal) -> Context:
    """The server's Context with the token's name as the operator: what a request writes is
    journaled as that token's doing (the Database and Chroma connections are shared)."""
    return dataclasses.replace(ctx, operator=who.name)


async def principal(
    request: Request, _scheme: Annotated[HTTPAuthorizationCredentials | None, Security(BEARER)] = None
) -> Principal:
    """The request's token as a Principal; a 401 (with the challenge) when there is none that is live."""
    token = bearer_of(request.headers)
    if token is None:
        raise ApiError(
            401,
            "unauthorized",
            "this request needs `Authorization: Bearer TOKEN`; create one with `rem token create`",
            challenge(request),
        )
    who = await ops.authenticate(context_of(request), token)
    if who is None:
        raise not_live(request)
    request.state.principal = who
    return who


def not_live(request: Request) -> ApiError:
    """The 401 for a bearer that is no live token."""
    return ApiError(
        401,
        "unauthorized",
        "the bearer token is not a live rem token (revoked, mistyped, or of another store)",
        challenge(request, "invalid_token"),
    )


def lacks(who: Principal, scope: str) -> ApiError:
    """The 403 for a token without the scope a route needs."""
    return ApiError(
        403,
        "insufficient_scope",
        f"token {who.name!r} lacks the {scope!r} scope; create one with `--scope {scope}`",
    )


Caller = Annotated[Principal, Depends(principal)]


def require(scope: str) -> Callable[[Request], Awaitable[Principal]]:
    """A dependency: the request's Principal, refused with 403 unless its token holds `scope`."""

    async def scoped(
        request: Request, _scheme: Annotated[HTTPAuthorizationCredentials | None, Security(BEARER)] = None
    ) -> Principal:
        who = await principal(request)
        if not who.may(scope):
            raise lacks(who, scope)
        return who

    return scoped


Reader = Annotated[Principal, Depends(require("read"))]
Writer = Annotated[Principal, Depends(require("write"))]
Decider = Annotated[Principal, Depends(require("decide"))]
