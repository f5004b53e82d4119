"""The model-health and usage blocks of the status snapshot (what the console header shows).

Model health comes from `model_call`, one row per request attempt, over a
recent window (`WINDOW_MS`, at most `WINDOW_ROWS` attempts): requests,
errors by class, retries, the last error, and the time to first token of
streamed replies (p50/p95). Its `state`:

* `down`: the last `DOWN_AFTER` attempts all failed, or the last one failed in
  a way only an operator can fix (a bad key, an unknown model, no quota);
* `degraded`: at least `DEGRADED_RATE` of the window's attempts failed;
* `ok`: otherwise; `idle`: no attempt in the window; `unused`: none ever.

Usage comes from the session totals (the session table's usage columns, written with each
reply): the sessions that used a model or failed to, by cost, and the total.
Both are typed records (`backend.ops.records`): a metrics exporter reads the same snapshot.
"""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

from backend.models.errors import NEEDS_OPERATOR
from backend.models.health import OK, CallKind, ModelState
from backend.ops.records import HeldSession, LastModelError, ModelHealth, SessionUsage, Usage
from backend.store import counters
from backend.store.counters import USAGE_TOKENS as TOKENS
from backend.store.counters import USAGE_WHERE
from backend.store.db import Conn, Row

WINDOW_MS = 5 * 60_000
WINDOW_ROWS = 2000
DOWN_AFTER = 3
DEGRADED_RATE = 0.05
USAGE_CAP = 500

CALLS_SQL = """
SELECT time, kind, endpoint, model, session_id, attempt, outcome, status, ttft_ms, error
FROM model_call WHERE time >= :since ORDER BY time DESC LIMIT :cap"""
LAST_CALL_SQL = "SELECT max(time) FROM model_call"
USAGE_SESSIONS_SQL = f"""
SELECT id AS session_id, title, model, turn_count, tokens_input, tokens_output, tokens_reasoning,
       tokens_cache_read, tokens_cache_write, cost, model_error, held_at, time_updated
FROM session INDEXED BY session_usage_idx WHERE {USAGE_WHERE} ORDER BY cost DESC LIMIT :cap"""
HELD_SQL = """
SELECT s.id AS session_id, s.held_at, s.held_reason,
       (SELECT count(*) FROM session_input AS i
        WHERE i.session_id = s.id AND i.promoted_seq IS NULL) AS waiting
FROM session AS s INDEXED BY session_held_idx WHERE s.held_at IS NOT NULL ORDER BY s.held_at LIMIT :cap"""
QUERIES = {
    "model_calls": CALLS_SQL,
    "usage_sessions": USAGE_SESSIONS_SQL,
    "held": HELD_SQL,
}


def _percentile(ordered: list[float], q: float) -> float | None:
    if not ordered:
        return None
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 1)


def _state(rows: list[Row], errors: int, last_call_at: int | None) -> ModelState:
    if not rows:
        return ModelState.IDLE if last_call_at is not None else ModelState.UNUSED
    newest = rows[:DOWN_AFTER]
    if rows[0]["outcome"] in NEEDS_OPERATOR or (
        len(newest) == DOWN_AFTER and all(r["outcome"] != OK for r in newest)
    ):
        return ModelState.DOWN
    return ModelState.DEGRADED if errors / len(rows) >= DEGRADED_RATE else ModelState.OK


