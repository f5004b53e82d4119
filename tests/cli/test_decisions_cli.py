"""`rem approve`, `rem deny`, `rem resolve` as thin shells: `--json` prints the library's ToolDecision,
bad input and wrong states are one line on stderr with a non-zero exit, and nothing moves."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path

from backend.core.datadir import DataDir
from backend.runtime.context import Context
from backend.store.states import ToolCallState
from tests.backend.test_tool_decisions import _parked_turn
from tests.helpers import rem_env, run_rem


def _prepare(root: Path, states: list[ToolCallState]) -> list[str]:
    async def go() -> list[str]:
        ctx = Context(DataDir(root), start_chroma=False, db_url=None)
        try:
            _lease, ids = await _parked_turn(await ctx.db(), states)
            return ids
        finally:
            await ctx.close()

    return asyncio.run(go())


def test_the_decision_commands(tmp_path: Path) -> None:
    root = tmp_path / "data"
    approval, unknown, other = _prepare(
        root, [ToolCallState.AWAITING_APPROVAL, ToolCallState.RUNNING, ToolCallState.RUNNING]
    )
    env = rem_env(REM_OPERATOR="alice")
    data = ("--data", str(root))
    shown = run_rem("status", *data, env=env)  # the parked turn's lease: held, no countdown
    assert shown.returncode == 0 and re.search(r"execution +exe_\S+ +executor-x +1 +held", shown.stdout), (
        shown.stdout
    )
    assert "held s1: tool_outcome_unknown (0 waiting); decide its tool call below" in shown.stdout
    assert "rem resume" not in shown.stdout  # it refuses a tool hold

    out = run_rem("approve", approval, *data, "--json", env=env)
    assert out.returncode == 0, out.stderr
    decision = json.loads(out.stdout)
    assert (decision["decision"], decision["state"], decision["decided_by"]) == (
        "approve",
        "pending",
        "alice",
    )

    again = run_rem("deny", approval, *data, "--reason", "late", env=env)
    assert again.returncode != 0
    assert again.stderr.strip().startswith("rem: error: tool call") and "is pending" in again.stderr
    assert len(again.stderr.strip().splitlines()) == 1

    both = run_rem("resolve", unknown, *data, "--done", "--retry", env=env)
    assert both.returncode != 0 and "exactly one of --done, --retry, --fail" in both.stderr
    misplaced = run_rem("resolve", unknown, *data, "--retry", "--result", "x", env=env)
    assert misplaced.returncode != 0 and "--result goes with --done" in misplaced.stderr

    done = run_rem("resolve", unknown, *data, "--done", "--result", "sent \x1b[31mred", env=env)
    assert done.returncode == 0, done.stderr
    assert "unknown -> completed" in done.stderr and "\x1b" not in done.stderr
    failed = run_rem("resolve", other, *data, "--fail", "--reason", "bounced", "--json", env=env)
    assert failed.returncode == 0, failed.stderr
    assert json.loads(failed.stdout)["unparked"] is True

    missing = run_rem("approve", "call_nope", *data, env=env)
    assert missing.returncode != 0 and "no tool call 'call_nope'" in missing.stderr


def test_a_decision_or_release_on_a_missing_data_dir_creates_nothing(tmp_path: Path) -> None:
    missing = tmp_path / "typo"
    for args in (("approve", "call_x"), ("resolve", "call_x", "--done"), ("release", "exe_x")):
        out = run_rem(*args, "--data", str(missing), env=rem_env())
        assert out.returncode != 0 and out.stdout == ""
        assert out.stderr.strip() == f"rem: error: no rem data at {missing} (state.db missing); " + (
            f"run `rem init --data {missing}`"
        ), out.stderr
        assert not missing.exists()
