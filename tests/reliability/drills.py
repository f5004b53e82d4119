"""Running `rem drill sigkill --json` from the drill tests (tests/reliability/test_drill*.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.helpers import rem_env, run_rem


def drill(
    tmp_path: Path, *args: str, env: dict[str, str] | None = None, private: bool = False
) -> tuple[int, dict[str, Any]]:
    """Run the drill on tmp_path/data, or (`private`) on its own temp dir made under tmp_path."""
    where = ["--data", str(tmp_path / "data")] if not private else []
    env = {**(env or rem_env()), **({"TMPDIR": str(tmp_path)} if private else {})}
    proc = run_rem("drill", "sigkill", *where, "--json", *args, env=env, timeout=600)
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc.returncode, json.loads(proc.stdout)
