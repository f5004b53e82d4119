"""Operator-facing library: one function per `rem` command, shared by CLI, console and daemons.

Each function takes a `Context`, checks its preconditions against the
database at the moment it runs, journals what it did in `event` (same
transaction as the effect) and returns its typed result
(`backend.ops.results`: a TypedDict, so `--json` prints it as it is). Actions
refuse to run from a read-only context before touching anything.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import weakref
from collections.abc import AsyncIterator, Callable, Collection
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any, cast

from backend.chroma import server as chroma_server
from backend.chroma import trust
from backend.core import clock
from backend.core.errors import (
    BadInput,
    ChromaUnreachable,
    ChromaUntrusted,
    NotChroma,
    NotFound,
    ReadOnly,
    Refused,
    RemError,
    UsageError,
)
from backend.execution import sessions
from backend.execution.sessions import Delivery
from backend.ops.operator_input import journal_text, operator_id
from backend.ops.records import ChromaHealth, RefusedListener, ReplayReport, Snapshot, Status
from backend.runtime import refusals
from backend.runtime.context import Context
from backend.store.db import Conn, Database, Query, read_ahead_sync
from backend.store.events import EventKind, append_event, append_event_sync
from backend.store.schema import schema_version, schema_version_sync, supported_version
from backend.store.workers import LeaseKind

if TYPE_CHECKING:
    from backend.ops.results import DrainReport, LeaseReleased, ResumeReport
    from backend.ops.snapshot import ListLimits, SnapshotCache

log = logging.getLogger("rem.ops")


async def init(ctx: Context) -> dict[str, Any]:
    """Create the data dir and migrate the state store (state.db, or PostgreSQL) to the current schema."""
    ctx.require_writable("init")
    existed = await _store_has_schema(ctx) if ctx.db_url else ctx.data.exists()
    db = await ctx.db()
    return {
        "data_dir": str(ctx.data.root),
        "state_db": ctx.store_name,  # the state.db path, or the PostgreSQL URL (no password)
        "store": "postgresql" if ctx.db_url else "sqlite",
        "schema_version": await schema_version(db),
        "created": not existed,
    }


async def _store_has_schema(ctx: Context) -> bool:
    """Whether the PostgreSQL database already holds rem's schema (any version), before migrating."""
    assert ctx.db_url is not None
    db = await Database.connect(ctx.db_url, read_only=True)
    try:
        return await schema_version(db) > 0
    finally:
        await db.close()


def chroma_health(ctx: Context) -> ChromaHealth:
    """Where Chroma is and whether it answers, without starting a server.

    Down is a state to report; a URL the operator gave that is malformed or
    is not Chroma at all is a usage error and raises.
    """
    external = chroma_server.external_url(ctx.chroma_url)
    is_external = external is not None
    url = external if is_external else chroma_server.recorded_url(ctx.data)
    health = ChromaHealth(url=url, external=is_external, healthy=False, error=None, refused=None)
    if not is_external:
        health["lock_held"] = chroma_server.lock_is_held(ctx.data)
        pid = chroma_server.read_lock_info(ctx.data).get("pid") if health["lock_held"] else None
        health["pid"] = cast(int | None, pid)  # as the lock file says
    if url is None:
        health["error"] = "no Chroma server recorded for this data dir; `rem up` starts one"
    else:
        _heartbeat(url, is_external, health)
    return health


def _heartbeat(url: str, is_external: bool, health: ChromaHealth) -> None:
    """Whether Chroma at `url` answers, into `health` (a named URL that is not Chroma's raises)."""
    try:
        if not is_external:
            # another uid on the recorded port is not this data dir's server: checked before
            # the heartbeat, so it is sent nothing
            trust.check_listener(url, absent_ok=True)
        chroma_server.heartbeat(url, timeout=1.0)
        health["healthy"] = True
    except NotChroma:
        if is_external:
            raise
        health["error"] = f"{url} (from chroma.url) is not a Chroma server"
    except ChromaUntrusted as exc:
        health["error"] = str(exc)
        health["refused"] = _refused(exc, None)
    except ChromaUnreachable as exc:
        health["error"] = str(exc)


def _refused(exc: ChromaUntrusted, row: Any) -> RefusedListener:
    data = refusals.refusal_data(exc)
    return RefusedListener(
        url=str(exc.url),
        uids=data["uids"],
        users=data["users"],
        pids=data["pids"],
        error=data["error"],
        since=None if row is None else int(row[1]),
        event_id=None if row is None else int(row[0]),
    )


