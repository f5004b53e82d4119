"""What an operator reads about agent tool calls: `rem show`'s calls (inert text), `rem status`'s."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from backend.cli.app import app
from tests.tui import scenes

HOSTILE = "\x1b]0;pwned\x07[red]not markup[/] \u202egnp.exe"


def _hostile_calls(scene: scenes.Scene) -> None:
    scene.tx(lambda: _rows(scene))


def _rows(scene: scenes.Scene) -> None:
    scenes.tool_calls(scene)
    scene.tool_call(
        "call_a3",
        "exe_0001",
        "s-alpha",
        "demo.notes_add",
        {"text": HOSTILE},
        state="completed",
        owner=scenes.EXEC_A,
        epoch=3,
        ago_ms=20_000,
        step=3,
        effect="idempotent",
        permission="allow",
        result=HOSTILE,
        starts=1,
    )


def test_show_prints_each_call_with_arguments_state_result_and_key_as_inert_text(tmp_path: Path) -> None:
    data = scenes.build(tmp_path / "data", scenes.healthy, _hostile_calls)
    runner = CliRunner()
    human = runner.invoke(app, ["show", "s-alpha", "--data", str(data.root)], env={"COLUMNS": "200"})
    assert human.exit_code == 0, human.output
    out = human.stdout
    assert "Tool calls (3)" in out
    # oldest first: the read, the send waiting for approval, the hostile note
    order = [out.index(c) for c in ("call_a1 completed", "call_a2 awaiting_approval", "call_a3 completed")]
    assert order == sorted(order)
    assert 'arguments {"subject":"rollback at 14:00","to":"oncall@example.com"}' in out
    assert "key rk_exe_0001_2_0" in out and "owner executor-ops-1-4101-a1b2c3 epoch 3" in out
    assert "result 2 notes: rollback plan v2, rollback drill" in out
    # data is never a terminal escape nor markup: the escape and the bidi override show as text
    assert "\x1b" not in out and "\u202e" not in out
    assert "result \\x1b]0;pwned\\x07[red]not markup[/] \\u202egnp.exe" in out
    document = json.loads(runner.invoke(app, ["show", "s-alpha", "--json", "--data", str(data.root)]).stdout)
    calls = {c["call_id"]: c for c in document["tool_calls"]}
    assert calls["call_a3"]["result"] == HOSTILE and calls["call_a3"]["arguments"] == {"text": HOSTILE}
    assert calls["call_a2"]["state"] == "awaiting_approval" and calls["call_a2"]["result"] is None
    assert calls["call_a1"]["idempotency_key"] == "rk_exe_0001_1_0" and calls["call_a1"]["starts"] == 1
