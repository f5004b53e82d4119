"""The application API's bearer tokens (`rem token create|list|revoke`), and who a token is.

A token is `rem_` and 43 URL-safe characters (256 random bits). The store
keeps only its SHA-256 (`api_token.hash`), so every `rem serve` replica on
the same store knows every token, and a copy of the store gives nobody a
usable one. A plain hash is enough, and a slow one would only slow every
request: the secret is random, not a password, so there is nothing to guess.

Each token has a name (unique among live tokens; a revoked name may be
created again), the projects it reaches (a list, or all of them) and its
scopes: `read` (sessions, transcripts, events, recall, status), `write`
(admit inputs) and `decide` (approve, deny, resolve tool calls). Creating and
revoking are operator actions: journaled, hash-chained, never the secret nor
its hash. The secret is shown once, by `token_create`'s result; it is never
logged, never in argv, never in an error.

`send_as` is admission for a token's holder (the API's hot path): the token is
checked inside the admission's own transaction, so a revocation refuses the next
request on every replica without a read of its own.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import json
import re
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from backend.core import clock
from backend.core.errors import BadInput, NotFound, Refused, RemError
from backend.execution import sessions
from backend.execution.sessions import Delivery, validate_id
from backend.runtime.context import Context
from backend.store.db import Conn
from backend.store.events import EventKind, append_event_sync

SCOPES: tuple[str, ...] = ("read", "write", "decide")
DEFAULT_SCOPES: tuple[str, ...] = ("read",)
PREFIX = "rem_"
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
# a bearer value longer than any token rem makes is refused before it is hashed
MAX_TOKEN_CHARS = 128


class TokenNotFound(NotFound):
    """No live token has that name."""


class Unauthorized(RemError):
    """A bearer that is no live token (`who` None), or a live one without `scope`."""

    def __init__(self, who: Principal | None, scope: str) -> None:
        super().__init__(f"token {who.name!r} lacks the {scope!r} scope" if who else "not a live rem token")
        self.who, self.scope = who, scope


@dataclass(frozen=True)
class Principal:
    """Who a request's token says it is: its name, the projects it reaches (None: all), its scopes."""

    name: str
    token_id: str
    projects: frozenset[str] | None
    scopes: frozenset[str]

    def reaches(self, project: str) -> bool:
        """Whether the token may see `project`."""
        return self.projects is None or project in self.projects

    def may(self, scope: str) -> bool:
        """Whether the token holds `scope` (read, write, decide)."""
        return scope in self.scopes


def token_hash(token: str) -> str:
    """The SHA-256 (hex) the store keeps for a token."""
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()


def validate_name(name: str) -> str:
    """A token name: 1-64 letters, digits, `.`, `_`, `-`, starting with a letter or digit."""
    if not NAME_RE.match(name):
        raise BadInput(
            f"token name {name[:80]!r} is not valid: use 1-64 letters, digits, '.', '_' or '-' "
            "(starting with a letter or digit)"
        )
    return name


def validate_scopes(scopes: Sequence[str]) -> list[str]:
    """The scopes, known ones only, each once, in the canonical order; the default when none."""
    unknown = sorted(set(scopes) - set(SCOPES))
    if unknown:
        raise BadInput(f"unknown scope {unknown[0][:40]!r}: use read, write or decide (repeat --scope)")
    return [s for s in SCOPES if s in scopes] or list(DEFAULT_SCOPES)


def _projects(projects: Sequence[str] | None, all_projects: bool) -> list[str] | None:
    if all_projects and projects:
        raise BadInput("give either --project (repeatable) or --all-projects, not both")
    if all_projects:
        return None
    if not projects:
        raise BadInput("a token reaches named projects (--project P, repeatable) or --all-projects")
    return sorted({validate_id("project", p, "--project") for p in projects})


async def token_create(
    ctx: Context,
    name: str,
    *,
    projects: Sequence[str] | None = None,
    all_projects: bool = False,
    scopes: Sequence[str] = (),
) -> dict[str, Any]:
    """Create a token; the result holds the secret (`token`), which is shown this once."""
    ctx.require_writable(f"create token {name[:64]}")
    name = validate_name(name)
    reach = _projects(projects, all_projects)
    granted = validate_scopes(scopes)
    token = PREFIX + secrets.token_urlsafe(32)
    row = {
        "id": "tok_" + secrets.token_hex(6),
        "name": name,
        "projects": reach,
        "scopes": granted,
        "created_at": clock.now_ms(),
        "created_by": ctx.operator,
    }
    db = await ctx.db()
    await db.write_in_thread(lambda conn: _insert_sync(conn, row, token_hash(token)))
    return {**row, "token": token}


