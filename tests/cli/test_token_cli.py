"""`rem token create|list|revoke` through the real CLI: the secret alone on stdout, once; the list
never shows it; a revoked token is gone from the live list."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from tests.helpers import REM


def _rem(data: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([REM, "--data", str(data), *args], capture_output=True, text=True, timeout=60)


def test_create_prints_the_token_alone_and_list_never_shows_it(tmp_path: Path) -> None:
    data = tmp_path / "data"
    assert _rem(data, "init").returncode == 0
    made = _rem(data, "token", "create", "web", "--project", "support", "--scope", "write")
    assert made.returncode == 0, made.stderr
    token = made.stdout.strip()
    assert made.stdout == token + "\n" and token.startswith("rem_") and len(token) == 47
    assert "web" in made.stderr and token not in made.stderr
    listed = _rem(data, "token", "list", "--json")
    rows = json.loads(listed.stdout)
    assert [(r["name"], r["projects"], r["scopes"]) for r in rows] == [("web", ["support"], ["write"])]
    assert token not in listed.stdout and token not in _rem(data, "token", "list").stdout
    again = _rem(data, "token", "create", "web", "--all-projects")
    assert again.returncode == 1 and again.stdout == "" and "revoke it first" in again.stderr
    assert _rem(data, "token", "revoke", "web").returncode == 0
    assert json.loads(_rem(data, "token", "list", "--json").stdout) == []
    bad = _rem(data, "token", "create", "x", "--project", "p", "--scope", "admin")
    assert bad.returncode == 2 and bad.stderr.startswith("rem: error: unknown scope")
