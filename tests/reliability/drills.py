"""Running `rem drill sigkill --json` from the drill tests (tests/reliability/test_drill*.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.helpers import rem_env, run_rem

# The drill's system's lease (`--lease-ms`; the command's own default, 4000, stays for people and the
# benchmark page): the rig's (tests/reliability/rig.py LEASE_MS), renewed every 500 ms. Every takeover
# after a kill and every zombie round waits one lease out, so a test drill of ~10 rounds waits ~25 s
# less; what is proven (expiry, takeover, fencing of a woken zombie) is the same mechanism at any length.
LEASE_MS = "1500"


def drill(
    tmp_path: Path, *args: str, env: dict[str, str] | None = None, private: bool = False
) -> tuple[int, dict[str, Any]]:
    """Run the drill on tmp_path/data, or (`private`) on its own temp dir made under tmp_path, with the
    tests' short lease unless `args` name one."""
    where = ["--data", str(tmp_path / "data")] if not private else []
    env = {**(env or rem_env()), **({"TMPDIR": str(tmp_path)} if private else {})}
    lease = [] if "--lease-ms" in args else ["--lease-ms", LEASE_MS]
    proc = run_rem("drill", "sigkill", *where, "--json", *lease, *args, env=env, timeout=600)
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc.returncode, json.loads(proc.stdout)
