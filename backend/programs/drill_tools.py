"""The drill's agent tools (`rem drill sigkill --tools`): a tool-using load, an operator for the
unknown outcomes its kills leave, and the count of effects done twice, from the tool server's files.

The drill's system gets rem's demo tools server (`write_tools_config`, with the send `allow`ed: no
person approves during a drill, and a short send so kills land mid-call). A SIGKILLed executor
leaves its sends `unknown`; the drill resolves each as an operator would, from the server's own
outbox (the send is shielded: once started it finishes even when its caller dies): `done` when the
outbox holds the call's idempotency key, `retry` when the server's log shows it never started, and
nothing yet while it is still in flight. `effects()` then counts, from the server's files and not
rem's rows, the sends done, and those done more than once for one key (the duplicates: 0).
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from pathlib import Path
from typing import Any

from backend import ops
from backend.core.errors import RemError
from backend.programs.demo import write_tools_config
from backend.runtime.context import Context

log = logging.getLogger("rem.drill")

EFFECT_DELAY_MS = 600
EFFECT_TOOL = "outbox_send"


def tools_env(root: Path) -> dict[str, str]:
    """What the drill's `rem up` needs for a tool-using load: REM_MCP_CONFIG on the demo server."""
    config = write_tools_config(root, effect_permission="allow", effect_delay_ms=EFFECT_DELAY_MS)
    return {"REM_MCP_CONFIG": str(config)}


def _lines(path: Path) -> list[dict[str, Any]]:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return []
    out = []
    for line in text.splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            continue  # a line cut by a kill mid-write: not a finished record
    return out


def effects(root: Path) -> dict[str, int]:
    """Sends started and done, and keys done more than once (from the server's log and outbox)."""
    starts = Counter(
        r.get("key")
        for r in _lines(root / "tools.log.jsonl")
        if r.get("tool") == EFFECT_TOOL and r.get("phase") == "start"
    )
    sent = Counter(r.get("key") for r in _lines(root / "outbox.jsonl"))
    return {
        "started": sum(starts.values()),
        "sent": sum(sent.values()),
        "keys": len(sent),
        "duplicated": sum(n - 1 for n in sent.values() if n > 1),
        "started_more_than_once": sum(1 for n in starts.values() if n > 1),
    }


IN_FLIGHT_SQL = """
SELECT owner_id, idempotency_key FROM tool_call
WHERE state = 'running' AND tool = :tool AND owner_id IS NOT NULL ORDER BY time_started"""


async def in_flight_owner(ctx: Context, root: Path) -> str | None:
    """The owner of a send in flight on the tool server (`--mid-send`): its call `running` in rem,
    its start in the server's log and not its end; None while there is none."""
    db = await ctx.db()
    rows = await db.fetchall(IN_FLIGHT_SQL, {"tool": f"demo.{EFFECT_TOOL}"})
    if not rows:
        return None
    phases: dict[Any, set[str]] = {}
    for record in _lines(root / "tools.log.jsonl"):
        phases.setdefault(record.get("key"), set()).add(str(record.get("phase")))
    for owner, key in rows:
        if phases.get(key) == {"start"}:
            return str(owner)
    return None


async def resolve_unknown(ctx: Context, root: Path) -> int:
    """Resolve each unknown outcome the server's files decide (done / retry); how many were."""
    status = await ops.status(ctx)
    sent = {r.get("key") for r in _lines(root / "outbox.jsonl")}
    started = {r.get("key") for r in _lines(root / "tools.log.jsonl") if r.get("phase") == "start"}
    decided = 0
    for call in status["tools"]["unknown_outcome"]:
        key = call["idempotency_key"]
        if key not in sent and key in started:
            continue  # started and not sent yet: still in flight on the server, decided next time
        try:
            if key in sent:
                await ops.resolve(ctx, call["call_id"], "done", "sent (the drill found it in the outbox)")
            else:
                await ops.resolve(ctx, call["call_id"], "retry")
            decided += 1
        except RemError as exc:  # decided meanwhile, or not unknown any more: the next pass sees
            log.info("drill: resolve %s: %s", call["call_id"], exc)
    return decided
