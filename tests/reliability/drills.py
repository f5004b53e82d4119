"""Running `rem drill sigkill --json` from the drill tests (tests/reliability/test_drill*.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.helpers import rem_env, run_rem

# The drill's system's lease in tests (`--lease-ms`): the command's own default, as people run it. A
# 1.5 s lease (the rig's) saved ~25 s of waiting a test drill, but on two busy cores a whole fleet's
# renewals every 500 ms were late often enough that a drill round failed in CI (2026-12-07).
LEASE_MS = "4000"
# a drill of zombie rounds for a build with fencing off: up to four rounds (two missed a violation in some
# runs), none after the first that left one (they all ran before --stop-at-violation)
ZOMBIES_UNFENCED = (
    "--role",
    "zombie",
    "--rounds",
    "4",
    "--seed",
    "1",
    "--settle-timeout",
    "30",
    "--stop-at-violation",
)


def drill(
    tmp_path: Path, *args: str, env: dict[str, str] | None = None, private: bool = False
) -> tuple[int, dict[str, Any]]:
    """Run the drill on tmp_path/data, or (`private`) on its own temp dir made under tmp_path, with the
    tests' lease unless `args` name one."""
    where = ["--data", str(tmp_path / "data")] if not private else []
    env = {**(env or rem_env()), **({"TMPDIR": str(tmp_path)} if private else {})}
    lease = [] if "--lease-ms" in args else ["--lease-ms", LEASE_MS]
    proc = run_rem("drill", "sigkill", *where, "--json", *lease, *args, env=env, timeout=600)
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc.returncode, json.loads(proc.stdout)
