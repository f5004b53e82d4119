"""Executors as real processes: lease races, SIGSTOP fencing, SIGKILL mid-turn, operator release.

Leases are shortened to 1.5 s (`REM_EXECUTION_LEASE_MS`) and the agent
streams a part every 80 ms, so a turn takes about half a second and every
test stays bounded; waits are conditions with deadlines.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import multiprocessing
import os
import random
import signal
import sqlite3
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from backend.core import clock
from backend.core.datadir import DataDir
from backend.execution import leases, projection, sessions
from backend.ops.lease_release import release_lease
from backend.runtime.context import Context
from backend.store import workers
from backend.store.db import Conn, Database
from backend.store.postgres import PgConnection
from tests.helpers import rem_env, rem_json, spawn_rem, wait_until

LEASE_MS = 1500
PART_MS = 80


def _env(**extra: str) -> dict[str, str]:
    settings = {
        "REM_EXECUTION_LEASE_MS": str(LEASE_MS),
        "REM_AGENT_DELAY_MS": str(PART_MS),
        "REM_CHROMA_AUTOSTART": "0",
        "REM_LOG": "1",
    }
    return rem_env(**{**settings, **extra})


def _spawn_executor(data: Path, log: Path, **env: str) -> subprocess.Popen[bytes]:
    return spawn_rem("daemon", "--role", "executor", "--data", str(data), env=_env(**env), log=log)


def _connect(data: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(data / "state.db", timeout=10, isolation_level=None)
    conn.row_factory = sqlite3.Row
    return conn


@contextlib.contextmanager
def _store(data: Path) -> Iterator[Conn]:
    """The test's state store, read as the daemons write it: state.db, or PostgreSQL (REM_DB_URL)."""
    url = os.environ.get("REM_DB_URL")
    conn: Conn = PgConnection(url) if url else _connect(data)
    try:
        yield conn
    finally:
        conn.close()  # type: ignore[attr-defined]


def _query(data: Path, sql: str, params: tuple[Any, ...] = ()) -> list[Any]:
    with _store(data) as conn:
        return conn.execute(sql, params).fetchall()


def _scalar(data: Path, sql: str, params: tuple[Any, ...] = ()) -> Any:
    rows = _query(data, sql, params)
    return rows[0][0] if rows else None


def _admit(data: Path, inputs: list[tuple[str, str, str]]) -> None:
    async def go() -> None:
        ctx = Context(DataDir(data), start_chroma=False)
        db = await ctx.db()
        for sid, text, delivery in inputs:
            await sessions.admit(db, sid, text, delivery=delivery)
        await ctx.close()

    asyncio.run(go())


def _all_done(data: Path) -> bool:
    return bool(
        _scalar(
            data,
            "SELECT (SELECT count(*) FROM session_input WHERE promoted_seq IS NULL) + "
            "(SELECT count(*) FROM session_execution) = 0",
        )
    )


def _violations(data: Path) -> list[dict[str, Any]]:
    with _store(data) as conn:
        return projection.transcript_violations_sync(conn)


def _stop(*procs: subprocess.Popen[bytes]) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    for proc in procs:
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _assert_recovered(data: Path) -> None:
    """Every input promoted once, one continuation per interrupted execution, stale rows closed."""
    assert _violations(data) == []
    recoveries = _query(
        data,
        "SELECT execution_id, continuation_message_id, wake_pending, recovery_error FROM session_recovery",
    )
    taken = {
        r[0] for r in _query(data, "SELECT DISTINCT target FROM event WHERE kind = 'execution.taken_over'")
    }
    assert {r["execution_id"] for r in recoveries} == taken
    assert all(r["wake_pending"] == 0 and r["recovery_error"] is None for r in recoveries)
    synthetic = _query(
        data, "SELECT id, json_extract(data, '$.execution_id') FROM session_message WHERE type = 'synthetic'"
    )
    assert sorted(r[0] for r in synthetic) == sorted(f"recovery:{e}" for e in taken)
    claimed = {r[0] for r in _query(data, "SELECT target FROM event WHERE kind = 'execution.claimed'")}
    completed = {r[0] for r in _query(data, "SELECT target FROM event WHERE kind = 'execution.completed'")}
    assert claimed <= completed  # every execution ended cleanly in the end, by someone
    stale = _query(
        data,
        "SELECT id FROM session_message WHERE type = 'assistant' "
        "AND json_extract(data, '$.status') NOT IN ('completed', 'superseded')",
    )
    assert stale == []


