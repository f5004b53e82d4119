"""Clock skew between processes (`REM_CLOCK_SKEW_MS`): the bound rem tolerates, and what happens past it.

The bound. Every lease is an absolute expiry time written with the holder's
clock and judged with the reader's. A reader whose clock is Δ ahead sees a
lease expire Δ early. The holder renews before its lease runs low: an
executor every L/3 (`leases.renew_every_ms`), Dream on every 2 s heartbeat,
the summarizer once half its lease is used (at a heartbeat); an executor's
every write during a turn renews it too. So a lease never has less than
about L - R left, R being the longest gap between renewals, and no peer
takes it over while

    Δ < L - R        executor: L - L/3;  Dream: L - 2 s;  summarizer: L/2 - 2 s.

With the defaults (executions 30 s, Dream 30 s, summaries 300 s) rem
tolerates clocks up to 20 s apart without a single needless takeover. This
test scales the executor and Dream leases to 5 s and runs processes 2 s
apart (one at -1 s, one at +1 s): 2 s < 5 s - 1.67 s, with 1.3 s of slack for
scheduling. Its agent pauses longer between parts than the renewal
interval, so only the renewal loop keeps the leases alive: the worst case.
(Run with 4 s apart, the same test sees takeovers.) (The summarizer's extractive synthesis holds its lease for
milliseconds, so its L/2 - 2 s term never comes into play here.)

Past the bound nothing is lost or done twice either: a clock far ahead takes
leases over early, and the fencing epoch stops the overtaken holder's late
writes. That is the second test: skew beyond the lease, takeovers happen,
`rem check --settled` still passes.
"""

from __future__ import annotations

from pathlib import Path

from backend.runtime.context import Context
from tests.helpers import wait_until
from tests.reliability.rig import Rig

LEASE = "5000"
SKEWED = {
    "REM_EXECUTION_LEASE_MS": LEASE,
    "REM_DREAM_LEASE_MS": LEASE,
    "REM_SUMMARY_LEASE_MS": LEASE,
    "REM_AGENT_DELAY_MS": "300",
    "REM_EXECUTOR_CONCURRENCY": "2",
}
# the worst case for the bound: parts further apart (1.8 s) than the renewal interval (1.67 s),
# so between two parts only the renewal loop keeps the lease alive
SLOW_PARTS = {"REM_AGENT_DELAY_MS": "1800"}
WORK = [
    (f"s{i}", f"Question {i}: why is the Frankfurt region slow on Argo Rollouts?", "queue") for i in range(2)
]


def _workers(rig: Rig) -> int:
    import sqlite3

    with sqlite3.connect(rig.root / "state.db", timeout=10) as conn:
        return int(conn.execute("SELECT count(*) FROM worker WHERE state = 'running'").fetchone()[0])


async def test_skew_within_the_bound_takes_nothing_over(
    ctx: Context, chroma_url: str, tmp_path: Path
) -> None:
    rig = Rig(ctx, chroma_url, tmp_path, extra_env={**SKEWED, **SLOW_PARTS})
    try:
        rig.spawn("summarizer", REM_CLOCK_SKEW_MS="1000")
        rig.spawn("dream", REM_CLOCK_SKEW_MS="-1000")
        rig.spawn("executor", name="executor-behind", REM_CLOCK_SKEW_MS="-1000")
        await rig.admit(WORK)
        wait_until(
            lambda: len(rig.events("execution.claimed")) == 2,
            timeout=30,
            message="the executor behind to hold both leases",
        )
        # the executor ahead has room to take leases over, and watches them for a whole turn
        rig.spawn("executor", name="executor-ahead", REM_CLOCK_SKEW_MS="1000")
        wait_until(lambda: _workers(rig) == 4, timeout=30, message="every daemon registered")
        await rig.admit([("s2", "And who approves the rollback in the Frankfurt region?", "queue")])
        await rig.settle(timeout=60)
        await rig.stop()
    finally:
        rig.kill_all()
    rig.check_cli()
    # both clocks held leases, and neither ever took the other's over
    assert len({e["actor"] for e in rig.events("execution.completed")}) == 2
    for kind in ("execution.taken_over", "execution.lease_lost", "dream.taken_over"):
        assert rig.events(kind) == [], kind


async def test_skew_past_the_lease_takes_over_early_but_fencing_keeps_it_exact(
    ctx: Context, chroma_url: str, tmp_path: Path
) -> None:
    rig = Rig(ctx, chroma_url, tmp_path, extra_env=SKEWED)
    try:
        # slow parts and a queue of follow-ups keep the on-time executor holding s0's lease for
        # ~25 s, longer than the far-ahead executor can take to start on a loaded machine
        on_time = rig.spawn("executor", name="executor-on-time", **SLOW_PARTS)
        rig.spawn("summarizer")
        rig.spawn("dream")
        follow_ups = [("s0", f"And follow-up {i} on the Welcome Flow?", "queue") for i in range(3)]
        await rig.admit([*WORK, *follow_ups])
        wait_until(
            lambda: rig.events("execution.claimed"), timeout=30, message="the on-time executor to claim"
        )
        rig.spawn("executor", name="executor-far-ahead", REM_CLOCK_SKEW_MS="6000")  # Δ = 6 s > L = 5 s
        wait_until(
            lambda: rig.events("execution.taken_over"),
            timeout=90,
            message="the far-ahead executor to take over",
        )
        await rig.settle(timeout=120)
        await rig.stop()
    finally:
        rig.kill_all()
    rig.check_cli()
    owner_on_time = next(e["actor"] for e in rig.events("worker.started") if e["data"]["pid"] == on_time.pid)
    taken = rig.events("execution.taken_over")
    assert taken and all(e["actor"] != owner_on_time for e in taken)
    assert any(e["actor"] == owner_on_time for e in rig.events("execution.lease_lost"))