def _insert_sync(conn: Conn, row: dict[str, Any], digest: str) -> None:
    live = conn.execute(
        "SELECT id FROM api_token WHERE name = ? AND revoked_at IS NULL", (row["name"],)
    ).fetchone()
    if live is not None:
        raise Refused(
            f"a token named {row['name']!r} exists; revoke it first (`rem token revoke {row['name']}`) "
            "or choose another name"
        )
    conn.execute(
        "INSERT INTO api_token (id, name, hash, projects, scopes, created_at, created_by) "
        "VALUES (?, ?, ?, ?, ?, ?, ?)",
        (
            row["id"],
            row["name"],
            digest,
            None if row["projects"] is None else json.dumps(row["projects"]),
            json.dumps(row["scopes"]),
            row["created_at"],
            row["created_by"],
        ),
    )
    append_event_sync(
        conn,
        kind=EventKind.OPERATOR_TOKEN_CREATE,
        actor=row["created_by"],
        target=row["id"],
        now=row["created_at"],
        data={"name": row["name"], "projects": row["projects"], "scopes": row["scopes"]},
    )


async def token_list(ctx: Context, *, revoked: bool = False) -> list[dict[str, Any]]:
    """The live tokens (with `revoked`, the revoked ones too), oldest first; never a secret or hash."""
    db = await ctx.db()
    where = "" if revoked else " WHERE revoked_at IS NULL"
    rows = await db.fetchall(
        "SELECT id, name, projects, scopes, created_at, created_by, revoked_at FROM api_token"
        f"{where} ORDER BY created_at, id"
    )
    return [_listed(dict(r)) for r in rows]


def _listed(row: dict[str, Any]) -> dict[str, Any]:
    row["projects"] = None if row["projects"] is None else json.loads(row["projects"])
    row["scopes"] = json.loads(row["scopes"])
    return row


async def token_revoke(ctx: Context, name: str) -> dict[str, Any]:
    """Revoke the live token named `name`: every server refuses it from its next request."""
    ctx.require_writable(f"revoke token {name[:64]}")
    name = validate_name(name)
    db = await ctx.db()
    now, actor = clock.now_ms(), ctx.operator
    return await db.write_in_thread(lambda conn: _revoke_sync(conn, name, actor, now))


def _revoke_sync(conn: Conn, name: str, actor: str, now: int) -> dict[str, Any]:
    row = conn.execute(
        "SELECT id, name, projects, scopes, created_at, created_by FROM api_token "
        "WHERE name = ? AND revoked_at IS NULL",
        (name,),
    ).fetchone()
    if row is None:
        raise TokenNotFound(f"no live token named {name!r}; `rem token list` shows them")
    conn.execute("UPDATE api_token SET revoked_at = ? WHERE id = ?", (now, row["id"]))
    append_event_sync(
        conn,
        kind=EventKind.OPERATOR_TOKEN_REVOKE,
        actor=actor,
        target=row["id"],
        now=now,
        data={"name": name},
    )
    return {**_listed(dict(row)), "revoked_at": now}


def authenticate_sync(conn: Conn, bearer: str) -> Principal | None:
    """The live token `bearer` is, or None (unknown, revoked, malformed): one indexed read."""
    if not bearer.startswith(PREFIX) or len(bearer) > MAX_TOKEN_CHARS:
        return None
    digest = token_hash(bearer)
    row = conn.execute(
        "SELECT id, name, hash, projects, scopes FROM api_token WHERE hash = ? AND revoked_at IS NULL",
        (digest,),
    ).fetchone()
    if row is None or not hmac.compare_digest(row["hash"], digest):
        return None
    return principal_of(row["name"], row["id"], row["projects"], row["scopes"])


@functools.lru_cache(maxsize=256)
def principal_of(name: str, token_id: str, projects: str | None, scopes: str) -> Principal:
    """The Principal of a token row's columns (kept by their values: each admission's check reads the
    row again, and parsing its JSON was half the check's cost on the store's thread)."""
    return Principal(
        name,
        token_id,
        None if projects is None else frozenset(json.loads(projects)),
        frozenset(json.loads(scopes)),
    )


def authorize_sync(conn: Conn, bearer: str, scope: str) -> Principal:
    """The live token `bearer` is, holding `scope`, read in the caller's own transaction (a
    revocation committed before it is seen there); `Unauthorized` otherwise."""
    who = authenticate_sync(conn, bearer)
    if who is None or not who.may(scope):
        raise Unauthorized(who, scope)
    return who


async def authenticate(ctx: Context, bearer: str) -> Principal | None:
    """`authenticate_sync` on the context's store."""
    db = await ctx.db()
    return await db.read_in_thread(lambda conn: authenticate_sync(conn, bearer))


async def send_as(
    ctx: Context,
    token: str,
    session_id: str,
    text: str,
    *,
    delivery: str = Delivery.QUEUE,
    input_id: str | None = None,
    project: str | None = None,
    validated: bool = False,
) -> dict[str, Any]:
    """`send` for the holder of `token`, checked (live, with the `write` scope) inside the admission's
    own transaction: one trip to the store, and a revocation committed before it refuses it
    (`Unauthorized`); journaled as the token's name, kept to its projects. `validated`: the caller
    ran `sessions.validate_input` on these very values."""
    ctx.require_writable("send")

    def holder(conn: Conn) -> tuple[str, frozenset[str] | None]:
        who = authorize_sync(conn, token, "write")
        return who.name, who.projects

    db = await ctx.db()
    return await sessions.admit(
        db,
        session_id,
        text,
        delivery=delivery,
        input_id=input_id,
        project=project,
        caller=holder,
        validated=validated,
    )