# -- two processes race for one lease -------------------------------------------------------


def _racer(db_path: str, owner: str, rounds: int, barrier: Any, results: Any) -> None:
    asyncio.run(_race(Path(db_path), owner, rounds, barrier, results))


async def _race(db_path: Path, owner: str, rounds: int, barrier: Any, results: Any) -> None:
    db = await Database.open(db_path)
    wins: list[tuple[int, int | None]] = []
    for round_no in range(rounds):
        barrier.wait()
        if round_no % 2 == 0:  # a fresh claim on an idle session
            lease = await leases.claim(db, "race", owner, length_ms=60_000)
        else:  # a takeover of the lease the last winner released
            eid = await db.scalar("SELECT id FROM session_execution WHERE session_id = 'race'")
            taken = await db.write_in_thread(
                lambda conn, e=eid: leases.take_over_execution_sync(
                    conn, e, owner, now=clock.now_ms(), length_ms=60_000
                )
            )
            lease = taken[0] if taken else None
        wins.append((round_no, lease.epoch if lease else None))
        barrier.wait()
        if lease is not None and round_no % 2 == 0:
            async with db.tx() as conn:
                await release_lease(
                    conn,
                    "execution",
                    lease.execution_id,
                    expected_epoch=lease.epoch,
                    actor=owner,
                    now=clock.now_ms(),
                )
        elif lease is not None:
            await db.write_in_thread(lambda conn, held=lease: leases.end_execution_sync(conn, held))
        barrier.wait()
    await db.close()
    results.put((owner, wins))


def test_two_processes_race_for_one_lease_200_times(tmp_path: Path) -> None:
    data = tmp_path / "d"
    _admit(data, [("race", "contended", "queue")])
    mp = multiprocessing.get_context("spawn")
    barrier, results = mp.Barrier(2), mp.Queue()
    rounds = 200
    procs = [
        mp.Process(target=_racer, args=(str(data / "state.db"), f"racer-{i}", rounds, barrier, results))
        for i in range(2)
    ]
    for proc in procs:
        proc.start()
    outcomes = dict(results.get(timeout=120) for _ in procs)
    for proc in procs:
        proc.join(timeout=30)
        assert proc.exitcode == 0
    epochs = []
    for round_no in range(rounds):
        won = [wins[round_no][1] for wins in outcomes.values() if wins[round_no][1] is not None]
        assert len(won) == 1, f"round {round_no}: {won}"
        epochs.append(won[0])
    # claim, release and takeover each grant a new epoch (3 per pair of rounds): never reused
    assert epochs == sorted(set(epochs)) and epochs[-1] == 3 * rounds // 2


# -- SIGSTOP past the lease: the late writes are fenced --------------------------------------


def _holds_write_lock(data: Path) -> bool:
    conn = sqlite3.connect(data / "state.db", timeout=0.3, isolation_level=None)
    try:
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("ROLLBACK")
        return False
    except sqlite3.OperationalError:
        return True
    finally:
        conn.close()


def _snapshot(data: Path) -> dict[str, list[tuple[Any, ...]]]:
    tables = (
        "session",
        "session_message",
        "session_part",
        "session_input",
        "session_execution",
        "session_recovery",
        "session_context_epoch",
        "summary_job",
    )
    with _connect(data) as conn:
        return {t: sorted(tuple(r) for r in conn.execute(f"SELECT * FROM {t}")) for t in tables}


