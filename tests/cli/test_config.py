"""The CLI hands the library an explicit configuration: `--db` and `--data` reach the library through
the run's `Config`, never through this process's environment (children get the store in theirs)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from backend.cli.app import main
from backend.core.datadir import DataDir
from backend.runtime.context import Context


def test_db_reaches_the_library_explicitly_and_leaves_the_environment_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("REM_DB_URL", raising=False)
    url = "postgresql://rem:hunter22@127.0.0.1:9/rem"  # nothing listens on port 9 (discard)
    code = main(["--db", url, "--data", str(tmp_path / "d"), "status", "--json"])
    out, err = capsys.readouterr()
    assert code == 3 and out == "", err  # the store named by --db was tried: unreachable
    (line,) = err.splitlines()
    assert line.startswith("rem: error: cannot reach the state store at postgresql://rem:***@127.0.0.1:9/rem")
    assert "hunter22" not in err
    assert "REM_DB_URL" not in os.environ
    assert not (tmp_path / "d").exists()  # read-only: nothing created in --data either


def test_a_child_gets_the_store_in_its_environment_blank_for_state_db(tmp_path: Path) -> None:
    url = "postgresql://rem@db.example/rem"
    assert Context(DataDir(tmp_path), db_url=url).store_env() == {"REM_DB_URL": url}
    assert Context(DataDir(tmp_path), db_url=None).store_env() == {"REM_DB_URL": ""}


def test_a_bad_rem_db_url_is_one_line_before_anything_reads_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("REM_DB_URL", "mysql://rem:hunter22@db.example/rem")
    assert main(["status", "--data", str(tmp_path / "d")]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.splitlines() == [
        "rem: error: REM_DB_URL='mysql://rem:***@db.example/rem' is not a postgresql:// URL; fix it or unset "
        "it (default: state.db in the data dir)"
    ]
