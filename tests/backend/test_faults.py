"""Fault points: declared, wired into the code, and a bad `REM_FAULTS` fails at start-up in one line."""

from __future__ import annotations

import re
import sqlite3
from pathlib import Path

import pytest

from backend.core import faults
from backend.core.errors import FaultInjected, UsageError
from tests.helpers import rem_env, run_rem

ROOT = Path(__file__).resolve().parents[2]


def test_every_declared_point_is_reached_somewhere_in_the_backend() -> None:
    source = "\n".join(p.read_text() for p in (ROOT / "backend").rglob("*.py"))
    used = set(re.findall(r'faults\.point\("([a-z_.]+)"\)', source))
    assert used == set(faults.POINTS)


@pytest.mark.parametrize(
    ("raw", "needle"),
    [
        ("executor.bogus", "unknown fault point 'executor.bogus'; known points: dream.before_attest"),
        ("executor.mid_stream=explode", "unknown action 'explode' for executor.mid_stream"),
        ("executor.mid_stream@0", "executor.mid_stream@0 must name an arrival count of 1 or more"),
        ("executor.mid_stream@x", "executor.mid_stream@x must name an arrival count"),
    ],
)
def test_a_bad_rem_faults_is_a_usage_error(monkeypatch: pytest.MonkeyPatch, raw: str, needle: str) -> None:
    monkeypatch.setenv("REM_FAULTS", raw)
    faults.reset()
    with pytest.raises(UsageError, match=re.escape(needle)):
        faults.validate()


def test_a_valid_rem_faults_parses_and_fires_on_the_named_arrival(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REM_FAULTS", " dream.mid_graph@2=raise , executor.mid_stream ")
    faults.reset()
    assert faults.validate() == ["dream.mid_graph", "executor.mid_stream"]
    faults.point("dream.mid_graph")  # first arrival: nothing
    with pytest.raises(FaultInjected, match="dream.mid_graph"):
        faults.point("dream.mid_graph")
    faults.point("dream.mid_graph")  # fires once only


def test_a_daemon_refuses_a_typo_before_it_touches_anything(tmp_path: Path) -> None:
    data = tmp_path / "d"
    assert run_rem("send", "s1", "hello", "--data", str(data)).returncode == 0
    proc = run_rem(
        "daemon",
        "--role",
        "executor",
        "--once",
        "--data",
        str(data),
        env=rem_env(REM_FAULTS="executor.after_clam", REM_CHROMA_AUTOSTART="0"),
    )
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(
        "rem: error: REM_FAULTS names an unknown fault point 'executor.after_clam'"
    ), proc.stderr
    with sqlite3.connect(data / "state.db") as conn:
        assert conn.execute("SELECT count(*) FROM worker").fetchone()[0] == 0
        assert (
            conn.execute("SELECT count(*) FROM session_input WHERE promoted_seq IS NULL").fetchone()[0] == 1
        )
