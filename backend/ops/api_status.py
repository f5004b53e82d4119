"""The API servers (`rem serve`) in the status snapshot: where each listens and what it answered.

Each live server writes its request counters into its worker row's `info` at the heartbeats that
changed them (`backend.api.stats`: never per request). This reads them back for `rem status
--json`'s `api` object and for `rem metrics` (`rem_api_*`): one scrape target for the whole
fleet, whatever the number of servers, each server's counters a series of its own (labelled
with its owner id), which restart from zero with the process, as Prometheus counters may.

What a row holds is data another process wrote: every field is type-checked, every label
made inert and bounded, every list capped; a row that is not what a server writes is listed
with nothing counted. A server that died (its heartbeat stale) is not listed.
"""

from __future__ import annotations

import json
import math
from typing import Any

from backend.core.inert import visible
from backend.ops.records import ApiLatency, ApiRequestCount, ApiServerRecord, ApiStatus
from backend.store import workers
from backend.store.db import Conn

QUERIES: dict[str, str] = {
    "api_servers": """
        SELECT owner_id, state, heartbeat_at, exited_at, info
        FROM worker INDEXED BY worker_state_heartbeat_idx
        WHERE state IN ('running', 'draining') AND role = 'server'
        ORDER BY started_at, owner_id LIMIT :cap""",
}
# servers listed, and series kept from one server's row: far above what a server writes
SERVER_CAP = 50
SERIES_CAP = 500
LABEL_CHARS = 120


def servers_sync(conn: Conn, now: int) -> ApiStatus:
    """The live servers' records, in the order they started."""
    cursor = conn.execute(QUERIES["api_servers"], {"cap": SERVER_CAP})
    listed = [
        server_record(row["owner_id"], row["info"])
        for row in cursor.fetchall()
        if workers.worker_alive(row["state"], row["heartbeat_at"], row["exited_at"], now)
    ]
    return {"servers": listed}


def _count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


def _label(value: Any) -> str:
    return visible(str(value))[:LABEL_CHARS]


def server_record(owner_id: str, raw: str | None) -> ApiServerRecord:
    """One server's `info`, checked field by field (what is not as a server writes it counts nothing)."""
    try:
        info = json.loads(raw) if raw else {}
    except ValueError:
        info = {}
    if not isinstance(info, dict):
        info = {}
    ratio = info.get("server_error_ratio")
    listen = info.get("listen")
    return {
        "owner_id": owner_id,
        "url": _label(listen) if isinstance(listen, str) else None,
        "requests_in_flight": _count(info.get("requests_in_flight")),
        "streams_open": _count(info.get("streams_open")),
        "server_error_ratio": float(ratio)
        if isinstance(ratio, int | float) and not isinstance(ratio, bool) and 0 <= ratio <= 1
        else 0.0,
        "requests": _requests(info.get("requests")),
        "latency": _latencies(info.get("latency")),
    }


def _requests(rows: Any) -> list[ApiRequestCount]:
    out: list[ApiRequestCount] = []
    for row in rows[:SERIES_CAP] if isinstance(rows, list) else []:
        if isinstance(row, dict) and _count(row.get("code")) and _count(row.get("count")):
            out.append(
                {
                    "method": _label(row.get("method")),
                    "route": _label(row.get("route")),
                    "code": _count(row["code"]),
                    "count": _count(row["count"]),
                }
            )
    return out


def _latencies(rows: Any) -> list[ApiLatency]:
    out: list[ApiLatency] = []
    for row in rows[:SERIES_CAP] if isinstance(rows, list) else []:
        if not isinstance(row, dict):
            continue
        buckets, cumulative, total = row.get("buckets_s"), row.get("cumulative"), row.get("sum_s")
        if not (
            isinstance(buckets, list) and isinstance(cumulative, list) and len(buckets) == len(cumulative)
        ):
            continue
        if not all(isinstance(b, int | float) and math.isfinite(b) for b in buckets):
            continue
        out.append(
            {
                "method": _label(row.get("method")),
                "route": _label(row.get("route")),
                "buckets_s": [float(b) for b in buckets],
                "cumulative": [_count(c) for c in cumulative],
                "count": _count(row.get("count")),
                "sum_s": float(total) if isinstance(total, int | float) and math.isfinite(total) else 0.0,
            }
        )
    return out
