"""A private data dir: 0700/0600, tightened when opened, refused when another user controls it."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from backend.chroma import server as chroma_server
from backend.core import datadir, private
from backend.core.datadir import DataDir
from backend.core.errors import DataDirError
from backend.runtime.context import Context
from tests.helpers import rem_env, run_rem

NOBODY = 65534


def modes(root: Path) -> dict[str, int]:
    """Every path under `root` (relative) and its permission bits, symlinks not followed."""
    found = {".": stat.S_IMODE(root.stat().st_mode)}
    for path in root.rglob("*"):
        found[str(path.relative_to(root))] = stat.S_IMODE(path.lstat().st_mode)
    return found


def loosen(root: Path) -> None:
    """What an older rem left: world-readable everything."""
    for path in [root, *root.rglob("*")]:
        os.chmod(path, 0o755 if path.is_dir() else 0o644)


async def test_everything_a_new_data_dir_holds_is_private(tmp_path: Path) -> None:
    old = os.umask(0o022)  # a library caller's loose umask: rem's own modes must not depend on it
    data = DataDir(tmp_path / "data")
    try:
        ctx = Context(data, collection="t_private")
        db = await ctx.db()
        await db.scalar("SELECT count(*) FROM session")
        await ctx.store().count()  # starts this data dir's Chroma server: chroma/, lock, url, log
        found = modes(data.root)
        await ctx.close()
    finally:
        os.umask(old)
    for name in ("state.db", "chroma.lock", "chroma.url", "logs", "chroma", "logs/chroma.log"):
        assert name in found, sorted(found)
    assert any(name.startswith("chroma/") and name.endswith(".sqlite3") for name in found), sorted(found)
    loose = {name: oct(mode) for name, mode in found.items() if mode & 0o077}
    assert loose == {}


async def test_an_existing_data_dir_is_tightened_when_rem_opens_it(db_ctx: Context) -> None:
    root = db_ctx.data.root
    (root / "chroma").mkdir()
    (root / "chroma" / "chroma.sqlite3").write_text("x")
    (root / "logs" / "up.log").write_text("old log")
    await db_ctx.close()
    loosen(root)
    assert modes(root)["state.db"] == 0o644
    datadir._tightened.discard(root)  # a new rem process: it has not opened this data dir yet

    reopened = Context(DataDir(root), start_chroma=False)
    await reopened.db()
    await reopened.close()
    found = modes(root)
    assert found["state.db"] == 0o600 and found["logs/up.log"] == 0o600
    assert found["chroma/chroma.sqlite3"] == 0o600
    assert found["."] == found["chroma"] == found["logs"] == 0o700


async def test_a_read_only_open_tightens_nothing(db_ctx: Context) -> None:
    root = db_ctx.data.root
    await db_ctx.close()
    loosen(root)
    datadir._tightened.discard(root)
    before = modes(root)
    ro = Context(DataDir(root), read_only=True, start_chroma=False)
    await ro.db()
    await ro.close()
    after = modes(root)
    # (SQLite's WAL readers create an empty -wal and the -shm index when they are missing)
    assert {name: after[name] for name in before} == before


@pytest.mark.parametrize("read_only", [False, True])
async def test_a_data_dir_of_another_user_is_refused(db_ctx: Context, read_only: bool) -> None:
    root = db_ctx.data.root
    await db_ctx.close()
    os.chown(root, NOBODY, NOBODY)
    other = Context(DataDir(root), read_only=read_only, start_chroma=False)
    with pytest.raises(DataDirError, match=r"owned by nobody \(uid 65534\), not by you .*chown -R"):
        await other.db()
    await other.close()


async def test_a_file_of_another_user_inside_the_data_dir_is_refused(db_ctx: Context) -> None:
    root = db_ctx.data.root
    await db_ctx.close()
    (root / "chroma.url").write_text("http://127.0.0.1:1\n")
    os.chown(root / "chroma.url", NOBODY, NOBODY)
    with pytest.raises(DataDirError, match=r"chroma.url is owned by nobody"):
        DataDir(root).ensure()


@pytest.mark.parametrize("mode", [0o770, 0o707, 0o777])
def test_a_data_dir_writable_by_group_or_others_is_refused_in_one_line(tmp_path: Path, mode: int) -> None:
    root = tmp_path / "data"
    assert run_rem("init", "--data", str(root)).returncode == 0
    os.chmod(root, mode)
    for command in (["status"], ["init"], ["check"]):
        proc = run_rem(*command, "--data", str(root), env=rem_env())
        assert proc.returncode == 2, (command, proc.stderr)
        assert proc.stderr.startswith("rem: error: data dir") and proc.stderr.count("\n") == 1
        assert f"mode {mode:03o}" in proc.stderr and f"chmod 700 {root}" in proc.stderr
    assert stat.S_IMODE(root.stat().st_mode) == mode  # refused: not "fixed" behind the operator's back


def test_rem_runs_under_umask_077(tmp_path: Path) -> None:
    root = tmp_path / "data"
    proc = run_rem("init", "--data", str(root), env=rem_env())
    assert proc.returncode == 0, proc.stderr
    assert modes(root) == {".": 0o700, "state.db": 0o600, "logs": 0o700, **_wal_modes(root)}


def _wal_modes(root: Path) -> dict[str, int]:
    return {p.name: 0o600 for p in root.glob("state.db-*")}


def test_a_log_is_never_written_through_a_symlink(tmp_path: Path) -> None:
    data = DataDir(tmp_path / "data").ensure()
    victim = tmp_path / "elsewhere.txt"
    victim.write_text("keep me")
    (data.logs / "chroma.log").symlink_to(victim)
    with pytest.raises(DataDirError, match="is a symlink"):
        data.open_log("chroma.log")
    with pytest.raises(DataDirError, match="is a symlink"):
        chroma_server.try_start(data)
    assert victim.read_text() == "keep me"
    assert not chroma_server.lock_is_held(data)  # the refused start left no server behind


def test_private_files_are_replaced_atomically_without_following_links(tmp_path: Path) -> None:
    target = tmp_path / "up.json"
    victim = tmp_path / "victim"
    victim.write_text("keep me")
    target.symlink_to(victim)
    private.write_private_text(target, "{}")
    assert victim.read_text() == "keep me"  # the link itself was replaced, not written through
    assert not target.is_symlink() and target.read_text() == "{}"
    assert stat.S_IMODE(target.stat().st_mode) == 0o600
