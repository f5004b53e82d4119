"""The SIGKILL drill on PostgreSQL, two hosts on one store: passes on a correct build, fails on a
deliberately broken one. Its own file (the SQLite drills are test_drill.py) so xdist runs the two in
parallel: together they were the suite's longest file by minutes."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from tests import pg
from tests.helpers import rem_env
from tests.reliability.drills import ZOMBIES_UNFENCED, drill

pytestmark = pytest.mark.slow


@pytest.fixture
def drill_db(pg_server: pg.LocalPostgres) -> Iterator[str]:
    """A fresh database of the session PostgreSQL for one drill (not REM_DB_URL: the drill gets --db)."""
    yield from pg.database_url(pg_server)


@pytest.mark.timeout(600)  # two drills in a row on one store
def test_drill_on_postgresql_with_two_hosts_passes(tmp_path: Path, drill_db: str) -> None:
    code, report = drill(
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
    code, again = drill(
        tmp_path, "--db", drill_db, "--role", "executor", "--rounds", "1", "--seed", "4", private=True
    )
    assert code == 0, json.dumps([again["settle_s"], again["check"]["violations"]], indent=1)[:4000]
    assert again["verdict"] == "pass"
    assert again["settle_s"] is not None and again["data_dir"] != report["data_dir"]
    with psycopg.connect(drill_db) as conn:
        repaired = conn.execute(
            "SELECT count(*) FROM event WHERE kind = 'memory.vectors_repaired'"
        ).fetchone()
    assert repaired is not None and repaired[0] >= 1, "the fresh Chroma's missing vectors were not repaired"
    # the second drill ran on a private dir (made under TMPDIR = tmp_path) and passed: it is gone,
    # host-b's data dir inside it too (this was a drill of its own on SQLite: the same code removes it)
    assert Path(again["data_dir"]).parent.parent == tmp_path
    assert list(tmp_path.glob("rem-drill-*")) == []


def test_drill_on_postgresql_fails_when_fencing_is_disabled(tmp_path: Path, drill_db: str) -> None:
    # up to 4 zombie rounds, not 2: a zombie paused inside a transaction can be cut off by PostgreSQL
    # itself (idle_in_transaction_session_timeout), so its late write never lands; 2 rounds missed once
    # in 4 runs. The settle wait ends at the first violation (see test_drill.py's SQLite twin)
    env = rem_env(REM_UNSAFE_DISABLE_FENCING="1")
    code, report = drill(tmp_path, "--db", drill_db, *ZOMBIES_UNFENCED, env=env, private=True)
    assert code == 1, json.dumps(report["rounds"], indent=1)  # which zombie rounds ran, and how
    assert report["verdict"] == "FAIL" and report["store"] == "postgresql"
    assert report["check"]["violations"], "the broken build went unnoticed on PostgreSQL"
    # no round ran after one that left a violation (it may show only after the last round: None)
    assert report["stopped_after"] in (None, len(report["rounds"])), json.dumps(report["rounds"], indent=1)
    kept = Path(report["data_dir"])  # a failed drill's private dir (logs of both hosts) stays
    assert kept.parent.parent == tmp_path and (kept / "hosts" / "host-b" / "logs").is_dir()
