"""Node clients for the API tests: the npm `eventsource` package (a WHATWG EventSource), installed
once into a cache directory the suite owns, pinned. Locally a machine that cannot install it skips,
saying why; in CI (`CI` set) that is a failure."""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

# eventsource 4.1 runs on Node >= 20 (5.x wants 22); its parser pinned too, so a release changes nothing
PACKAGES = ("eventsource@4.1.0", "eventsource-parser@3.1.1")
CACHE = Path(tempfile.gettempdir()) / "rem-tests-npm" / "eventsource-4.1.0"


def unavailable(why: str) -> None:
    if os.environ.get("CI"):
        pytest.fail(f"the EventSource client cannot run here: {why}")
    pytest.skip(f"the EventSource client cannot run here: {why}")


def node() -> str:
    found = shutil.which("node")
    if found is None:
        unavailable("node is not on PATH")
    return str(found)


def eventsource_module() -> Path:
    """The installed `eventsource` package's ES module (installed on first use, under a lock)."""
    module = CACHE / "node_modules" / "eventsource" / "dist" / "index.js"
    npm = shutil.which("npm")
    if npm is None:
        unavailable("npm is not on PATH")
    CACHE.mkdir(parents=True, exist_ok=True)
    with (CACHE.parent / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # xdist workers: one installs, the others wait
        if not module.exists():
            done = subprocess.run(
                [str(npm), "install", "--prefix", str(CACHE), "--no-save", "--no-audit", "--no-fund",
                 "--no-package-lock", *PACKAGES],
                capture_output=True, text=True, timeout=300,
            )  # fmt: skip
            if done.returncode != 0 or not module.exists():
                last = (done.stderr.strip().splitlines() or ["no output"])[-1]
                unavailable(f"`npm install {' '.join(PACKAGES)}` failed: {last}")
    return module
