"""The SIGKILL drill passes on a correct build and fails on a deliberately broken one."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from tests import pg
from tests.helpers import rem_env, run_rem

pytestmark = pytest.mark.slow


def _drill(
    tmp_path: Path, *args: str, env: dict[str, str] | None = None, private: bool = False
) -> tuple[int, dict]:  # type: ignore[type-arg]
    """Run the drill on tmp_path/data, or (`private`) on its own temp dir made under tmp_path."""
    where = ["--data", str(tmp_path / "data")] if not private else []
    env = {**(env or rem_env()), **({"TMPDIR": str(tmp_path)} if private else {})}
    proc = run_rem("drill", "sigkill", *where, "--json", *args, env=env, timeout=600)
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc.returncode, json.loads(proc.stdout)


@pytest.mark.timeout(600)  # two drills, the second on the first one's data dir
def test_drill_all_roles_passes_and_reports_recovery(tmp_path: Path) -> None:
    code, report = _drill(tmp_path, "--role", "all", "--pause", "--rounds", "5", "--seed", "3")
    assert code == 0, json.dumps(report["check"]["violations"], indent=1)
    assert report["verdict"] == "pass"
    assert [r["role"] for r in report["rounds"]] == ["executor", "summarizer", "dream", "chroma", "zombie"]
    for rnd in report["rounds"]:
        assert rnd["error"] is None, rnd
        assert rnd["pid"] and rnd["recovery_s"] is not None and rnd["recovery_s"] >= 0
    assert report["check"]["ok"] and report["check"]["settled_mode"]
    assert "chroma" in report["check"]["checked"]
    # a second drill on the same data dir (its sessions, its Chroma's rows) settles too
    code, again = _drill(tmp_path, "--role", "executor", "--rounds", "1", "--seed", "4")
    assert code == 0, json.dumps([again["settle_s"], again["check"]["violations"]], indent=1)[:4000]
    assert again["settle_s"] is not None


def test_drill_fails_when_fencing_is_disabled(tmp_path: Path) -> None:
    env = rem_env(REM_UNSAFE_DISABLE_FENCING="1")
    code, report = _drill(
        tmp_path,
        "--role",
        "zombie",
        "--rounds",
        "2",
        "--seed",
        "1",
        "--settle-timeout",
        "30",
        env=env,
        private=True,
    )
    assert code == 1
    assert report["verdict"] == "FAIL"
    assert report["check"]["violations"], "the broken build went unnoticed"
    kept = Path(report["data_dir"])  # a failed drill's private dir stays for the post-mortem
    assert kept.parent.parent == tmp_path and (kept / "state.db").exists()


def test_a_passing_drill_removes_its_private_data_dir(tmp_path: Path) -> None:
    code, report = _drill(tmp_path, "--role", "executor", "--rounds", "1", "--seed", "2", private=True)
    assert code == 0 and report["verdict"] == "pass"
    assert Path(report["data_dir"]).parent.parent == tmp_path
    assert list(tmp_path.glob("rem-drill-*")) == []


@pytest.fixture
def drill_db(pg_server: pg.LocalPostgres) -> Iterator[str]:
    """A fresh database of the session PostgreSQL for one drill (not REM_DB_URL: the drill gets --db)."""
    yield from pg.database_url(pg_server)


@pytest.mark.timeout(600)  # two drills in a row on one store
def test_drill_on_postgresql_with_two_hosts_passes(tmp_path: Path, drill_db: str) -> None:
    code, report = _drill(
        tmp_path, "--db", drill_db, "--role", "all", "--pause", "--rounds", "5", "--seed", "3"
    )
    assert code == 0, json.dumps([report["rounds"], report["check"]["violations"]], indent=1)
    assert report["verdict"] == "pass" and report["store"] == "postgresql"
    assert report["hosts"] == ["host-a", "host-b"]
    assert [r["role"] for r in report["rounds"]] == ["executor", "summarizer", "dream", "chroma", "zombie"]
    for rnd in report["rounds"]:
        assert rnd["error"] is None, rnd
        assert rnd["pid"] and rnd["recovery_s"] is not None
    assert report["check"]["ok"] and report["check"]["settled_mode"]
    assert "chroma" in report["check"]["checked"]
    # both hosts really ran on the one store: each registered its workers under its own identity
    data = Path(report["data_dir"])
    assert (data / "hosts" / "host-b" / "logs").is_dir()
    assert not (data / "state.db").exists() and not (data / "hosts" / "host-b" / "state.db").exists()
    with psycopg.connect(drill_db) as conn:
        hosts = {row[0] for row in conn.execute("SELECT DISTINCT host FROM worker")}
    assert hosts == {"host-a", "host-b"}
    # two drills in a row: the second brings a fresh Chroma to a store that says vectors were
    # written; Dream's sweep writes them again, the summarizer's replays the summary rows
    code, again = _drill(
        tmp_path, "--db", drill_db, "--role", "executor", "--rounds", "1", "--seed", "4", private=True
    )
    assert code == 0, json.dumps([again["settle_s"], again["check"]["violations"]], indent=1)[:4000]
    assert again["settle_s"] is not None and again["data_dir"] != report["data_dir"]
    with psycopg.connect(drill_db) as conn:
        repaired = conn.execute(
            "SELECT count(*) FROM event WHERE kind = 'memory.vectors_repaired'"
        ).fetchone()
    assert repaired is not None and repaired[0] >= 1, "the fresh Chroma's missing vectors were not repaired"


def test_drill_on_postgresql_fails_when_fencing_is_disabled(tmp_path: Path, drill_db: str) -> None:
    # 4 zombie rounds, not 2: a zombie paused inside a transaction can be cut off by PostgreSQL itself
    # (idle_in_transaction_session_timeout), so its late write never lands; 2 rounds missed once in 4 runs
    env = rem_env(REM_UNSAFE_DISABLE_FENCING="1")
    code, report = _drill(
        tmp_path,
        "--db",
        drill_db,
        "--role",
        "zombie",
        "--rounds",
        "4",
        "--seed",
        "1",
        "--settle-timeout",
        "30",
        env=env,
        private=True,
    )
    assert code == 1
    assert report["verdict"] == "FAIL" and report["store"] == "postgresql"
    assert report["check"]["violations"], "the broken build went unnoticed on PostgreSQL"
    kept = Path(report["data_dir"])  # a failed drill's private dir (logs of both hosts) stays
    assert kept.parent.parent == tmp_path and (kept / "hosts" / "host-b" / "logs").is_dir()


def test_drill_refuses_a_bad_db_url_in_one_line(tmp_path: Path) -> None:
    proc = run_rem("drill", "sigkill", "--db", "mysql://x/y", "--rounds", "1", env=rem_env(), timeout=60)
    assert proc.returncode != 0 and proc.stdout == ""
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("rem: error:") and "postgresql://" in lines[0], proc.stderr
