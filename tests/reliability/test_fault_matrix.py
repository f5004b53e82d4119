"""Every fault point x its role: SIGKILL there, restart, settle, and `rem check --settled` must pass.

Cases run one after another on fresh data dirs, about 6 s each on two cores.
The per-role crash tests (test_execution_crash.py, test_summarizer_sigkill.py,
test_dream_daemon.py) prove each role's own recovery in detail. This matrix
adds one uniform verdict: the whole system (all three daemons, real Chroma)
runs with a victim that dies at the point, a clean replacement takes over,
and the invariant checker the operators use finds nothing wrong. Each case
also asserts the recovery path it was meant to exercise actually ran.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from backend import ops
from backend.core import faults
from backend.runtime.context import Context
from tests.reliability.rig import Rig
from tests.reliability.test_tool_sigkill import POINTS as TOOL_POINTS


def _taken_over(rig: Rig, kind: str) -> bool:
    return bool(rig.events(kind))


def _recovered_receipt(rig: Rig) -> bool:
    """A receipt staged by a summarizer that died before completing it was finished by another process.

    Either recovery acknowledged it (replaying the row if needed), or, when the
    session's turns moved on meanwhile, a newer synthesis superseded it.
    """
    completed = rig.events("summary.completed")
    orphans = [
        e
        for e in rig.events("summary.staged")
        if not any(c["actor"] == e["actor"] and c["session_id"] == e["session_id"] for c in completed)
    ]
    return bool(orphans) and all(
        any(c["session_id"] == e["session_id"] and c["id"] > e["id"] for c in completed) for e in orphans
    )


def _resynthesized(rig: Rig) -> bool:
    """A session was claimed again after its first synthesis died (nothing durable was left)."""
    claims = [e["session_id"] for e in rig.events("summary.claimed")]
    return len(claims) > len(set(claims))


# point -> (role, the fault of each successive victim, evidence that the crash was recovered)
CASES = {
    "executor.after_claim": (
        "executor",
        ["executor.after_claim"],
        lambda r: _taken_over(r, "execution.taken_over"),
    ),
    "executor.after_promote": (
        "executor",
        ["executor.after_promote"],
        lambda r: _taken_over(r, "execution.taken_over"),
    ),
    "executor.mid_stream": (
        "executor",
        ["executor.mid_stream"],
        lambda r: _taken_over(r, "execution.taken_over"),
    ),
    "executor.before_complete": (
        "executor",
        ["executor.before_complete"],
        lambda r: _taken_over(r, "execution.taken_over"),
    ),
    "summarizer.after_synthesis": ("summarizer", ["summarizer.after_synthesis"], _resynthesized),
    "summarizer.after_receipt": ("summarizer", ["summarizer.after_receipt"], _recovered_receipt),
    "summarizer.before_chroma_write": ("summarizer", ["summarizer.before_chroma_write"], _recovered_receipt),
    "summarizer.after_chroma_write": ("summarizer", ["summarizer.after_chroma_write"], _recovered_receipt),
    "summarizer.before_acknowledge": ("summarizer", ["summarizer.before_acknowledge"], _recovered_receipt),
    "summarizer.after_acknowledge": (
        "summarizer",
        ["summarizer.after_acknowledge"],
        lambda r: bool(r.events("summary.completed")),
    ),
    # recovery's own replay dies too: first leave a staged, unwritten receipt, then kill the replayer
    "replay.after_rewrite": (
        "summarizer",
        ["summarizer.before_chroma_write", "replay.after_rewrite"],
        _recovered_receipt,
    ),
    "dream.mid_graph": ("dream", ["dream.mid_graph"], lambda r: _taken_over(r, "dream.taken_over")),
    "dream.before_attest": ("dream", ["dream.before_attest"], lambda r: _taken_over(r, "dream.taken_over")),
    # the recall index (written by Dream): a victim dies between its FTS5 chunks, or after
    # writing turn vectors to Chroma but before marking them; check --settled covers invariant 9
    "index.mid_rows": ("dream", ["index.mid_rows"], lambda r: _taken_over(r, "dream.taken_over")),
    "index.after_vectors": ("dream", ["index.after_vectors"], lambda r: bool(r.events("dream.completed"))),
}


def test_the_matrix_covers_every_declared_fault_point() -> None:
    # a tool call's points have their own matrix (test_tool_sigkill.py: each point x effect class)
    tool_points = {point for point in TOOL_POINTS.values() if point is not None}
    assert set(CASES) | tool_points == set(faults.POINTS)
    assert not set(CASES) & tool_points


@pytest.mark.parametrize("point", list(CASES))
async def test_sigkill_at_the_point_then_rem_check_settled_passes(
    ctx: Context, chroma_url: str, tmp_path: Path, point: str
) -> None:
    await sigkill_at_the_point_then_check(ctx, chroma_url, tmp_path, point)


async def sigkill_at_the_point_then_check(ctx: Context, chroma_url: str, tmp_path: Path, point: str) -> None:
    """One case on the test's store (test_fault_matrix_pg.py runs them all on PostgreSQL)."""
    role, chain, recovered = CASES[point]
    rig = Rig(ctx, chroma_url, tmp_path)
    await rig.admit()
    try:
        for other in (r for r in ("executor", "summarizer", "dream") if r != role):
            rig.spawn(other)
        for fault in chain:
            victim = rig.spawn(role, name=f"victim-{fault}", REM_FAULTS=fault)
            assert await rig.wait_exit(victim) == -9, rig.log_of(victim)[-3000:]
            assert f"fault point {fault} fired" in rig.log_of(victim)
        rig.spawn(role, name="replacement")
        await rig.settle()
        assert recovered(rig), f"{point}: the recovery path did not run\n{rig.tail_logs()}"
        await rig.stop()
    finally:
        rig.kill_all()
    # the same verdict as `rem check --settled` (run as a real command in test_dependencies.py)
    report = await ops.check(ctx, settled=True)
    assert report["ok"], report["violations"]
    assert "chroma" in report["checked"] and report["counts"] == {"violations": 0, "unsettled": 0}
