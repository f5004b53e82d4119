"""`rem up`: restarts killed daemons; a death it sees is in `rem status` within the second; with
--no-reap a killed executor's lease waits for expiry or an operator release, and release hands it
over at once."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest

from backend import ops
from backend.chroma import server as chroma_server
from backend.chroma.server import ChromaServer
from backend.core.datadir import DataDir
from backend.ops.console import now_ms
from backend.runtime.context import Context
from tests.helpers import await_until, rem_env, run_rem, spawn_rem, wait_until
from tui.widgets.leases import LeaseTable, lease_key
from tui.widgets.leases import owner_alive as console_owner_alive

pytestmark = pytest.mark.slow


def _manifest(root: Path) -> dict:  # type: ignore[type-arg]
    try:
        return json.loads((root / "up.json").read_text())
    except (OSError, ValueError):
        return {}


def _executor_pid(root: Path) -> int | None:
    kids = [c for c in _manifest(root).get("children", []) if c["role"] == "executor"]
    return kids[0]["pid"] if kids else None


async def test_no_reap_kill_is_news_at_once_then_release_hands_over_within_a_second(tmp_path: Path) -> None:
    """SIGKILL of a supervised executor: its lease shows a dead owner (`owner_alive: false`) in
    under a second, though --no-reap leaves the lease standing for an operator to release."""
    root = tmp_path / "data"
    env = rem_env(REM_AGENT_DELAY_MS="400")  # a reply takes ~2 s: a kill lands mid-turn
    up = spawn_rem(
        "up", "--data", str(root), "--executors", "1", "--no-reap", env=env, log=tmp_path / "up.log"
    )
    ctx = Context(DataDir(root), start_chroma=False)
    try:
        first = wait_until(lambda: _executor_pid(root), timeout=60, message="the executor to start")
        # its log is the file its stderr appends to, which it keeps under REM_LOG_MAX_BYTES
        environ = Path(f"/proc/{first}/environ").read_bytes().split(b"\0")
        [log_file] = [v.split(b"=", 1)[1].decode() for v in environ if v.startswith(b"REM_LOG_FILE=")]
        assert Path(log_file).parent == root / "logs" and Path(log_file).is_file()
        assert os.path.samefile(log_file, f"/proc/{first}/fd/2")
        assert run_rem("send", "s1", "a question that takes a while", "--data", str(root)).returncode == 0

        async def lease() -> dict | None:  # type: ignore[type-arg]
            leases = (await ops.status(ctx))["leases"]
            return leases[0] if leases else None

        held = await await_until(lease, timeout=30, message="the executor to hold a lease")
        assert held["owner_alive"]
        killed_at = time.time()
        os.kill(first, signal.SIGKILL)

        async def owner_dead() -> bool:
            return any(
                x["id"] == held["id"] and not x["owner_alive"] for x in (await ops.status(ctx))["leases"]
            )

        # the deadline is generous for a loaded machine; the delay measured is what must be short
        await await_until(owner_dead, timeout=30, interval=0.01, message="the lease's owner to show dead")
        delay_s = time.time() - killed_at
        assert delay_s < 1.0, f"a death its supervisor saw took {delay_s:.2f} s to show"
        # the console's rule on the console's snapshot: the owner cell is ✗, its heartbeat still fresh
        records = dict(LeaseTable().records(await ops.status(ctx)))
        record = records[lease_key(held)]
        assert record["owner_exited_at"] is not None and not console_owner_alive(record, now_ms())
        shown = json.loads(run_rem("status", "--json", "--data", str(root)).stdout)
        (dead,) = [w for w in shown["workers"] if w["pid"] == first]
        assert dead["alive"] is False and dead["exited_at"] - killed_at * 1000 < 1000
        (lease_shown,) = [x for x in shown["leases"] if x["id"] == held["id"]]
        assert lease_shown["owner_alive"] is False and not lease_shown["expired"]
        second = wait_until(
            lambda: _executor_pid(root) not in (None, first) and _executor_pid(root),
            timeout=30,
            message="the supervisor to restart the executor",
        )

        async def registered() -> bool:  # "within a second" is from a live executor, not one still importing
            return any(
                w["pid"] == second and w["state"] == "running" for w in (await ops.status(ctx))["workers"]
            )

        await await_until(registered, timeout=60, message="the restarted executor to register")
        # not reaped: the owner is dead, but its lease stands until it expires or is released
        snap = await ops.status(ctx)
        (still,) = [x for x in snap["leases"] if x["id"] == held["id"]]
        assert still["owner_id"] == held["owner_id"] and not still["expired"] and not still["owner_alive"]
        result = await ops.release(ctx, held["id"], expected_epoch=still["epoch"])
        assert result["old_epoch"] == still["epoch"]

        async def taken() -> bool:
            leases = (await ops.status(ctx))["leases"]
            return any(
                x["id"] == held["id"] and x["owner_id"] != held["owner_id"] for x in leases
            ) or not any(x["id"] == held["id"] for x in leases)

        await await_until(
            taken, timeout=1.5, interval=0.02, message="another executor to take over the released lease"
        )
        await await_until(lambda: _settled(ctx), timeout=60, message="the turn to finish")
        result = await ops.check(ctx, settled=True)
        assert result["ok"], result["violations"]
    finally:
        up.send_signal(signal.SIGTERM)
        up.wait(60)
        await ctx.close()
    assert up.returncode == 0
    assert not (root / "up.json").exists()


async def _settled(ctx: Context) -> bool:
    result = await ops.check(ctx, verify_chroma=False)
    return result["ok"] and result["counts"]["unsettled"] == 0


def _cmdline(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
    except OSError:
        return []


async def test_up_against_an_external_chroma_starts_none_and_names_its_host(
    tmp_path: Path, chroma: ChromaServer, chroma_url: str, collection: str
) -> None:
    """One host's `rem up` of a fleet: the shared Chroma is someone else's, this host is REM_HOST."""
    root = tmp_path / "data"
    env = rem_env(REM_HOST="rack-7", REM_CHROMA_COLLECTION=collection)
    up = spawn_rem(
        "up", "--data", str(root), "--chroma-url", chroma_url, "--executors", "1",
        env=env, log=tmp_path / "up.log",
    )  # fmt: skip
    ctx = Context(DataDir(root), chroma_url=chroma_url, start_chroma=False, collection=collection)
    try:
        kids = wait_until(
            lambda: len(_manifest(root).get("children", [])) == 3 and _manifest(root)["children"],
            timeout=60,
            message="the supervisor's manifest",
        )
        # no pid of its own to record, so no start time either (up.json records both for every process)
        assert _manifest(root)["chroma"] == {
            "url": chroma_url,
            "pid": None,
            "started_at": None,
            "external": True,
        }
        assert not chroma_server.lock_is_held(DataDir(root))  # no Chroma of this data dir
        for kid in kids:  # every daemon is pointed at the shared server
            line = _cmdline(kid["pid"])
            assert line[line.index("--chroma-url") + 1] == chroma_url, line

        async def hosts() -> set[str]:
            return {w["host"] for w in (await ops.status(ctx))["workers"] if w["state"] == "running"}

        assert await await_until(
            lambda: _all_running(ctx), timeout=60, message="the three daemons registered"
        )
        assert await hosts() == {"rack-7"}
        out = run_rem("status", "--data", str(root), "--chroma-url", chroma_url, env=env).stdout
        assert "rack-7" in out[out.index("Workers (") :]
        assert run_rem("send", "s1", "hello from rack 7", "--data", str(root), env=env).returncode == 0

        async def checked_clean() -> bool:  # receipts and Dream keys checked against the shared Chroma
            return bool((await ops.check(ctx, settled=True))["ok"])

        await await_until(
            checked_clean, timeout=90, interval=0.5, message="the turn, summary and Dream to settle"
        )
    finally:
        up.send_signal(signal.SIGTERM)
        up.wait(60)
        await ctx.close()
    assert up.returncode == 0
    assert chroma.alive()  # stopping this host's fleet left the shared server alone


async def _all_running(ctx: Context) -> bool:
    return sum(w["state"] == "running" for w in (await ops.status(ctx))["workers"]) == 3


def test_a_second_up_on_one_data_dir_is_refused_and_leaves_the_first_alone(
    tmp_path: Path, chroma_url: str, collection: str
) -> None:
    root = tmp_path / "data"
    env = rem_env(REM_CHROMA_COLLECTION=collection)
    fleet = ("--chroma-url", chroma_url, "--executors", "1", "--summarizers", "0", "--dreams", "0")
    up = spawn_rem("up", "--data", str(root), *fleet, env=env, log=tmp_path / "up.log")
    try:
        first = wait_until(lambda: _manifest(root).get("children"), timeout=60, message="the first rem up")
        manifest = _manifest(root)
        second = run_rem("up", "--data", str(root), *fleet, env=env, timeout=60)
        assert second.returncode == 1 and second.stdout == "", second.stderr
        (line,) = second.stderr.splitlines()
        assert line == (
            f"rem: error: another `rem up` (pid {up.pid}) runs on data dir {root}; stop it first "
            "(Ctrl-C in its terminal), or start this one with another --data"
        )
        assert _manifest(root) == manifest and first  # its up.json and its daemons untouched
        assert all(Path(f"/proc/{kid['pid']}").exists() for kid in first)
    finally:
        up.send_signal(signal.SIGTERM)
        up.wait(60)
    assert up.returncode == 0 and not (root / "up.json").exists()
    again = spawn_rem("up", "--data", str(root), *fleet, env=env, log=tmp_path / "up2.log")
    try:  # the lock went with the first: the next `rem up` starts
        wait_until(lambda: _manifest(root).get("pid") == again.pid, timeout=60, message="a new rem up")
    finally:
        again.send_signal(signal.SIGTERM)
        again.wait(60)
