"""The CI gates, run by `python -m pytest` itself before any test: ruff, ruff format, mypy, import-linter,
and the docs site (`mkdocs build --strict`: a broken link or anchor fails it; offline, a few seconds).

They run when the whole suite runs (no test paths named on the command line)
or with `--gates`; `--no-gates` skips them. The five run at once; any failure
ends the session with exit 1 and that gate's own output, before a test starts.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent

GATES: dict[str, list[str]] = {
    "ruff check": [sys.executable, "-m", "ruff", "check", "."],
    "ruff format --check": [sys.executable, "-m", "ruff", "format", "--check", "."],
    "mypy (strict: backend, tui)": [sys.executable, "-m", "mypy"],
    "import-linter (layers)": [str(BIN / "lint-imports"), "--no-cache"],
    # the site goes to a temp dir (removed after), never into the checkout
    "mkdocs build --strict (docs)": [
        sys.executable,
        "-m",
        "mkdocs",
        "build",
        "--strict",
        "--quiet",
        "--site-dir",
    ],
}
# Material's end-of-life banner is not a warning of this build; it would only add noise to a failure
GATE_ENV = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("rem gates")
    group.addoption("--gates", action="store_true", default=None, help="Run the lint/type/layer gates first.")
    group.addoption("--no-gates", action="store_false", dest="gates", help="Skip the lint/type/layer gates.")


def _wanted(config: pytest.Config) -> bool:
    chosen = config.getoption("gates")
    if chosen is not None:
        return bool(chosen)
    return not config.args or config.args == [str(ROOT / "tests")] or config.args == ["tests"]


def run_gates() -> dict[str, subprocess.CompletedProcess[str]]:
    """Run every gate at once from the project root; returns each one's finished process."""
    site = tempfile.mkdtemp(prefix="rem-docs-site-")
    commands = {name: cmd + [site] if cmd[-1] == "--site-dir" else cmd for name, cmd in GATES.items()}
    try:
        procs = {
            name: subprocess.Popen(
                cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=GATE_ENV
            )
            for name, cmd in commands.items()
        }
        done = {}
        for name, proc in procs.items():
            out, _ = proc.communicate()
            done[name] = subprocess.CompletedProcess(proc.args, proc.returncode, out, "")
        return done
    finally:
        shutil.rmtree(site, ignore_errors=True)


def pytest_sessionstart(session: pytest.Session) -> None:
    if hasattr(session.config, "workerinput"):  # a pytest-xdist worker: the controller ran them
        return
    if not _wanted(session.config):
        return
    results = run_gates()
    failed = {name: r for name, r in results.items() if r.returncode != 0}
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    write = reporter.write_line if reporter is not None else print
    for name, result in results.items():
        write(f"gate {name}: {'FAILED' if result.returncode else 'ok'}")
    if failed:
        for name, result in failed.items():
            write(f"\n---- {name} ----\n{result.stdout.rstrip()}")
        pytest.exit(f"{len(failed)} gate(s) failed: {', '.join(failed)}", returncode=1)
