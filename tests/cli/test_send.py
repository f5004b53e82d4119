"""`rem send` as a real subprocess: one JSON document, idempotent ids, bad input writes nothing."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import REM, rem_env, rem_json, run_rem


def _inputs(data: Path) -> list[tuple[str, str, str, int]]:
    with sqlite3.connect(data / "state.db") as conn:
        return conn.execute(
            "SELECT session_id, id, delivery, admitted_seq FROM session_input "
            "ORDER BY session_id, admitted_seq"
        ).fetchall()


def test_send_prints_one_json_document_and_is_idempotent_on_its_id(tmp_path: Path) -> None:
    data = tmp_path / "d"
    first = rem_json("send", "ops-1", "Why is the refund queue growing?", "--id", "in-1", "--data", str(data))
    assert first == {
        "session_id": "ops-1",
        "input_id": "in-1",
        "delivery": "queue",
        "admitted_seq": 1,
        "promoted_seq": None,
        "duplicate": False,
        "session_created": True,
    }
    steer = rem_json("send", "ops-1", "Focus on Adyen.", "--delivery", "steer", "--data", str(data))
    assert steer["admitted_seq"] == 2 and steer["delivery"] == "steer" and steer["input_id"].startswith("in_")
    again = run_rem(
        "send", "ops-1", "Why is the refund queue growing?", "--id", "in-1", "--json", "--data", str(data)
    )
    assert again.returncode == 0 and again.stderr == ""
    assert json.loads(again.stdout)["duplicate"] is True
    assert _inputs(data) == [("ops-1", "in-1", "queue", 1), ("ops-1", steer["input_id"], "steer", 2)]


def test_send_reads_the_text_from_stdin(tmp_path: Path) -> None:
    data = tmp_path / "d"
    proc = run_rem("send", "s1", "-", "--json", "--data", str(data), input=b"line one\nline two\n")
    assert proc.returncode == 0, proc.stderr
    with sqlite3.connect(data / "state.db") as conn:
        prompt = conn.execute("SELECT prompt FROM session_input").fetchone()[0]
    assert json.loads(prompt)["text"] == "line one\nline two\n"


@pytest.mark.parametrize(
    ("args", "stdin", "needle"),
    [
        (["s1", "hi", "--delivery", "later"], None, "Invalid value for '--delivery'"),
        (["s1", ""], None, "rem: error: the input text is empty"),
        (["s1", "-"], b"x" * (256 * 1024 + 1), "rem: error: the text on stdin is over the 262144 byte"),
        (["s1", "hi", "--id", "bad id!"], None, "rem: error: malformed input id 'bad id!'"),
        (["bad/session", "hi"], None, "rem: error: malformed session id"),
    ],
    ids=["delivery", "empty", "oversize", "id", "session"],
)
def test_bad_input_is_a_usage_error_and_writes_nothing(
    tmp_path: Path, args: list[str], stdin: bytes | None, needle: str
) -> None:
    data = tmp_path / "d"
    assert run_rem("send", "s1", "baseline", "--id", "base", "--data", str(data)).returncode == 0
    proc = run_rem("send", *args, "--json", "--data", str(data), input=stdin)
    assert proc.returncode == 2, proc.stderr
    assert proc.stdout == "" and "Traceback" not in proc.stderr
    assert needle in proc.stderr
    assert _inputs(data) == [("s1", "base", "queue", 1)]
    fresh = tmp_path / "fresh"
    assert run_rem("send", *args, "--data", str(fresh), input=stdin).returncode == 2
    assert not fresh.exists()  # refused before the data dir is even created


# Runs `rem send -` with 64 MiB on its stdin and prints its exit code, peak RSS (KiB) and stderr. A
# process forked from pytest itself would report pytest's own size as its peak (the high-water
# mark survives exec), so this small intermediary starts it and measures it.
MEASURE_SEND = """
import contextlib, json, os, subprocess, sys
proc = subprocess.Popen(sys.argv[1:], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
chunk = b"x" * (1024 * 1024)
try:
    for _ in range(64):
        proc.stdin.write(chunk)
except BrokenPipeError:
    pass
with contextlib.suppress(BrokenPipeError):
    proc.stdin.close()
err = proc.stderr.read().decode()
_, status, usage = os.wait4(proc.pid, 0)
print(json.dumps([os.waitstatus_to_exitcode(status), usage.ru_maxrss, err]))
"""


def test_stdin_is_read_only_up_to_the_limit(tmp_path: Path) -> None:
    """64 MiB on stdin: refused after reading 256 KiB + 1 byte, not after holding all of it in memory."""
    data = tmp_path / "d"
    measured = subprocess.run(
        [sys.executable, "-c", MEASURE_SEND, REM, "send", "s1", "-", "--data", str(data)],
        capture_output=True,
        text=True,
        env=rem_env(),
        timeout=120,
    )
    code, max_rss_kib, stderr = json.loads(measured.stdout)
    assert code == 2 and "over the 262144 byte (256 KiB) limit" in stderr, (measured, stderr)
    assert max_rss_kib < 120 * 1024, f"max RSS {max_rss_kib} KiB"  # rem's own imports are ~40 MB
    assert not data.exists()