def _stop_mid_stream(data: Path, proc: subprocess.Popen[bytes]) -> None:
    """SIGSTOP `proc` while it streams, never while it holds SQLite's write lock."""
    for _ in range(20):
        wait_until(
            lambda: _scalar(data, "SELECT count(*) FROM session_part"), timeout=20, message="streaming"
        )
        proc.send_signal(signal.SIGSTOP)
        time.sleep(0.05)  # let a transaction in flight either finish or be visibly stuck
        if not _holds_write_lock(data):
            return
        proc.send_signal(signal.SIGCONT)
    raise AssertionError("could not stop the executor outside a transaction")


def test_a_paused_executor_cannot_write_after_its_lease_was_taken_over(tmp_path: Path) -> None:
    data = tmp_path / "d"
    _admit(data, [("s1", "A long question about the Canary Pipeline and Argo Rollouts?", "queue")])
    first = _spawn_executor(data, tmp_path / "first.log", REM_AGENT_DELAY_MS="200")
    second = None
    try:
        _stop_mid_stream(data, first)
        held = _query(data, "SELECT id, owner_id, epoch, assistant_message_id FROM session_execution")[0]
        stale_parts = _scalar(
            data, "SELECT count(*) FROM session_part WHERE message_id = ?", (held["assistant_message_id"],)
        )
        second = _spawn_executor(data, tmp_path / "second.log")
        wait_until(lambda: _all_done(data), timeout=30, message="the second executor finished the turn")
        before = _snapshot(data)
        first.send_signal(signal.SIGCONT)
        wait_until(
            lambda: _scalar(
                data,
                "SELECT count(*) FROM event WHERE kind = 'execution.lease_lost' AND actor = ?",
                (held["owner_id"],),
            ),
            timeout=20,
            message="the paused executor noticed its lease was gone",
        )
        assert _snapshot(data) == before  # its late writes changed nothing
        late = _query(
            data,
            "SELECT kind FROM event WHERE actor = ? AND id > (SELECT max(id) FROM event "
            "WHERE kind = 'execution.completed')",
            (held["owner_id"],),
        )
        assert [r[0] for r in late] == ["execution.lease_lost"]
        assert (
            _scalar(
                data,
                "SELECT count(*) FROM session_part WHERE message_id = ?",
                (held["assistant_message_id"],),
            )
            == stale_parts
        )
        stale = json.loads(
            _scalar(data, "SELECT data FROM session_message WHERE id = ?", (held["assistant_message_id"],))
        )
        assert stale["status"] == "superseded"
        _assert_recovered(data)
    finally:
        first.send_signal(signal.SIGCONT)
        _stop(*(p for p in (first, second) if p is not None))


# -- SIGKILL mid-turn -------------------------------------------------------------------------

WORK = [
    ("s1", "Why did the Invoice Service fail after the Stripe webhooks change?", "queue"),
    ("s1", "Summarise what Maria said about the nightly ledger export.", "queue"),
    ("s1", "Actually, keep it short.", "steer"),
    ("s2", "What should Ken check first if the synonym dictionary is late?", "queue"),
]


@pytest.mark.both_stores
@pytest.mark.parametrize(
    ("point", "phase"),
    [
        ("executor.after_claim", "ready"),
        ("executor.after_promote", "unknown"),
        ("executor.mid_stream", "unknown"),
        ("executor.before_complete", "unknown"),
    ],
)
def test_sigkill_at_a_fault_point_is_recovered_by_another_executor(
    tmp_path: Path, point: str, phase: str, db_url: str | None
) -> None:
    data = tmp_path / "d"
    _admit(data, WORK)
    victim = _spawn_executor(data, tmp_path / "victim.log", REM_FAULTS=point)
    assert victim.wait(timeout=30) == -signal.SIGKILL
    interrupted = _query(data, "SELECT id, phase, assistant_message_id FROM session_execution")
    assert interrupted, "the victim died holding no lease"
    rescuer = _spawn_executor(data, tmp_path / "rescuer.log")
    try:
        wait_until(lambda: _all_done(data), timeout=40, message="every turn finished after the takeover")
    finally:
        _stop(rescuer)
    _assert_recovered(data)
    # the victim runs sessions concurrently: the one at the fault point died in `phase`,
    # the others wherever they were; each recovery records what its execution was doing
    assert phase in {"unknown" if row["phase"] == "unknown" else "ready" for row in interrupted}
    for row in interrupted:
        rec = _query(data, "SELECT data FROM session_message WHERE id = ?", (f"recovery:{row['id']}",))
        expected = "unknown" if row["phase"] == "unknown" else "ready"
        assert len(rec) == 1 and json.loads(rec[0][0])["interrupted_phase"] == expected
        if row["assistant_message_id"]:  # the stale projection was closed, never resumed
            stale = json.loads(
                _scalar(data, "SELECT data FROM session_message WHERE id = ?", (row["assistant_message_id"],))
            )
            assert stale["status"] == "superseded"
    if point == "executor.mid_stream":
        assert (
            max(
                _scalar(
                    data,
                    "SELECT count(*) FROM session_part WHERE message_id = ?",
                    (row["assistant_message_id"],),
                )
                for row in interrupted
            )
            >= 1
        )


