"""The Node programs tests run against rem, pinned with their lock file in tests/npm/: Node 22 (the
machine's Node may be older; the MCP conformance suite needs 22's `fs.globSync`) and the MCP
conformance suite, both from the npm registry.

They install into tests/npm/node_modules (ignored by git), once per lock file: `.ci/run` starts
`python3 tests/npm_tools.py` beside pip's install, and a test that needs them calls `install()`,
which waits for an install under way (a file lock) and does nothing when the stamp says the
install is whole and of the current lock file. Standard library only: it runs before the venv
exists.
"""

from __future__ import annotations

import fcntl
import hashlib
import subprocess
import sys
from pathlib import Path

NPM_DIR = Path(__file__).resolve().parent / "npm"
MODULES = NPM_DIR / "node_modules"
# written last, holding the lock file's hash: an install cut short leaves none
STAMP = MODULES / ".rem-installed"
LOCK = NPM_DIR / ".install.lock"
NODE = MODULES / "node" / "bin" / "node"
CONFORMANCE = MODULES / "@modelcontextprotocol" / "conformance" / "dist" / "index.js"
INSTALL_TIMEOUT_S = 600


def lock_digest() -> str:
    """The SHA-256 of tests/npm/package-lock.json: what an install is of."""
    return hashlib.sha256((NPM_DIR / "package-lock.json").read_bytes()).hexdigest()


def installed() -> bool:
    """Whether node_modules holds a whole install of the current lock file."""
    try:
        return STAMP.read_text() == lock_digest() and NODE.exists()
    except FileNotFoundError:
        return False


def install() -> None:
    """Install the lock file's packages unless they are (`npm ci`: exactly the lock, nothing else);
    raises OSError or CalledProcessError (with npm's output) when npm cannot."""
    with LOCK.open("w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)  # another process's install: wait for it, then use it
        if installed():
            return
        print(f"tests/npm_tools.py: installing {NPM_DIR}/node_modules (npm ci)", file=sys.stderr)
        subprocess.run(
            ["npm", "ci", "--no-audit", "--no-fund", "--loglevel=error"],
            cwd=NPM_DIR,
            check=True,
            capture_output=True,
            text=True,
            timeout=INSTALL_TIMEOUT_S,
        )
        STAMP.write_text(lock_digest())


if __name__ == "__main__":
    try:
        install()
    except (OSError, subprocess.SubprocessError) as exc:
        output = getattr(exc, "stderr", "") or ""
        print(f"tests/npm_tools.py: npm ci failed: {exc}\n{output[-2000:]}", file=sys.stderr)
        sys.exit(1)
