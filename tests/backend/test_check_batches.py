"""`rem check` in bounded batches finds exactly what one read transaction over everything finds."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from backend.core.datadir import DataDir
from backend.ops.checks import check_database_in_batches, check_database_sync, summarize
from backend.runtime.context import Context
from benchmarks.gen_big import generate


@pytest.fixture(scope="module")
def damaged(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """600 sessions of the benchmark's shape, with violations spread over the id range."""
    _ = json
    root = tmp_path_factory.mktemp("check") / "data"
    generate(
        root, sessions=600, per_session=4, receipts=100, mismatched=5, leases=20, dream_pending=10, events=100
    )
    conn = sqlite3.connect(root / "state.db", isolation_level=None)
    conn.execute("BEGIN")
    for sid in ("s000003", "s000299", "s000598"):  # a user message nobody admitted
        conn.execute(
            "INSERT INTO session_message (id, session_id, type, seq, time_created, time_updated, data) "
            "VALUES (?, ?, 'user', 40, 1, 1, '{}')",
            (f"forged_{sid}", sid),
        )
    for sid in ("s000100", "s000450"):  # an input admitted at a reply's seq, past the session's sequence
        conn.execute(
            "INSERT INTO session_input (id, session_id, prompt, delivery, admitted_seq, wake_pending, "
            "time_created) VALUES (?, ?, '{}', 'queue', 2, 1, 1)",
            (f"dup_{sid}", sid),
        )
        conn.execute("UPDATE session SET last_seq = 1 WHERE id = ?", (sid,))
    conn.execute(  # an input nobody will wake
        "INSERT INTO session_input (id, session_id, prompt, delivery, admitted_seq, wake_pending, time_created) "
        "VALUES ('stranded', 's000500', '{}', 'queue', 90, 0, 1)"
    )
    conn.execute("COMMIT")
    conn.close()
    return root


async def _whole_and_batched(
    damaged: Path, **options: Any
) -> tuple[dict[str, Any], dict[str, Any], list[tuple[str, int, int]]]:
    """One read transaction's report, `check_database_in_batches(**options)`'s, and its progress calls."""
    ctx = Context(DataDir(damaged), read_only=True, start_chroma=False)
    db = await ctx.db()
    calls: list[tuple[str, int, int]] = []
    try:
        whole = summarize(await db.read_in_thread(check_database_sync), settled=False)
        batched = summarize(
            await check_database_in_batches(db, progress=lambda *a: calls.append(a), **options), settled=False
        )
    finally:
        await ctx.close()
    return whole, batched, calls


async def test_batches_find_what_one_transaction_finds(damaged: Path) -> None:
    whole, batched, calls = await _whole_and_batched(damaged, batch=37)
    assert batched == whole
    whats = {f["what"]: f["count"] for f in whole["violations"]}
    # the generator admits only each session's first prompt: its second user message (seq 3) has no input
    assert whats["user messages that no admitted input produced"] == 600 + 3
    # ... and gives its first input one seq for both admission and promotion
    assert whats["one sequence number used twice in a session"] == 600 + 2
    assert whats["admitted inputs nobody will wake (wake_pending=0, no execution)"] == 1
    sessions = [c for c in calls if c[0] == "sessions"]
    assert len(sessions) == -(-600 // 37) + 2  # one report per batch, the first (0) and the last
    assert sessions[-1] == ("sessions", 600, 600)
    structure = [c for c in calls if c[0] == "structure"]
    assert structure[-1][1] == structure[-1][2] >= 10  # quick_check and foreign keys, table by table


async def test_worker_processes_find_what_one_transaction_finds_and_list_the_same_rows(damaged: Path) -> None:
    """The sessions phase split over two processes (ranges of ids, merged in id order): the same
    counts and the same listed rows as one read transaction over everything."""
    whole, split, calls = await _whole_and_batched(damaged, batch=37, workers=2, parallel_min=0)
    assert split == whole
    sessions = [c for c in calls if c[0] == "sessions"]
    assert sessions[0] == ("sessions", 0, 600) and sessions[-1] == ("sessions", 600, 600)
    # two ranges of 300 sessions, each in batches of 37: progress after every batch, never backwards
    done = [c[1] for c in sessions]
    assert done == sorted(done) and len(done) == 1 + 2 * -(-300 // 37) + 1


async def test_rem_check_on_a_terminal_less_run_prints_no_progress_to_stdout(damaged: Path) -> None:
    from tests.helpers import run_rem

    proc = run_rem("check", "--json", "--data", str(damaged), "--chroma-url", "http://127.0.0.1:9")
    report = json.loads(proc.stdout)  # stdout holds the one JSON document, nothing else
    assert proc.returncode == 1 and not report["ok"]


async def test_a_worker_that_cannot_read_is_one_line_naming_the_file(tmp_path: Path) -> None:
    from backend.core.errors import RemError
    from backend.ops.checks.workers import _check_range_in_worker

    missing = tmp_path / "gone" / "state.db"
    with pytest.raises(RemError) as caught:
        await _check_range_in_worker(str(missing), "", None, 10, lambda n: None)
    message = str(caught.value)
    assert str(missing) in message and "\n" not in message and "Traceback" not in message, message


async def test_state_db_is_read_ahead_before_its_pages_are_checked(
    damaged: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`quick_check` walks pages in b-tree order: from a cold cache, state.db is read ahead in file order first."""
    from backend.ops import checks

    order: list[str] = []

    def warm(path: Path, **_: Any) -> int:
        order.append(f"read ahead {path}")
        return 0

    monkeypatch.setattr(checks, "warm_page_cache", warm)
    ctx = Context(DataDir(damaged), read_only=True, start_chroma=False)
    try:
        await checks.check_database_in_batches(await ctx.db(), progress=lambda phase, *_: order.append(phase))
    finally:
        await ctx.close()
    assert order[:2] == [f"read ahead {damaged / 'state.db'}", "structure"], order[:3]
    assert order.count(f"read ahead {damaged / 'state.db'}") == 1
