"""`rem import` is all or nothing per session, and says so: real `rem import` processes.

* a lone surrogate (`\\ud800`) in the middle of 6 001 messages: refused on its
  line, with the number; its session is left out whole, every other one is in;
* a real SIGINT while sessions are being written: only whole sessions are
  in, the report names what was written and what was not, exit 130, and the
  same import run again finishes the job;
* a failure while writing (the file changed under the import): the same,
  with the error in one line.

The import is paused with SIGSTOP once its first session is committed, so
the signal or the change lands while writing, whatever the machine's speed.
"""

from __future__ import annotations

import json
import signal
import sqlite3
import subprocess
from collections import Counter
from pathlib import Path
from typing import Any

from tests.helpers import REM, rem_env, wait_until

PER_SESSION = 10


def _write(path: Path, sessions: int, *, surrogate_at: int | None = None) -> list[str]:
    """`sessions` sessions of PER_SESSION messages (+1 extra line on the last); the lines written."""
    lines = []
    for s in range(sessions):
        for m in range(PER_SESSION + (1 if s == sessions - 1 else 0)):
            text = f"message {m} of session {s}: the ledger export stalled again"
            line = json.dumps(
                {
                    "project": "p",
                    "session": f"s{s:05d}",
                    "id": f"s{s:05d}-{m}",
                    "role": "user" if m % 2 == 0 else "assistant",
                    "speaker": "Maya",
                    "text": text,
                    "time": 1_700_000_000_000 + len(lines),
                }
            )
            if len(lines) + 1 == surrogate_at:
                line = line.replace("stalled", "stalled \\ud800")
            lines.append(line)
    path.write_text("\n".join(lines) + "\n")
    return lines


def _sessions(data: Path) -> Counter[str]:
    db = data / "state.db"
    if not db.exists():
        return Counter()
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=10)
    try:
        rows = conn.execute("SELECT session_id, count(*) FROM session_message GROUP BY session_id").fetchall()
    except sqlite3.OperationalError:  # the schema is not there yet
        return Counter()
    finally:
        conn.close()
    return Counter({sid: n for sid, n in rows})


def _whole(found: Counter[str], total: int) -> None:
    last = f"s{total - 1:05d}"
    for sid, n in found.items():
        assert n == PER_SESSION + (1 if sid == last else 0), (sid, n)


def _import(path: Path, data: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [REM, "import", str(path), "--data", str(data), "--json"],
        capture_output=True,
        text=True,
        env=rem_env(),
    )


def test_a_lone_surrogate_in_the_middle_is_refused_on_its_line_and_the_rest_is_whole(tmp_path: Path) -> None:
    path, data = tmp_path / "chats.jsonl", tmp_path / "data"
    lines = _write(path, 600, surrogate_at=3000)
    assert len(lines) == 6001
    result = _import(path, data)
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr
    report = json.loads(result.stdout)
    (error,) = report["errors"]
    assert error["line"] == 3000 and error["session"] == "s00299"
    assert "lone surrogate" in error["error"] and "\\ud800" in error["error"]
    assert report["sessions_skipped"] == ["s00299"] and report["written"] == 6001 - PER_SESSION
    found = _sessions(data)
    assert len(found) == 599 and "s00299" not in found
    _whole(found, 600)
    # the text form names the line too, in one line
    again = subprocess.run([REM, "import", str(path), "--data", str(data)], capture_output=True, text=True)
    assert again.returncode == 1 and "line 3000: text holds a lone surrogate" in again.stdout


def _stopped_mid_write(
    path: Path, data: Path, act: Any
) -> tuple[subprocess.CompletedProcess[str], Counter[str]]:
    """Start an import, pause it once its first session is in, `act(proc)`, resume, and wait for it."""
    proc = subprocess.Popen(
        [REM, "import", str(path), "--data", str(data), "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=rem_env(),
    )
    try:
        wait_until(lambda: _sessions(data) or proc.poll() is not None, timeout=120, interval=0.01)
        proc.send_signal(signal.SIGSTOP)
        assert proc.poll() is None, "the import ended before it could be interrupted"
        act(proc)
        proc.send_signal(signal.SIGCONT)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err), _sessions(data)


def test_sigint_while_writing_leaves_whole_sessions_and_says_what_was_written(tmp_path: Path) -> None:
    path, data = tmp_path / "chats.jsonl", tmp_path / "data"
    _write(path, 3000)
    result, found = _stopped_mid_write(path, data, lambda proc: proc.send_signal(signal.SIGINT))
    assert result.returncode == 130, result.stderr
    assert "Traceback" not in result.stderr
    report = json.loads(result.stdout)
    assert report["interrupted"] is True and report["stopped_while"] == "writing" and not report["ok"]
    assert 0 < report["sessions_written"] == len(found) < 3000
    assert report["sessions_not_written"] == 3000 - len(found)
    assert set(report["not_written"]).isdisjoint(found) and len(report["not_written"]) == 50
    assert report["written"] == sum(found.values())
    _whole(found, 3000)
    last = result.stderr.strip().splitlines()[-1]
    assert last == (
        f"rem: interrupted: {len(found)} session(s) written whole, {3000 - len(found)} not written; "
        "run the same import again to finish"
    )
    # the same import finishes the job: what was written is skipped
    again = _import(path, data)
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout)["already_imported"] == report["written"]
    finished = _sessions(data)
    assert len(finished) == 3000
    _whole(finished, 3000)


def test_a_failure_while_writing_leaves_whole_sessions_and_says_so_in_one_line(tmp_path: Path) -> None:
    path, data = tmp_path / "chats.jsonl", tmp_path / "data"
    lines = _write(path, 3000)

    def change_the_last_line(_: object) -> None:  # same length, so every offset still holds
        with path.open("r+b") as handle:
            handle.seek(-len(lines[-1]) - 1, 2)
            handle.write(b"x" * len(lines[-1]))

    result, found = _stopped_mid_write(path, data, change_the_last_line)
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    report = json.loads(result.stdout)
    assert report["failure"].startswith(f"line {len(lines)} changed while it was imported")
    assert report["sessions_written"] == len(found) and report["sessions_not_written"] == 3000 - len(found)
    assert "s02999" not in found
    _whole(found, 3000)
    (error_line,) = [line for line in result.stderr.splitlines() if line.startswith("rem: error: ")]
    assert f"{len(found)} session(s) were written whole, {3000 - len(found)} not" in error_line
