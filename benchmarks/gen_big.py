"""Generate a large rem data dir for scale benchmarks (status, console).

Default shape: 100 000 sessions, 1 000 000 messages, 10 000 receipts
of which 500 mismatched, 2 000 execution leases (a quarter expired, owned by a
dead worker), 1 000 Dream-pending sessions, a few workers, 20 000 events.

    python benchmarks/gen_big.py DIR [--sessions N] [--messages-per-session M]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sqlite3
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from backend.core.datadir import DataDir
from backend.runtime.context import Context

WORDS = (
    "lease recovery summary receipt chroma dream graph executor session turn input "
    "steer queue epoch fence revision digest operator console drain replay"
).split()


def _text(rng: random.Random, n: int = 12) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


def generate(
    root: Path,
    sessions: int,
    per_session: int,
    receipts: int,
    mismatched: int,
    leases: int,
    dream_pending: int,
    events: int,
    seed: int = 7,
) -> dict[str, int]:
    """Fill DIR/state.db (created and migrated by rem first) with the given shape."""
    asyncio.run(_init(root))
    rng = random.Random(seed)
    now = int(time.time() * 1000)
    conn = sqlite3.connect(root / "state.db", isolation_level=None)
    # a bulk load into a fresh file: no journal (a failed build is simply rebuilt), a big page
    # cache for the index b-trees; WAL again at the end, as rem runs it
    conn.execute("PRAGMA journal_mode = OFF")
    conn.execute("PRAGMA synchronous = OFF")
    conn.execute("PRAGMA cache_size = -1000000")
    conn.execute("BEGIN")
    sids = [f"s{i:06d}" for i in range(sessions)]
    conn.executemany(
        "INSERT INTO session (id, title, last_seq, time_created, time_updated, message_count) "
        "VALUES (?, ?, ?, ?, ?, ?)",
        (
            (sid, f"session {sid}", per_session, now - 86_400_000, now - i, per_session)
            for i, sid in enumerate(sids)
        ),
    )

    def messages():
        for sid in sids:
            for seq in range(1, per_session + 1):
                kind = "user" if seq % 2 else "assistant"
                data = {"text": _text(rng, 8)}
                if kind == "assistant":
                    data["status"] = "completed"
                yield (f"m{sid}_{seq}", sid, kind, seq, now - 86_000_000 + seq, now, json.dumps(data))

    conn.executemany(
        "INSERT INTO session_message (id, session_id, type, seq, time_created, time_updated, data) "
        "VALUES (?, ?, ?, ?, ?, ?, ?)",
        messages(),
    )
    conn.executemany(
        "INSERT INTO session_input (id, session_id, prompt, delivery, admitted_seq, promoted_seq, "
        "wake_pending, time_created) VALUES (?, ?, '{}', 'queue', ?, ?, 0, ?)",
        ((f"m{sid}_1", sid, 1, 1, now - 86_000_000) for sid in sids),
    )
    conn.executemany(
        "INSERT INTO session_input (id, session_id, prompt, delivery, admitted_seq, wake_pending, "
        "time_created) VALUES (?, ?, '{\"text\":\"x\"}', 'queue', ?, 1, ?)",
        (
            (f"pending_{sid}", sid, per_session + 1, now - rng.randint(0, 60_000))
            for sid in sids[: sessions // 100]
        ),
    )
    conn.executemany(
        "INSERT INTO worker (owner_id, role, pid, host, started_at, heartbeat_at, state) "
        "VALUES (?, ?, ?, 'bench', ?, ?, ?)",
        [
            ("executor-live", "executor", 100, now - 3_600_000, now, "running"),
            ("executor-dead", "executor", 101, now - 3_600_000, now - 120_000, "running"),
            ("summarizer-1", "summarizer", 102, now - 3_600_000, now, "running"),
            ("dream-1", "dream", 103, now - 3_600_000, now, "running"),
        ],
    )
    conn.executemany(
        "INSERT INTO session_execution (id, session_id, owner_id, epoch, phase, time_created, "
        "time_renewed, expires_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
        (
            (
                f"exe_{sid}",
                sid,
                "executor-dead" if i % 4 == 0 else "executor-live",
                1 + i % 5,
                ("ready", "safe", "unknown", "continue")[i % 4],
                now - 40_000,
                now - 10_000,
                now - 5_000 if i % 4 == 0 else now + 20_000,
            )
            for i, sid in enumerate(sids[-leases:])
        ),
    )
    verdicts = ["keys_differ", "missing", "document_differs", "quarantined"]
    conn.executemany(
        "INSERT INTO summary_job (session_id, status, epoch, result_envelope, result_encoding, "
        "result_staged_at, result_acknowledged_at, verdict, verdict_detail, verdict_checked_at, "
        "summarized_revision, time_created, time_updated) "
        "VALUES (?, 'completed', 1, ?, 'rem-receipt-v1', ?, ?, ?, ?, ?, ?, ?, ?)",
        (
            (
                sid,
                b"{}",
                now - 1000,
                now - 900,
                verdicts[i % 4] if i < mismatched else "present",
                json.dumps({"keys": [{"key": "memoryCount", "expected": 3, "actual": 4, "reason": "value"}]})
                if i < mismatched
                else None,
                now - i,
                f"sha256:{i:064x}",
                now,
                now,
            )
            for i, sid in enumerate(sids[:receipts])
        ),
    )
    conn.executemany(
        "INSERT INTO dream_state (session_id, input_revision, completed_revision, digest_state, "
        "time_published, time_updated) VALUES (?, ?, ?, ?, ?, ?)",
        (
            (
                sid,
                f"sha256:{i:064x}",
                f"sha256:{i:064x}" if i >= dream_pending else (None if i % 2 else "sha256:old"),
                "digested" if i >= dream_pending else "pending",
                now - i,
                now,
            )
            for i, sid in enumerate(sids[:receipts])
        ),
    )
    conn.executemany(
        "INSERT INTO event (time, kind, actor, session_id, target, data) VALUES (?, ?, ?, ?, ?, '{}')",
        (
            (
                now - events + i,
                rng.choice(["input.admitted", "execution.completed", "summary.completed", "dream.completed"]),
                "bench",
                rng.choice(sids),
                None,
            )
            for i in range(events)
        ),
    )
    conn.execute("COMMIT")
    conn.execute("ANALYZE")
    conn.execute("PRAGMA journal_mode = WAL")
    conn.close()
    return {
        "sessions": sessions,
        "messages": sessions * per_session,
        "receipts": receipts,
        "mismatched": mismatched,
        "leases": leases,
        "dream_pending": dream_pending,
    }


async def _init(root: Path) -> None:
    ctx = Context(DataDir(root), start_chroma=False)
    await ctx.db()
    await ctx.close()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("dir", type=Path)
    parser.add_argument("--sessions", type=int, default=100_000)
    parser.add_argument("--messages-per-session", type=int, default=10)
    parser.add_argument("--receipts", type=int, default=10_000)
    parser.add_argument("--mismatched", type=int, default=500)
    parser.add_argument("--leases", type=int, default=2_000)
    parser.add_argument("--dream-pending", type=int, default=1_000)
    parser.add_argument("--events", type=int, default=20_000)
    args = parser.parse_args()
    if (args.dir / "state.db").exists():
        sys.exit(f"{args.dir}/state.db exists; pass an empty directory")
    started = time.perf_counter()
    shape = generate(
        args.dir,
        args.sessions,
        args.messages_per_session,
        args.receipts,
        args.mismatched,
        args.leases,
        args.dream_pending,
        args.events,
    )
    print(json.dumps({**shape, "seconds": round(time.perf_counter() - started, 1)}))


if __name__ == "__main__":
    main()
