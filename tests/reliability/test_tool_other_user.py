"""A tool server and a tool config against rem run as an ordinary user (`nobody`, through setpriv).

* A stdio tool server runs as rem's user, so the kernel's same-user rules apply: it
  tries to read /proc/<its parent>/environ and mem (the model key, a database password)
  and reports what it got. rem's processes are non-dumpable: it gets nothing.
* The tool config's owner and mode, seen from a user who is not root: root's config
  passes (a system config), one group or others can write does not, nor another user's.

The suite runs as root, for whom neither rule holds (root reads everything); so these
tests run rem itself as nobody, with a Python nobody can execute and rem's packages on
PYTHONPATH (skipped when there is none).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.reliability.test_other_user import NOBODY, SETPRIV, require_other_user

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
LYING = ROOT / "tests" / "lying_mcp_server.py"
SECRET = "sk-rem-test-Hunter2-secret"
DB_SECRET = "pw-Hunter2-db"
NOBODY_UID = 65534


def _nobody_env(home: Path) -> dict[str, str]:
    paths = [str(ROOT), sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]]
    return {
        "PATH": "/usr/bin:/bin",
        "HOME": str(home),
        "LANG": "C.UTF-8",
        "PYTHONPATH": os.pathsep.join(dict.fromkeys(paths)),
        "PYTHONDONTWRITEBYTECODE": "1",
    }


def as_nobody(argv: list[str], env: dict[str, str], timeout: float = 120) -> subprocess.CompletedProcess[str]:
    assert SETPRIV is not None
    return subprocess.run(
        [SETPRIV, *NOBODY, *argv], env=env, capture_output=True, text=True, timeout=timeout, cwd="/"
    )


@pytest.fixture(scope="module")
def shared() -> Iterator[Path]:
    """A 0755 folder of root's, with a home for nobody in it."""
    require_other_user()
    parent = Path(tempfile.mkdtemp(prefix="rem-tool-other-user-"))
    os.chmod(parent, 0o755)
    home = parent / "home"
    home.mkdir(mode=0o700)
    os.chown(home, NOBODY_UID, NOBODY_UID)
    yield parent
    shutil.rmtree(parent, ignore_errors=True)


@pytest.fixture(scope="module")
def python(shared: Path) -> str:
    """A Python 3 nobody can run and check the path of, that imports rem (this one, or the system's)."""
    env = _nobody_env(shared / "home")
    probe = (  # rem checks who could change the program it runs: nobody must be able to look at its path
        "import os, sys, backend.tools.registry, mcp; os.stat(os.path.realpath(sys.argv[1])); "
        f"assert sys.version_info[:2] == {sys.version_info[:2]}"
    )
    for candidate in (sys.executable, shutil.which("python3", path="/usr/bin:/bin")):
        if candidate and as_nobody([candidate, "-c", probe, candidate], env).returncode == 0:
            return candidate
    pytest.skip("no Python that nobody can run imports rem here")


def _root_file(path: Path, text: str, mode: int = 0o644) -> Path:
    path.write_text(text)
    os.chown(path, 0, 0)
    os.chmod(path, mode)
    return path


def _peeker(shared: Path, python: str, name: str) -> tuple[Path, Path]:
    """A root-owned config whose one server reports what it can read of its parent into REPORT."""
    folder = shared / name
    folder.mkdir()
    os.chmod(folder, 0o755)  # not mkdir's mode: an earlier test in this process may have set umask 077
    out = folder / "out"
    out.mkdir(mode=0o700)
    os.chown(out, NOBODY_UID, NOBODY_UID)
    server = _root_file(folder / "lying_mcp_server.py", LYING.read_text())
    report = out / "report.json"
    spec = _root_file(folder / "spec.json", json.dumps({"tools": [], "report": str(report)}))
    servers = {"peeker": {"command": python, "args": ["-P", str(server), str(spec)]}}
    config = _root_file(folder / "mcp.json", json.dumps({"mcpServers": servers}))
    return config, report


def _secrets(env: dict[str, str]) -> dict[str, str]:
    return {**env, "REM_MODEL_API_KEY": SECRET, "PGPASSWORD": DB_SECRET}


def _saw_nothing_secret(report: Path, parent_must_be: str) -> dict[str, object]:
    seen = json.loads(report.read_text())
    assert seen["uid"] == NOBODY_UID  # the server ran as rem's user, nobody
    assert parent_must_be in seen["cmdline"]["text"], seen["cmdline"]  # its parent was that rem process
    assert seen["environ"] == {"ok": False, "error": "Permission denied", "errno": 13}, seen["environ"]
    assert not seen["mem"]["ok"], seen["mem"]
    assert SECRET not in report.read_text() and DB_SECRET not in report.read_text()
    assert seen["stat"]["ok"]  # ps, start times: still readable
    return seen


def test_a_tool_server_cannot_read_rem_tools_environment(shared: Path, python: str) -> None:
    config, report = _peeker(shared, python, "cli")
    env = _secrets(_nobody_env(shared / "home"))
    proc = as_nobody([python, "-P", "-m", "backend.cli.app", "tools", "--config", str(config), "--json"], env)
    assert proc.returncode == 0, proc.stderr  # a root-owned config is a system config: trusted
    assert json.loads(proc.stdout)["servers"][0]["state"] == "up"
    _saw_nothing_secret(report, "backend.cli.app")


STARTER = """
import asyncio, sys
from pathlib import Path
from backend.tools.registry import ToolRegistry

async def main():
    async with await ToolRegistry.load(config_path=Path(sys.argv[1]), entry_points=[]) as registry:
        await registry.catalogue()
        print(registry.health()[0]["state"])

asyncio.run(main())
"""


def test_any_process_that_starts_a_stdio_server_hides_its_environment(shared: Path, python: str) -> None:
    """The library alone (no `rem` command: nothing of backend.cli imported) is non-dumpable too."""
    config, report = _peeker(shared, python, "library")
    env = _secrets(_nobody_env(shared / "home"))
    proc = as_nobody([python, "-P", "-c", STARTER, str(config)], env)
    assert proc.returncode == 0 and proc.stdout.strip() == "up", proc.stderr
    _saw_nothing_secret(report, "ToolRegistry")


def test_a_config_others_can_write_is_refused_even_roots(shared: Path, python: str) -> None:
    folder = shared / "configs"
    folder.mkdir()
    os.chmod(folder, 0o755)
    env = _nobody_env(shared / "home")
    servers = json.dumps({"mcpServers": {"n": {"command": "true"}}})
    loose = _root_file(folder / "loose.json", servers, 0o666)
    theirs = _root_file(folder / "theirs.json", servers, 0o644)
    os.chown(theirs, 4242, 4242)  # another ordinary user's
    rem = [python, "-P", "-m", "backend.cli.app", "tools", "--json", "--config"]
    proc = as_nobody([*rem, str(loose)], env)
    assert proc.returncode == 2 and proc.stdout == "", proc
    assert proc.stderr == (
        f"rem: error: REM_MCP_CONFIG {loose}: (file): {loose} is writable by group or others (mode 666), "
        f"so another user could change what rem runs; `chmod go-w {loose}`\n"
    )
    proc = as_nobody([*rem, str(theirs)], env)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc
    assert f"{theirs} is owned by uid:4242 (uid 4242), not by you (nobody) or root" in proc.stderr
    assert "`chown nobody " in proc.stderr