def test_sigkill_at_random_moments_loses_and_duplicates_nothing(tmp_path: Path) -> None:
    data = tmp_path / "d"
    rng = random.Random(int(os.environ.get("REM_TEST_SEED", "0")) or None)
    _admit(data, WORK + [("s3", f"Question {i} about the Payment Gateway?", "queue") for i in range(3)])
    for round_no in range(3):
        proc = _spawn_executor(data, tmp_path / f"victim-{round_no}.log")
        time.sleep(rng.uniform(0.3, 1.6))  # a random instant: startup, claim, stream or takeover
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
    rescuer = _spawn_executor(data, tmp_path / "rescuer.log")
    try:
        wait_until(lambda: _all_done(data), timeout=60, message="every turn finished")
    finally:
        _stop(rescuer)
    _assert_recovered(data)
    assert _scalar(data, "SELECT count(*) FROM session_input WHERE promoted_seq IS NULL") == 0


# -- draining: SIGTERM finishes the turn in flight and hands the rest back ------------------------


def test_sigterm_drains_the_turn_in_flight_and_needs_no_recovery(tmp_path: Path) -> None:
    data = tmp_path / "d"
    _admit(data, [("s1", f"Question {i} about the refund queue?", "queue") for i in range(3)])
    proc = _spawn_executor(data, tmp_path / "executor.log", REM_AGENT_DELAY_MS="150")
    wait_until(lambda: _scalar(data, "SELECT count(*) FROM session_part"), timeout=20, message="streaming")
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 0
    states = [
        tuple(r)
        for r in _query(
            data, "SELECT promoted_seq IS NOT NULL, wake_pending FROM session_input ORDER BY admitted_seq"
        )
    ]
    assert states[0] == (1, 0) and set(states[1:]) == {(0, 1)}  # one finished, the rest still waiting
    assert _scalar(data, "SELECT count(*) FROM session_execution") == 0
    assert _scalar(data, "SELECT count(*) FROM session_recovery") == 0
    assert _scalar(data, "SELECT state FROM worker") == "stopped"
    assert _violations(data) == []


# -- operator release of a dead owner's lease ---------------------------------------------------


@pytest.mark.both_stores
def test_releasing_a_killed_owners_lease_is_taken_over_within_a_second(
    tmp_path: Path, db_url: str | None
) -> None:
    data = tmp_path / "d"
    _admit(data, [("s1", "A question that will outlive its executor?", "queue")])
    slow = {"REM_EXECUTION_LEASE_MS": "30000", "REM_AGENT_DELAY_MS": "200"}
    victim = _spawn_executor(data, tmp_path / "victim.log", **slow)
    wait_until(lambda: _scalar(data, "SELECT count(*) FROM session_part"), timeout=20, message="streaming")
    victim.send_signal(signal.SIGKILL)
    victim.wait(timeout=10)
    rescuer = _spawn_executor(data, tmp_path / "rescuer.log", **slow)
    try:
        wait_until(
            lambda: _scalar(
                data, "SELECT count(*) FROM worker WHERE state = 'running' AND pid = ?", (rescuer.pid,)
            ),
            timeout=20,
            message="rescuer up",
        )
        eid = _scalar(data, "SELECT id FROM session_execution")
        released = rem_json(
            "release", eid, "--expected-epoch", "1", "--data", str(data), env=_env(REM_CHROMA_AUTOSTART="0")
        )
        assert released["old_epoch"] == 1 and released["new_epoch"] == 2
        wait_until(
            lambda: _scalar(data, "SELECT count(*) FROM event WHERE kind = 'execution.taken_over'"),
            timeout=5,
            message="takeover",
        )
        taken_at = _scalar(data, "SELECT time FROM event WHERE kind = 'execution.taken_over'")
        assert taken_at - released["released_at"] < 1000  # not the 30 s lease
        wait_until(lambda: _all_done(data), timeout=20, message="turn finished")
    finally:
        _stop(rescuer)
    _assert_recovered(data)