def still_refused(ctx: Context, row: Any) -> RefusedListener | None:
    """The newest journaled refusal (`row`: refusals.LATEST_SQL), while what it refused still listens there."""
    if row is None or row[2] != EventKind.CHROMA_UNTRUSTED or chroma_server.external_url(ctx.chroma_url):
        return None
    try:
        url = json.loads(row[4] or "{}").get("url")
    except ValueError:
        return None
    refusal = chroma_server.listener_refusal(ctx.data, url) if isinstance(url, str) else None
    return None if refusal is None else _refused(refusal, row)


# one per open Database: what its last snapshot read (gone with the Database)
_SNAPSHOT_CACHES: weakref.WeakKeyDictionary[Database, SnapshotCache] = weakref.WeakKeyDictionary()


async def status(
    ctx: Context,
    *,
    chroma: ChromaHealth | None = None,
    limits: ListLimits | None = None,
    projects: Collection[str] | None = None,
) -> Status:
    """The snapshot the console shows: backlog, leases, receipts, Dream drift, workers, Chroma.

    `chroma`: Chroma's health as the caller read it last; None asks Chroma now (an HTTP
    heartbeat and a look at who listens on its port: the console asks every few seconds, not
    on each of its refreshes). `limits`: the rows read of each list (`ListLimits`: what a
    console's panels show; default `LIST_CAP` each, what `rem status` prints). With
    `projects` (an API token's), every listed row of another project's session is left out
    (`backend.ops.status_scope`); the fleet's own health and figures stay.
    """
    found = await _status(ctx, chroma, limits)
    if projects is None:
        return found
    from backend.ops import status_scope  # import time: only for a caller kept to projects

    db = await ctx.db()
    ids = status_scope.listed_sessions(found)
    reached = await db.read_in_thread(lambda conn: status_scope.sessions_in_sync(conn, ids, projects))
    return status_scope.keep_to(found, reached)


async def _status(ctx: Context, chroma: ChromaHealth | None, limits: ListLimits | None) -> Status:
    # import time: the status snapshot, only for status and metrics
    from backend.ops.snapshot import SnapshotCache, snapshot_sync
    from backend.ops.throughput import journal_tally

    db = await ctx.db()
    cache = _SNAPSHOT_CACHES.get(db)
    if cache is None:
        cache = _SNAPSHOT_CACHES[db] = SnapshotCache()
    tally = await journal_tally(ctx, db)

    def read_sync(conn: Conn) -> tuple[Snapshot, int, Any]:
        # one hop to the database thread for all of it: under load each hop is a wait for a
        # scheduler slot, so the snapshot, the events since the last fold and the schema
        # version are read together (the tally sees the same view as the snapshot); on PostgreSQL
        # what they send is known ahead: one round trip for nearly all of it, not one a statement
        now = clock.now_ms()
        reading = read_ahead_sync(
            conn, lambda: _status_reads_sync(conn, now, limits, cache.rows.get("taken"))
        )
        snap = snapshot_sync(reading, now, cache=cache, limits=limits)
        tally.fold_sync(reading)
        return snap, schema_version_sync(reading), reading.execute(refusals.LATEST_SQL).fetchone()

    if chroma is None:  # the Chroma heartbeat (blocking HTTP, 1 s timeout when Chroma hangs) beside the read
        read, chroma = await asyncio.gather(
            db.read_in_thread(read_sync), asyncio.to_thread(chroma_health, ctx)
        )
    else:  # as read before (a copy: this snapshot's own); no tasks to gather (the console's every refresh)
        read, chroma = await db.read_in_thread(read_sync), cast(ChromaHealth, dict(chroma))
    snap, version, refusal = cast(tuple[Snapshot, int, Any], read)
    if chroma["refused"] is None and refusal is not None and refusal[2] == EventKind.CHROMA_UNTRUSTED:
        chroma["refused"] = await asyncio.to_thread(still_refused, ctx, refusal)
    fields: dict[str, Any] = {
        **snap,
        "data_dir": str(ctx.data.root),
        "schema_version": version,
        "schema_version_supported": supported_version(db),
        "read_only": ctx.read_only,
        "throughput": tally.as_dict(),
        "chroma": chroma,
    }
    result = cast(Status, fields)
    if ctx.db_url:
        # import time: psycopg, only for a PostgreSQL store
        from backend.store.changes import feed_of

        result["change_feed"] = feed_of(ctx.db_url)
    return result


def _status_reads_sync(
    conn: Conn, now: int, limits: ListLimits | None, taken: dict[str, int] | None
) -> list[Query]:
    """What `_status` reads on PostgreSQL, known ahead (`db.read_ahead_sync`): the snapshot's
    statements (`taken`: what its windowed lists read last time), the journal's newest id (the
    tally's fold), the schema version, Chroma's refusal."""
    # import time: the status snapshot, only for status and metrics; psycopg, only for PostgreSQL
    from backend.ops.snapshot_reads import snapshot_reads_sync
    from backend.ops.throughput import LAST_ID_SQL
    from backend.store import schema_pg

    return [
        *snapshot_reads_sync(conn, now, limits, taken),
        (LAST_ID_SQL, ()),
        (schema_pg.VERSION_TABLE_SQL, ()),
        (schema_pg.VERSION_SQL, ()),  # the table is there: the snapshot's tables come with it
        (refusals.LATEST_SQL, ()),
    ]


