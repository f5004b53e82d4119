"""Stored text reaches the terminal inert: `rem recall`, `show`, `status` and `check` print markup as
typed and control characters as escapes (`backend.core.inert.visible`); `--json` stays exact.

The data dir is real (import, then the summarizer and Dream on the session's Chroma server);
the hypothesis test then puts hostile text into the stored fields those commands print and
runs them in-process, one example after another.
"""

from __future__ import annotations

import json
import re
import sqlite3
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings

from backend.chroma.server import ChromaServer
from backend.cli.app import main
from backend.core.inert import is_inert, visible
from tests.helpers import rem_env, run_rem
from tests.hostile import as_column, hostile_text

TOKEN = "zebrafish"
# the issue's reproductions: a `[/]` crashed recall, `[bold red]` was styled, `[link=…]` was a
# link; `ESC]0;` retitled the terminal, `ESC[2J` cleared it, a NUL reached it
ISSUE_TURN = (
    f"{TOKEN} [/] [bold red]RED[/] [link=https://evil.example]click[/link] "
    "\x1b]0;pwned\x07 \x1b[2J nul\x00 end"
)
SGR = re.compile(r"\x1b\[[0-9;]*m")  # Rich's own colours on a forced terminal


@pytest.fixture(scope="module")
def hostile_dir(tmp_path_factory: pytest.TempPathFactory, chroma: ChromaServer) -> Iterator[dict[str, str]]:
    """A data dir with one imported session holding the issue's turn, summarized and indexed."""
    root = tmp_path_factory.mktemp("inert")
    lines = root / "chat.jsonl"
    row = {
        "project": "ops",
        "session": "s1",
        "id": "m1",
        "role": "user",
        "speaker": "eve",
        "text": ISSUE_TURN,
    }
    lines.write_text(json.dumps({**row, "time": 1_700_000_000_000}) + "\n")
    collection = f"t_{uuid.uuid4().hex[:12]}"
    env = rem_env(REM_CHROMA_URL=chroma.url, REM_CHROMA_COLLECTION=collection, COLUMNS="400")
    data = str(root / "data")
    assert run_rem("import", str(lines), "--data", data, env=env).returncode == 0
    for role in ("summarizer", "dream"):
        done = run_rem("daemon", "--role", role, "--once", "--data", data, env=env)
        assert done.returncode == 0, done.stderr
    yield {"data": data, "url": chroma.url, "collection": collection, "env": json.dumps(env)}


def _terminal_output(out: str) -> str:
    """What a terminal would be left with once Rich's own colours are taken out."""
    rest = SGR.sub("", out)
    assert is_inert(rest, multiline=True), repr(rest)  # no ESC, NUL, C1, bidi, ... from the data
    return rest


def test_the_issue_reproductions_reach_a_terminal_as_text(hostile_dir: dict[str, str]) -> None:
    env = {**json.loads(hostile_dir["env"]), "FORCE_COLOR": "1", "TERM": "xterm-256color"}
    common = ("--data", hostile_dir["data"])
    shown = visible(ISSUE_TURN.replace("\x00", "\ufffd"))  # the import kept the NUL as U+FFFD
    for args in (("recall", TOKEN, "--project", "ops"), ("show", "s1")):
        proc = run_rem(*args, *common, env=env)
        assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
        assert "\x1b[" in proc.stdout  # a terminal: Rich styles its own words
        assert "\x1b]" not in proc.stdout  # no title, no hyperlink
        assert shown in _terminal_output(proc.stdout)


def _rem(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def _store(data: str, text: str) -> None:
    """Hostile text in every stored field the four commands print."""
    conn = sqlite3.connect(Path(data) / "state.db", isolation_level=None)
    try:
        conn.execute("BEGIN IMMEDIATE")
        message = {"role": "user", "text": f"{TOKEN} {text}", "speaker": "eve"}
        conn.execute("UPDATE session_message SET data = ? WHERE id = 'm1'", (json.dumps(message),))
        line = as_column(text)
        conn.execute("UPDATE memory_turn SET speaker = ? WHERE message_id = 'm1'", (line[:100],))
        conn.execute(
            "UPDATE session SET title = ?, held_at = 1, held_reason = ? WHERE id = 's1'", (line, line)
        )
        conn.execute(
            "UPDATE summary_job SET status = 'failed', last_error = ? WHERE session_id = 's1'", (line,)
        )
        conn.execute("DELETE FROM worker")
        conn.execute(
            "INSERT INTO worker (owner_id, role, pid, host, started_at, heartbeat_at) "
            "VALUES ('executor-h-1-aa', 'executor', 1, ?, 1, 1)",
            (line,),
        )
        conn.execute("COMMIT")
    finally:
        conn.close()


def _flat(text: str) -> str:
    return " ".join(text.split())


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=hostile_text)
def test_stored_text_prints_inert_in_recall_show_status_and_check(
    hostile_dir: dict[str, str],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    text: str,
) -> None:
    monkeypatch.setenv("COLUMNS", "2000")  # no wrapping: the text is looked for whole
    monkeypatch.setenv("REM_CHROMA_URL", hostile_dir["url"])
    monkeypatch.setenv("REM_CHROMA_COLLECTION", hostile_dir["collection"])
    data = hostile_dir["data"]
    _store(data, text)
    line = as_column(text)
    common = ("--data", data)
    expected = {
        # recall shows the turn on one line, cut to 160 characters
        ("recall", TOKEN, "--project", "ops"): visible(" ".join(f"{TOKEN} {text}".split())[:160]),
        ("show", "s1"): visible(f"{TOKEN} {text}", multiline=True),
        ("status",): visible(line),  # the held reason and the worker's host
        ("check",): visible(line),  # the failed summary job's last error, a field of its row
    }
    for args, shown in expected.items():
        code, out, err = _rem(capsys, *args, *common)
        assert code in (0, 1) and "Traceback" not in err, err  # check: 1 on a violation
        assert is_inert(out, multiline=True) and is_inert(err, multiline=True), (args, out, err)
        assert _flat(shown) in _flat(out), (args, shown, out)
    # --json stays exact JSON: the stored text itself, escaped by JSON alone
    code, out, _ = _rem(capsys, "show", "s1", "--json", *common)
    assert code == 0 and json.loads(out)["messages"][0]["text"] == f"{TOKEN} {text}"