# -- several hosts: the fast takeover is the owner's host's alone ------------------------------


def _record_exit(data: Path, pid: int, host: str) -> None:
    """What the victim's supervisor on `host` records when it sees the process die."""

    async def go() -> None:
        ctx = Context(DataDir(data), start_chroma=False)
        try:
            assert await workers.mark_exited(await ctx.db(), pid, host, "killed by signal 9")
        finally:
            await ctx.close()

    asyncio.run(go())


@pytest.mark.both_stores
@pytest.mark.parametrize("rescuer_host", ["host-a", "host-b"])
def test_a_killed_owner_is_taken_over_at_once_on_its_host_and_after_expiry_elsewhere(
    tmp_path: Path, rescuer_host: str, db_url: str | None
) -> None:
    data = tmp_path / "d"
    _admit(data, [("s1", "A question that will outlive its executor?", "queue")])
    lease = {"REM_EXECUTION_LEASE_MS": "8000"}
    # 5 parts 5 s apart: the victim is still mid-turn however long the rescuer takes to start
    victim = _spawn_executor(
        data, tmp_path / "victim.log", REM_HOST="host-a", REM_AGENT_DELAY_MS="5000", **lease
    )
    wait_until(lambda: _scalar(data, "SELECT count(*) FROM session_part"), timeout=20, message="streaming")
    assert _scalar(data, "SELECT host FROM worker WHERE pid = ?", (victim.pid,)) == "host-a"
    # the rescuer is up and scanning before the kill, so its start-up time is not in the window
    rescuer = _spawn_executor(
        data, tmp_path / "rescuer.log", REM_HOST=rescuer_host, REM_AGENT_DELAY_MS="100", **lease
    )
    try:
        wait_until(
            lambda: _scalar(data, "SELECT state FROM worker WHERE pid = ?", (rescuer.pid,)) == "running",
            timeout=30,
            message="rescuer registered",
        )
        assert _scalar(data, "SELECT host FROM worker WHERE pid = ?", (rescuer.pid,)) == rescuer_host
        assert _scalar(data, "SELECT owner_id FROM session_execution") is not None, "the turn ended too soon"
        victim.send_signal(signal.SIGKILL)
        victim.wait(timeout=10)
        _record_exit(data, victim.pid, "host-a")
        recorded_at = clock.now_ms()
        expires_at = _scalar(data, "SELECT expires_at FROM session_execution")
        wait_until(
            lambda: _scalar(data, "SELECT count(*) FROM event WHERE kind = 'execution.taken_over'"),
            timeout=40,
            message="takeover",
        )
        taken_at, taken = _query(data, "SELECT time, data FROM event WHERE kind = 'execution.taken_over'")[0]
        if rescuer_host == "host-a":  # its supervisor's record is trusted on its own host
            assert json.loads(taken)["reason"] == "owner_stopped" and taken_at < expires_at
        else:  # another host had the record in front of it for seconds, and still waited the lease out
            assert recorded_at < expires_at - 2000, "the exit was recorded too late to prove anything"
            assert json.loads(taken)["reason"] == "expired" and taken_at >= expires_at
        wait_until(lambda: _all_done(data), timeout=30, message="turn finished")
    finally:
        _stop(rescuer)
    _assert_recovered(data)
