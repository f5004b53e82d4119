"""The SIGKILL drill passes on a correct build and fails on a deliberately broken one."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers import rem_env, run_rem

pytestmark = pytest.mark.slow


def _drill(
    tmp_path: Path, *args: str, env: dict[str, str] | None = None, private: bool = False
) -> tuple[int, dict]:  # type: ignore[type-arg]
    """Run the drill on tmp_path/data, or (`private`) on its own temp dir made under tmp_path."""
    where = ["--data", str(tmp_path / "data")] if not private else []
    env = {**(env or rem_env()), **({"TMPDIR": str(tmp_path)} if private else {})}
    proc = run_rem("drill", "sigkill", *where, "--json", *args, env=env, timeout=600)
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc.returncode, json.loads(proc.stdout)


def test_drill_all_roles_passes_and_reports_recovery(tmp_path: Path) -> None:
    code, report = _drill(tmp_path, "--role", "all", "--pause", "--rounds", "5", "--seed", "3")
    assert code == 0, json.dumps(report["check"]["violations"], indent=1)
    assert report["verdict"] == "pass"
    assert [r["role"] for r in report["rounds"]] == ["executor", "summarizer", "dream", "chroma", "zombie"]
    for rnd in report["rounds"]:
        assert rnd["error"] is None, rnd
        assert rnd["pid"] and rnd["recovery_s"] is not None and rnd["recovery_s"] >= 0
    assert report["check"]["ok"] and report["check"]["settled_mode"]
    assert "chroma" in report["check"]["checked"]


def test_drill_fails_when_fencing_is_disabled(tmp_path: Path) -> None:
    env = rem_env(REM_UNSAFE_DISABLE_FENCING="1")
    code, report = _drill(
        tmp_path,
        "--role",
        "zombie",
        "--rounds",
        "2",
        "--seed",
        "1",
        "--settle-timeout",
        "30",
        env=env,
        private=True,
    )
    assert code == 1
    assert report["verdict"] == "FAIL"
    assert report["check"]["violations"], "the broken build went unnoticed"
    kept = Path(report["data_dir"])  # a failed drill's private dir stays for the post-mortem
    assert kept.parent.parent == tmp_path and (kept / "state.db").exists()


def test_a_passing_drill_removes_its_private_data_dir(tmp_path: Path) -> None:
    code, report = _drill(tmp_path, "--role", "executor", "--rounds", "1", "--seed", "2", private=True)
    assert code == 0 and report["verdict"] == "pass"
    assert Path(report["data_dir"]).parent.parent == tmp_path
    assert list(tmp_path.glob("rem-drill-*")) == []
