"""A daemon's log file stays under REM_LOG_MAX_BYTES: the newest lines in FILE, the ones before in FILE.1, none lost between them."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

from backend.core import private
from backend.core.logfile import CHECK_BYTES
from tests.helpers import rem_env

# a rem command sets up logging (backend/cli/app.py), then the process logs `count` lines of ~230 bytes
FLOOD = """
import logging, sys
from backend.cli.app import main
main(["tools", "--config", sys.argv[1]])
handler = logging.getLogger().handlers[0]
for i in range(int(sys.argv[2])):
    logging.getLogger("rem.test").warning("line %06d %s", i, "y" * 200)
print(type(handler).__name__, getattr(handler, "rotations", None))
"""
MAX_BYTES = 256 * 1024
LINES = 8000  # ~1.8 MB: seven rotations


def flood(tmp_path: Path, log: Path, log_file: Path) -> tuple[str, int]:
    config = tmp_path / "mcp.json"
    config.write_text(json.dumps({"mcpServers": {}}))
    env = rem_env(REM_LOG_FILE=str(log_file), REM_LOG_MAX_BYTES=str(MAX_BYTES))
    with private.open_private_append(log) as stderr:  # as the supervisor opens a daemon's log
        proc = subprocess.run(
            [sys.executable, "-c", FLOOD, str(config), str(LINES)],
            stdout=subprocess.PIPE,
            stderr=stderr,
            env=env,
            text=True,
            timeout=120,
            check=True,
        )
    name, rotations = proc.stdout.splitlines()[-1].split()
    return name, int(rotations) if rotations != "None" else -1


def numbers(path: Path) -> list[int]:
    return [int(m.group(1)) for m in re.finditer(r"line (\d{6}) y", path.read_text())]


def test_a_daemons_log_is_kept_under_its_bound_and_loses_no_line_at_a_rotation(tmp_path: Path) -> None:
    log = tmp_path / "executor-0.log"
    name, rotations = flood(tmp_path, log, log)
    assert name == "CappedStderrHandler" and rotations >= 5, (name, rotations)
    older = log.with_name(log.name + ".1")
    bound = MAX_BYTES + CHECK_BYTES + 1024
    assert log.stat().st_size <= bound and older.stat().st_size <= bound
    assert older.stat().st_mode & 0o777 == 0o600
    kept = numbers(older) + numbers(log)
    assert kept == list(range(kept[0], LINES)), "a line was lost between FILE.1 and FILE"
    assert len(kept) * 230 > MAX_BYTES  # more than one file's worth is kept


def test_a_log_file_that_is_not_stderrs_is_left_alone(tmp_path: Path) -> None:
    log = tmp_path / "up.log"
    name, _ = flood(tmp_path, log, tmp_path / "other.log")
    assert name == "StreamHandler" and numbers(log) == list(range(LINES))
    assert not (tmp_path / "other.log").exists() and not (tmp_path / "up.log.1").exists()