# what `rem release --kind` accepts
LEASE_KINDS = tuple(LeaseKind)


@asynccontextmanager
async def refusals_journaled(ctx: Context, action: str, target: str | None) -> AsyncIterator[None]:
    """Journal an operator action's refusal (`operator.refused`) in a transaction of its own.

    The refused action's own transaction has rolled back, so this is the only
    trace of the attempt. A read-only rem writes nothing, not even this; and
    if the journal cannot be written (say the database is locked) the
    original refusal is what the operator sees.
    """
    try:
        yield
    except (Refused, NotFound) as exc:
        if not (ctx.read_only or isinstance(exc, ReadOnly)):
            await _journal_refusal(ctx, action, journal_text(target), exc)
        raise


async def _journal_refusal(ctx: Context, action: str, target: str | None, exc: RemError) -> None:
    """Append `operator.refused` for `exc`; a journal that cannot be written is only logged."""
    try:
        db = await ctx.db()
        async with db.tx() as conn:
            await append_event(
                conn,
                kind=EventKind.OPERATOR_REFUSED,
                actor=ctx.operator,
                target=target,
                data={"action": action, "error": type(exc).__name__, "reason": journal_text(str(exc))},
            )
    except RemError:
        log.warning("could not journal the refused %s of %s", action, target, exc_info=True)


async def drain(
    ctx: Context,
    owner_id: str,
    *,
    wait: bool = False,
    timeout_s: float = 60.0,
    progress: Callable[[DrainReport], None] | None = None,
) -> DrainReport:
    """Ask a worker to drain: stop claiming, finish or hand back its work, release, exit.

    With `wait`, block until the worker has marked itself stopped (or the
    timeout passes), calling `progress` with its state and leases held.
    """
    # import time: the drain protocol, only for rem drain
    from backend.ops.draining import request_drain, wait_drained

    owner_id = operator_id("worker id", owner_id)
    ctx.require_writable(f"drain {owner_id}")
    db = await ctx.db()
    async with refusals_journaled(ctx, "drain", owner_id):
        requested = await request_drain(db, owner_id, ctx.operator)
    if not wait:
        return requested
    return await wait_drained(db, requested, timeout_s=timeout_s, progress=progress)


async def release(
    ctx: Context,
    lease_id: str,
    *,
    kind: LeaseKind | str | None = None,
    expected_epoch: int | None = None,
    force: bool = False,
) -> LeaseReleased:
    """Expire a lease now and bump its epoch, so another worker takes over at once.

    Refused when the lease's epoch is not `expected_epoch` (it was renewed or
    taken over since the operator looked) unless `force`. The old owner's
    late writes are fenced by the new epoch; the takeover follows the normal
    recovery path. `kind` defaults to whichever lease `lease_id` names.
    """
    # import time: the lease release, only for rem release
    from backend.ops.lease_release import lease_kind_sync, release_lease_sync

    lease_id = operator_id("lease id", lease_id)
    ctx.require_writable(f"release {lease_id}")
    if kind is not None and kind not in LEASE_KINDS:
        raise UsageError(f"unknown lease kind {kind!r}; use one of {', '.join(LeaseKind)}")
    db = await ctx.db()

    def release_sync(conn: Conn) -> LeaseReleased:
        named = LeaseKind(kind) if kind else lease_kind_sync(conn, lease_id)
        now = clock.now_ms()
        return release_lease_sync(
            conn, named, lease_id, expected_epoch=expected_epoch, force=force, actor=ctx.operator, now=now
        )

    async with refusals_journaled(ctx, "release", lease_id):
        return await db.write_in_thread(release_sync)


async def check(
    ctx: Context,
    *,
    settled: bool = False,
    verify_chroma: bool = True,
    progress: Callable[[str, int, int], None] | None = None,
) -> dict[str, Any]:
    """Verify the invariants (docs/architecture.md#guarantees-and-invariants) on the live data dir.

    `settled=True` also counts in-flight work as a violation (for use once load
    has stopped and leases have expired or been released). `verify_chroma`
    compares every staged receipt and Dream overlay with its Chroma row.
    `progress(phase, done, total)` is called as the batches go.
    """
    # import time: the checks, only for rem check
    from backend.ops.checks import check_chroma, check_database_in_batches, summarize
    from backend.store.journal_head import read_heads

    db = await ctx.db()
    recorded = read_heads(ctx.data).get(ctx.store_name)
    report = await check_database_in_batches(db, progress=progress, recorded=recorded)
    if verify_chroma:
        tell = progress or (lambda phase, done, total: None)
        tell("chroma", 0, 1)
        await check_chroma(ctx, db, report)
        tell("chroma", 1, 1)
    result = summarize(report, settled=settled)
    result["data_dir"] = str(ctx.data.root)
    return result


