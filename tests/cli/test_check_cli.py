"""`rem check` from the command line: a Chroma it cannot reach is exit 3 and a line saying what
was not checked, never a violation; the `--data` of `rem demo` and `rem drill sigkill` says what
it does."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import typer.main
from typer.testing import CliRunner

from backend.cli.app import app
from backend.ops.checks import Report, summarize
from backend.programs.demo import fresh_data_dir
from tests.helpers import rem_env, run_rem


def _a_data_dir_with_a_receipt(root: Path, chroma_url: str, collection: str) -> dict[str, str]:
    """A data dir whose one session has a summary receipt, written to the suite's Chroma."""
    env = rem_env(REM_AGENT_DELAY_MS="0", REM_CHROMA_COLLECTION=collection)
    steps = (
        ("init", "--data", str(root)),
        ("send", "s1", "We moved the payments service on Tuesday.", "--data", str(root)),
        ("daemon", "--role", "executor", "--once", "--data", str(root)),
        ("daemon", "--role", "summarizer", "--once", "--data", str(root), "--chroma-url", chroma_url),
    )
    for argv in steps:
        proc = run_rem(*argv, env=env)
        assert proc.returncode == 0, (argv, proc.stderr)
    return env


def test_check_with_chroma_unreachable_exits_3_and_says_what_it_did_not_check(
    tmp_path: Path, chroma_url: str, collection: str
) -> None:
    root = tmp_path / "data"
    env = _a_data_dir_with_a_receipt(root, chroma_url, collection)

    down = run_rem("check", "--data", str(root), env=env)  # no Chroma of its own runs: unreachable
    assert down.returncode == 3, (down.stdout, down.stderr)
    assert "0 violations" in down.stdout and "violation (" not in down.stdout
    assert "INCOMPLETE (Chroma unreachable)" in down.stdout
    (line,) = [line for line in down.stdout.splitlines() if line.startswith("not checked")]
    assert "(invariants 2, 4, 6, 9)" in line and "{'error'" not in down.stdout
    assert "start it with `rem up`" in " ".join(down.stdout.split())

    report = json.loads(run_rem("check", "--data", str(root), "--json", env=env).stdout)
    assert report["ok"] is False and report["violations"] == [] and "chroma" not in report["checked"]
    (part,) = report["not_checked"]
    assert part["what"] == "chroma" and part["invariants"] == ["2", "4", "6", "9"]
    assert "Chroma not running" in part["error"]

    up = run_rem("check", "--data", str(root), "--chroma-url", chroma_url, "--json", env=env)
    assert up.returncode == 0, up.stdout
    verified = json.loads(up.stdout)
    assert verified["ok"] and verified["not_checked"] == [] and "chroma" in verified["checked"]


def test_a_violation_wins_over_an_unreachable_chroma() -> None:
    report = Report(not_checked=[{"what": "chroma", "invariants": ["2"], "error": "down"}])
    report.add(report.violations, "1", "inputs answered twice", [{"input_id": "u1"}])
    result = summarize(report, settled=False)
    assert not result["ok"] and result["violations"] and result["not_checked"]
    clean = summarize(Report(), settled=False)
    assert clean["ok"] and clean["not_checked"] == []


@pytest.mark.parametrize(
    ("command", "default"),
    [(["demo"], "/tmp/rem-demo-"), (["drill", "sigkill"], "/tmp/rem-drill-")],
    ids=" ".join,
)
def test_demo_and_drill_help_give_the_data_default_they_use(command: list[str], default: str) -> None:
    group: Any = typer.main.get_command(app)
    for word in command:
        group = group.commands[word]
    (data,) = [p for p in group.params if "--data" in p.opts]
    assert default in data.help and "$REM_DATA" in data.help and "not used" in data.help
    assert CliRunner().invoke(app, [*command, "--help"]).exit_code == 0


def test_the_demo_data_dir_is_a_fresh_temp_dir_whatever_rem_data_says(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("REM_DATA", str(tmp_path / "mine"))
    root, created = fresh_data_dir(None)
    try:
        assert created and root.name.startswith("rem-demo-") and root != tmp_path / "mine"
    finally:
        root.rmdir()
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("x")
    with pytest.raises(Exception, match="not empty"):
        fresh_data_dir(tmp_path / "full")
