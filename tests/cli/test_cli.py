"""The `rem` command line: help, JSON on stdout only, one-line errors, exit codes."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from backend.cli.app import app
from backend.store.schema import SCHEMA_VERSION
from tests.helpers import rem_env, run_rem

DESIGN_COMMANDS = [
    "init",
    "up",
    "daemon",
    "send",
    "status",
    "show",
    "replay",
    "drain",
    "release",
    "resume",
    "check",
    "drill",
    "console",
    "demo",
    "bench",
]


def _commands() -> list[list[str]]:
    return [[c] for c in DESIGN_COMMANDS if c != "drill"] + [["drill", "sigkill"]]


def test_help_lists_every_design_command() -> None:
    result = CliRunner().invoke(app, ["--help"])
    assert result.exit_code == 0
    for command in DESIGN_COMMANDS:
        assert f" {command} " in result.output, command


@pytest.mark.parametrize("command", _commands(), ids=" ".join)
def test_every_command_has_help_with_an_example(command: list[str]) -> None:
    result = CliRunner().invoke(app, [*command, "--help"])
    assert result.exit_code == 0, result.output
    assert "Example:" in result.output, f"`rem {' '.join(command)}` help has no example"


def test_init_then_status_prints_one_json_document(tmp_path: Path) -> None:
    data = tmp_path / "d"
    init = run_rem("init", "--data", str(data))
    assert init.returncode == 0, init.stderr
    assert init.stdout == ""  # notes go to stderr
    assert "created" in init.stderr
    status = run_rem("status", "--json", "--data", str(data))
    assert status.returncode == 0, status.stderr
    doc = json.loads(status.stdout)  # exactly one document: json.loads refuses trailing data
    assert doc["schema_version"] == SCHEMA_VERSION
    assert doc["data_dir"] == str(data)
    assert doc["chroma"]["healthy"] is False
    assert "rem up" in doc["chroma"]["error"]


def test_global_data_option_before_the_command(tmp_path: Path) -> None:
    data = tmp_path / "d"
    assert run_rem("--data", str(data), "init").returncode == 0
    assert (data / "state.db").is_file()


def _assert_one_line_error(proc: subprocess.CompletedProcess[str], *, rc: set[int], needle: str) -> None:
    assert proc.returncode in rc, (proc.returncode, proc.stderr)
    assert "Traceback" not in proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("rem: error: ")
    assert needle in lines[0]
    assert proc.stdout == ""


def test_data_pointing_at_a_file(tmp_path: Path) -> None:
    target = tmp_path / "file"
    target.write_text("x")
    proc = run_rem("init", "--data", str(target))
    _assert_one_line_error(proc, rc={2}, needle="is a file")


def test_data_that_cannot_be_created() -> None:
    proc = run_rem("init", "--data", "/proc/1/rem-data")
    _assert_one_line_error(proc, rc={2}, needle="cannot create data dir")


def test_data_dir_not_writable(tmp_path: Path) -> None:
    if os.geteuid() == 0:
        # root writes through permission bits; procfs directories refuse even root
        target = Path("/proc/1")
        assert not os.access(target, os.W_OK)
    else:
        target = tmp_path / "ro"
        target.mkdir()
        target.chmod(0o555)
    proc = run_rem("init", "--data", str(target))
    _assert_one_line_error(proc, rc={2}, needle="not writable")


def test_state_db_from_a_newer_schema(tmp_path: Path) -> None:
    data = tmp_path / "d"
    assert run_rem("init", "--data", str(data)).returncode == 0
    with sqlite3.connect(data / "state.db") as conn:
        conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 5}")
    proc = run_rem("status", "--json", "--data", str(data))
    _assert_one_line_error(proc, rc={1}, needle="newer than this rem supports")


def test_state_db_that_is_not_a_database(tmp_path: Path) -> None:
    data = tmp_path / "d"
    data.mkdir()
    (data / "state.db").write_bytes(b"this is not sqlite" * 200)
    proc = run_rem("status", "--json", "--data", str(data))
    _assert_one_line_error(proc, rc={1}, needle="not a readable rem database")


def test_non_chroma_url(tmp_path: Path) -> None:
    import http.server
    import threading

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"not chroma")

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        data = tmp_path / "d"
        assert run_rem("init", "--data", str(data)).returncode == 0
        url = f"http://127.0.0.1:{server.server_address[1]}"
        proc = run_rem("status", "--json", "--data", str(data), "--chroma-url", url)
        _assert_one_line_error(proc, rc={2}, needle="is not a Chroma server")
    finally:
        server.shutdown()


def test_malformed_chroma_url(tmp_path: Path) -> None:
    data = tmp_path / "d"
    assert run_rem("init", "--data", str(data)).returncode == 0
    proc = run_rem("status", "--data", str(data), "--chroma-url", "not a url")
    _assert_one_line_error(proc, rc={2}, needle="not an http(s) URL")


def test_backend_never_imports_the_ui_and_send_never_imports_chroma() -> None:
    code = (
        "import sys, pkgutil, importlib, backend\n"
        "import backend.cli.app\n"
        "assert 'chromadb' not in sys.modules, 'the CLI entry imports chromadb eagerly'\n"
        "for m in pkgutil.walk_packages(backend.__path__, 'backend.'):\n"
        "    importlib.import_module(m.name)\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('textual', 'tui'))\n"
        "assert not bad, bad\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr


def test_show_prints_the_transcript_as_json_and_names_an_unknown_session(tmp_path: Path) -> None:
    data = str(tmp_path / "d")
    assert run_rem("send", "s1", "Why did the export stall?", "--id", "q1", "--data", data).returncode == 0
    assert (
        run_rem(
            "daemon",
            "--role",
            "executor",
            "--once",
            "--data",
            data,
            env=rem_env(REM_AGENT_DELAY_MS="0", REM_CHROMA_AUTOSTART="0"),
        ).returncode
        == 0
    )
    proc = run_rem("show", "s1", "--json", "--data", data)
    assert proc.returncode == 0, proc.stderr
    shown = json.loads(proc.stdout)
    user, reply = shown["messages"]
    assert (user["id"], user["type"], user["text"]) == ("q1", "user", "Why did the export stall?")
    assert reply["status"] == "completed" and reply["answers"] == ["q1"]
    assert "".join(p["text"] for p in reply["parts"]) == reply["text"] != ""
    assert shown["session"]["usage"] == {
        "input": 0,
        "output": 0,
        "reasoning": 0,
        "cache_read": 0,
        "cache_write": 0,
    }
    human = run_rem("show", "s1", "--data", data)
    assert human.returncode == 0 and "#3 assistant" in human.stdout and "You asked" in human.stdout
    missing = run_rem("show", "nope", "--data", data)
    assert missing.returncode == 1 and missing.stderr.startswith("rem: error: no session 'nope'")
    refused = run_rem("resume", "s1", "--data", data)
    assert refused.returncode == 1 and "is not held" in refused.stderr
    assert run_rem("resume", "--data", data).returncode == 2  # neither ids nor --all


def test_a_read_only_command_on_an_older_schema_says_to_migrate_and_writes_nothing(tmp_path: Path) -> None:
    """Read-only opens cannot migrate: an older state.db is refused in one line naming `rem init`."""
    from backend.store import schema

    data = tmp_path / "old"
    data.mkdir(mode=0o700)
    conn = sqlite3.connect(data / "state.db", isolation_level=None)
    for script in schema.MIGRATIONS[:-1]:
        for statement in schema.split_statements(script):
            conn.execute(statement)
    conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION - 1}")
    conn.close()
    before = (data / "state.db").read_bytes()
    proc = run_rem("status", "--data", str(data))
    assert proc.returncode == 1, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert f"schema version {SCHEMA_VERSION - 1}, older than this rem reads ({SCHEMA_VERSION})" in lines[0]
    assert f"rem init --data {data}" in lines[0]
    assert (data / "state.db").read_bytes() == before and proc.stdout == ""
    assert run_rem("init", "--data", str(data)).returncode == 0  # the fix it names works
    assert (
        json.loads(run_rem("status", "--data", str(data), "--json").stdout)["schema_version"]
        == SCHEMA_VERSION
    )