async def replay(
    ctx: Context, summary_ids: list[str] | None = None, *, all_mismatched: bool = False, dry_run: bool = False
) -> ReplayReport:
    """Replay summary receipts into Chroma with no model call; `dry_run` only reports the diff."""
    # import time: the receipt replay, only for rem replay
    from backend.summaries import receipt_replay

    if bool(summary_ids) == all_mismatched:
        raise BadInput("name the receipts to replay (SUMMARY_ID ...) or pass --all, not both and not neither")
    summary_ids = [operator_id("summary id", sid) for sid in summary_ids or []] or None
    if not dry_run:
        ctx.require_writable("replay")
    db = await ctx.db()
    store = ctx.store()
    await store.count()  # Chroma down: say so now, before anything is read or written
    targets = ", ".join(summary_ids) if summary_ids else "all"
    # a dry run is a look, not an action: nothing to journal, refused or not
    async with contextlib.nullcontext() if dry_run else refusals_journaled(ctx, "replay", targets):
        report = await receipt_replay.replay_receipts(
            db, store, actor=ctx.operator, summary_ids=summary_ids, dry_run=dry_run
        )
    return report.as_dict()


async def send(
    ctx: Context,
    session_id: str,
    text: str,
    *,
    delivery: str = Delivery.QUEUE,
    input_id: str | None = None,
    project: str | None = None,
    projects: Collection[str] | None = None,
) -> dict[str, Any]:
    """Admit an input into a session (idempotent on its id); bad input writes nothing, not even state.db.

    `projects` keeps the caller to those projects (an API token): another project's session is
    not found, and a new session goes to the project named, or to the only one reached.
    """
    ctx.require_writable("send")
    sessions.validate_input(session_id, text, delivery, input_id, project)
    return await sessions.admit(
        await ctx.db(),
        session_id,
        text,
        delivery=delivery,
        input_id=input_id,
        actor=ctx.operator,
        project=project,
        projects=projects,
    )


async def metrics(ctx: Context, *, openmetrics: bool = True) -> str:
    """One scrape: the status snapshot as Prometheus metrics (OpenMetrics text unless told otherwise)."""
    # import time: prometheus_client, only for metrics
    from backend.ops.prometheus import exposition

    return exposition(await status(ctx), openmetrics=openmetrics).decode()


async def resume(
    ctx: Context, session_ids: list[str] | None = None, *, all_held: bool = False, reask: bool = True
) -> ResumeReport:
    """Lift the hold a model error put on sessions (a bad key, an unknown model), once it is fixed.

    Their waiting inputs run again; with `reask`, the prompt the failing turn
    answered with an error is asked again as a new input. Refused when a
    named session is not held.
    """
    # import time: the model turns, only for rem resume
    from backend.execution.model_turns import resume_sync
    from backend.ops.results import ResumeReport

    if bool(session_ids) == all_held:
        raise BadInput(
            "name the held sessions to resume (SESSION ...) or pass --all, not both and not neither"
        )
    ctx.require_writable("resume")
    db = await ctx.db()
    names = None if all_held else list(dict.fromkeys(operator_id("session id", s) for s in session_ids or []))

    def resume_journaled_sync(conn: Conn) -> ResumeReport:
        now = clock.now_ms()
        resumed = resume_sync(conn, names, reask=reask, actor=ctx.operator, now=now)
        for item in resumed:
            append_event_sync(
                conn,
                kind=EventKind.OPERATOR_RESUME,
                actor=ctx.operator,
                session_id=item["session_id"],
                target=item["session_id"],
                now=now,
                data=dict(item),
            )
        return ResumeReport(resumed=resumed, count=len(resumed), reask=reask, resumed_at=now)

    async with refusals_journaled(ctx, "resume", "--all" if names is None else ",".join(names)):
        return await db.write_in_thread(resume_journaled_sync)


async def show(ctx: Context, session_id: str, *, last: int = 0) -> dict[str, Any]:
    """One session's transcript: messages, parts, usage, cost, model errors, recovery markers."""
    # import time: the transcript, only for rem show
    from backend.ops.transcript import transcript_sync

    db = await ctx.db()
    return await db.read_in_thread(lambda conn: transcript_sync(conn, session_id, last))
