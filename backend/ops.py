"""Operator-facing library: one function per `rem` command, shared by CLI, console and daemons.

Each function takes a `Context`, checks its preconditions against the
database at the moment it runs, journals what it did in `event` (same
transaction as the effect) and returns a JSON-serialisable dict. Actions
refuse to run from a read-only context before touching anything.
"""

from __future__ import annotations

from typing import Any

from backend import chroma_server
from backend.context import Context
from backend.errors import BadInput, ChromaUnreachable, NotChroma, NotImplementedYet, RemError
from backend.schema import SCHEMA_VERSION, schema_version


async def init(ctx: Context) -> dict[str, Any]:
    """Create the data dir and migrate state.db to the current schema."""
    ctx.require_writable("init")
    existed = ctx.data.exists()
    db = await ctx.db()
    return {
        "data_dir": str(ctx.data.root),
        "state_db": str(ctx.data.state_db),
        "schema_version": await schema_version(db),
        "created": not existed,
    }


def chroma_health(ctx: Context) -> dict[str, Any]:
    """Where Chroma is and whether it answers, without starting a server.

    Down is a state to report; a URL the operator gave that is malformed or
    is not Chroma at all is a usage error and raises.
    """
    external = chroma_server.external_url(ctx.chroma_url)
    if external is not None:
        url, is_external = external, True
    else:
        url, is_external = chroma_server.recorded_url(ctx.data), False
    health: dict[str, Any] = {"url": url, "external": is_external, "healthy": False, "error": None}
    if not is_external:
        health["lock_held"] = chroma_server.lock_is_held(ctx.data)
        health["pid"] = chroma_server.read_lock_info(ctx.data).get("pid") if health["lock_held"] else None
    if url is None:
        health["error"] = "no Chroma server recorded for this data dir; `rem up` starts one"
        return health
    try:
        chroma_server.heartbeat(url, timeout=1.0)
        health["healthy"] = True
    except NotChroma:
        if is_external:
            raise
        health["error"] = f"{url} (from chroma.url) is not a Chroma server"
    except ChromaUnreachable as exc:
        health["error"] = str(exc)
    return health


async def status(ctx: Context) -> dict[str, Any]:
    """The snapshot the console shows: backlog, leases, receipts, Dream drift, workers, Chroma."""
    from backend.status import snapshot

    db = await ctx.db()
    async with db.snapshot() as conn:
        snap = await snapshot(conn)
    snap.update({
        "data_dir": str(ctx.data.root),
        "schema_version": await schema_version(db),
        "schema_version_supported": SCHEMA_VERSION,
        "read_only": ctx.read_only,
        "chroma": chroma_health(ctx),
    })
    return snap


def _not_yet(command: str) -> RemError:
    return NotImplementedYet(f"`rem {command}` is not implemented yet")


async def check(ctx: Context) -> dict[str, Any]:
    """Verify the invariants of DESIGN section 5 on the live data dir."""
    raise _not_yet("check")


async def replay(ctx: Context, summary_ids: list[str] | None = None, *, all_mismatched: bool = False,
                 dry_run: bool = False) -> dict[str, Any]:
    """Replay summary receipts into Chroma with no model call; `dry_run` only reports the diff."""
    from backend import replay as receipt_replay

    if bool(summary_ids) == all_mismatched:
        raise BadInput("name the receipts to replay (SUMMARY_ID ...) or pass --all, not both and not neither")
    if not dry_run:
        ctx.require_writable("replay")
    db = await ctx.db()
    store = ctx.store()
    await store.count()  # Chroma down: say so now, before anything is read or written
    report = await receipt_replay.replay_receipts(db, store, actor=ctx.operator,
                                                  summary_ids=summary_ids, dry_run=dry_run)
    return report.as_dict()