def model_health_sync(conn: Conn, now: int) -> ModelHealth:
    """The endpoint's health over the recent window (rows newest first)."""
    rows = conn.execute(CALLS_SQL, {"since": now - WINDOW_MS, "cap": WINDOW_ROWS}).fetchall()
    last_call_at = conn.execute(LAST_CALL_SQL).fetchone()[0]
    failed = [r for r in rows if r["outcome"] != OK]
    ttft = sorted(r["ttft_ms"] for r in rows if r["ttft_ms"] is not None and r["kind"] == CallKind.CHAT)
    return {
        "state": _state(rows, len(failed), last_call_at),
        "window_ms": WINDOW_MS,
        "endpoints": sorted({r["endpoint"] for r in rows}),
        "models": sorted({r["model"] for r in rows}),
        "requests": len(rows),
        "errors": len(failed),
        "error_rate": round(len(failed) / len(rows), 4) if rows else 0.0,
        "errors_by_class": dict(Counter(r["outcome"] for r in failed)),
        "retries": sum(1 for r in rows if r["attempt"] > 1),
        "requests_by_kind": dict(Counter(r["kind"] for r in rows)),
        "ttft_ms_p50": _percentile(ttft, 0.5),
        "ttft_ms_p95": _percentile(ttft, 0.95),
        "last_error": _error_record(failed[0]) if failed else None,
        "last_call_at": last_call_at,
    }


def _error_record(call: Row) -> LastModelError:
    """A failed call as `last_error` shows it."""
    return {
        "time": call["time"],
        "error_class": call["outcome"],
        "status": call["status"],
        "message": call["error"],
        "kind": call["kind"],
        "session_id": call["session_id"],
    }


def _last_error(raw: str | None) -> dict[str, Any] | None:
    try:
        value = json.loads(raw) if raw else None
    except ValueError:
        return {"message": raw}
    return value if isinstance(value, dict) else None


def _session_usage(r: Row) -> SessionUsage:
    """One session's row of `USAGE_SESSIONS_SQL` as `rem status` lists it."""
    tokens = {name: int(r[f"tokens_{name}"]) for name in TOKENS}
    return {
        "session_id": r["session_id"],
        "title": r["title"],
        "model": r["model"],
        "turns": r["turn_count"],
        "tokens": tokens,
        "tokens_total": sum(tokens.values()),
        "cost": float(r["cost"]),
        "last_error": _last_error(r["model_error"]),
        "held": r["held_at"] is not None,
        "time_updated": r["time_updated"],
    }


def usage_sync(conn: Conn, counts: dict[str, Any] | None = None, cap: int = USAGE_CAP) -> Usage:
    """Tokens and cost: the `cap` sessions that used a model (or failed to), costliest first, and the
    total (from the status counters: `counts`, as `counters.counts_sync` read them, or read here)."""
    sessions = [_session_usage(r) for r in conn.execute(USAGE_SESSIONS_SQL, {"cap": cap})] if cap > 0 else []
    if counts is None:
        counts, _ = counters.counts_sync(conn)
    return {
        "total": {  # kept by triggers (schema v8): one small read at any number of sessions
            "sessions": int(counts["usage_sessions"]),
            # a running sum of doubles: rounded past its last bits, so it reads the same however summed
            "cost": round(float(counts["usage_cost"]), 10),
            "tokens": {name: int(counts[f"usage_tokens_{name}"]) for name in TOKENS},
        },
        "sessions": sessions,
    }


def held_sync(conn: Conn, now: int) -> list[HeldSession]:
    """Sessions held after a model error that needs an operator, oldest hold first."""
    return held_records(held_rows_sync(conn, USAGE_CAP), now)


def held_rows_sync(conn: Conn, cap: int) -> list[dict[str, Any]]:
    """The rows of the `cap` oldest holds (what does not depend on the clock)."""
    if cap <= 0:
        return []
    return [dict(r) for r in conn.execute(HELD_SQL, {"cap": cap})]


def held_records(rows: list[dict[str, Any]], now: int) -> list[HeldSession]:
    """The held sessions of `held_rows_sync`'s rows, as of `now`."""
    out: list[HeldSession] = []
    for r in rows:
        reason = r["held_reason"] or ""
        out.append(
            {
                "session_id": r["session_id"],
                "held_at": r["held_at"],
                "held_ms": now - r["held_at"],
                "reason": reason,
                "error_class": reason.split(":", 1)[0] if ":" in reason else None,
                "waiting": r["waiting"],
            }
        )
    return out
