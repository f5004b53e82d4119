"""`rem status --json` is pinned: the exact document for a deterministic incident data dir.

Scripts and runbooks parse this output, so its keys, nesting, value types and
values must not drift when the code behind it changes shape. The golden file
was written by the code before the snapshot became typed records; regenerate
it (REM_GOLDEN_UPDATE=1) only for a deliberate, documented change of output.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from backend.cli.app import app
from backend.core import clock
from tests.tui import scenes

GOLDEN = Path(__file__).with_name("golden") / "status_incident.json"


def every_kind_of_row(scene: scenes.Scene) -> None:
    """What the incident lacks: summary-job and Dream leases, a legacy row, operator actions."""
    scene.summary("s-job", status="in_progress", verdict=None)
    scene.x(
        "UPDATE summary_job SET owner_id = ?, epoch = 4, lease_expires_at = ? WHERE session_id = 's-job'",
        scenes.SUMM,
        scene.now + 120_000,
    )
    scene.dream("s-dreaming", input_rev=scenes.REV_A, completed_rev=None, state="in_progress")
    scene.x(
        "UPDATE dream_state SET owner_id = ?, epoch = 2, lease_expires_at = ? WHERE session_id = 's-dreaming'",
        scenes.DREAM,
        scene.now - 3_000,
    )
    scene.dream("s-legacy", input_rev=None, completed_rev=None, state="legacy")
    scene.event("operator.release", "alice", ago_ms=9_000, target="exe_0001", old_epoch=3, new_epoch=4)
    scene.event("operator.drain", "alice", ago_ms=8_000, target=scenes.EXEC_B, result="draining")
    scene.event("operator.replay", "bob", ago_ms=0, targets="all", ok=True)
    # tool sources as the executors recorded them: the live one's are listed, the dead one's are not
    for owner, servers in ((scenes.EXEC_A, TOOL_SERVERS_A), (scenes.EXEC_B, TOOL_SERVERS_B)):
        scene.x("UPDATE worker SET info = ? WHERE owner_id = ?", json.dumps({"tool_servers": servers}), owner)


TOOL_SERVERS_A = [
    {"server": "demo", "up": True, "error": None, "since": scenes.NOW - 600_000},
    {
        "server": "tickets",
        "up": False,
        "error": "cannot start: cannot run 'tickets-mcp': [x] No such file",
        "since": scenes.NOW - 125_000,
    },
]
TOOL_SERVERS_B = [
    {"server": "search", "up": False, "error": "exited with code 1", "since": scenes.NOW - 60_000}
]


def rem_status(root: Path, monkeypatch: pytest.MonkeyPatch, *args: str) -> str:
    """`rem status ARGS` over an incident data dir at `root` (the clock frozen at scenes.NOW)."""
    monkeypatch.delenv("REM_CHROMA_URL", raising=False)
    monkeypatch.setenv("COLUMNS", "160")
    data = scenes.build(root, scenes.incident, every_kind_of_row)
    result = CliRunner().invoke(app, ["status", "--data", str(data.root), *args])
    assert result.exit_code == 0, result.output
    return result.stdout.replace(str(data.root), "<data>")


def test_status_json_is_byte_identical_to_the_golden_file(
    tmp_path: Path, frozen_clock: clock.FrozenClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert frozen_clock.now == scenes.NOW
    document = rem_status(tmp_path / "data", monkeypatch, "--json")
    if os.environ.get("REM_GOLDEN_UPDATE"):
        GOLDEN.write_text(document, encoding="utf-8")
    assert document == GOLDEN.read_text(encoding="utf-8")


def test_status_without_json_prints_the_snapshot(
    tmp_path: Path, frozen_clock: clock.FrozenClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    # it raised KeyError('tables') before the snapshot was typed: nothing read it as a Status
    out = rem_status(tmp_path / "data", monkeypatch)
    assert "Chroma -: down (no Chroma server recorded for this data dir" in out
    # backlog: every kind counted (inputs, recoveries waiting, summaries behind, Dream revisions);
    # the held session (s-tango) has 2 inputs waiting asleep, counted with the inputs
    assert "backlog 14 · expired leases 2 · receipt mismatches 4 · Dream pending 6" in out
    assert "Model down api.openai.com/v1 (gpt-4o-mini)" in out and "3 retries" in out
    assert "held s-tango: auth: HTTP 401" in out and "`rem resume s-tango` once fixed" in out
    assert "Usage: 4 sessions" in out
    # one line per tool source down in a live executor, the dead executor's not among them
    assert (
        f"tool server tickets down for 2m05s in {scenes.EXEC_A}: "
        "cannot start: cannot run 'tickets-mcp': [x] No such file"
    ) in out
    assert "tool server search" not in out and "tool server demo" not in out
    # the tool calls waiting for a person, each with its owner and epoch (B was SIGKILLed)
    assert "tool calls: awaiting_approval 1, completed 1, unknown 1" in out
    assert "Tool calls awaiting approval (1): rem approve|deny CALL" in out
    unknown = out[out.index("Tool calls unknown outcome (1)") :].splitlines()
    assert unknown[2].split()[:8] == [
        "call_b1",
        "s-bravo",
        "demo.outbox_send",
        "effect",
        "44s",
        "executor-ops-1-4102-d4e5f6",
        "e1",
        "(dead)",
    ], unknown
    for section in ("Leases (4)", "Receipt mismatches (4)", "Dream drift (", "Workers (4)"):
        assert section in out, section
    assert "s-dreaming" in out and "summary_s-job" not in out  # a lease row, and no replay noise
    workers = out[out.index("Workers (4)") :].splitlines()
    assert workers[1].split()[:6] == ["owner", "role", "state", "host", "pid", "heartbeat"]
    assert all(" ops-1 " in row for row in workers[2:6]), workers  # each worker's host
