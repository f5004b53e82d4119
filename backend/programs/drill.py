"""`rem drill sigkill`: kill real processes under load and prove nothing is lost.

The drill runs `rem up --load` on a data dir (a private temporary one unless
`--data` is given), then for each round picks a victim (an executor, the
summarizer, the Dream daemon or the Chroma server), waits a seeded random
moment, SIGKILLs it, and measures how long the system takes to recover: the
supervisor restarts the process, and every lease the dead process held is
taken over (after expiry, or at once with `release=True`, which releases them
through `backend.ops.release` as an operator would). After the last round the
load stops, the system settles, and `rem check --settled` must find nothing.

Leases are shortened for the drill's own system (`lease_ms`) so twenty rounds
fit in minutes; the mechanism under test is the same as with 30 s leases.

On PostgreSQL (`hosts`, set by `rem drill sigkill --db URL`) the drill runs one
`rem up` per host identity (`REM_HOST`), each on its own data dir (logs, up.json)
and all on the shared store; the first host's Chroma server is everyone's. The
victims are drawn from every host, so a lease taken by host-a is taken over by
host-b and the other way round.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import random
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from backend import ops
from backend.chroma import server as chroma_server
from backend.core import private, processes
from backend.core.datadir import DataDir
from backend.core.errors import Refused, RemError, UsageError
from backend.ops.records import LeaseRecord
from backend.programs import drill_tools
from backend.programs.supervisor import read_manifest
from backend.runtime.context import Context
from backend.store.events import EventKind

log = logging.getLogger("rem.drill")

ROLES = ("executor", "summarizer", "dream", "chroma")
# not a SIGKILL: SIGSTOP an executor past its lease, let another take over, then SIGCONT it.
# The paused process wakes up believing it still holds its leases: only fencing stops
# its late writes from landing, so this is the round that proves fencing.
ZOMBIE = "zombie"
ZOMBIE_PATIENCE_S = 20.0
# the journal rows that end a woken zombie's late turn
ZOMBIE_ENDS = (EventKind.EXECUTION_LEASE_LOST, EventKind.EXECUTION_COMPLETED, EventKind.EXECUTION_FAILED)
# --mid-send: how long an executor round waits for a send in flight (the load makes one every few s)
MID_SEND_PATIENCE_S = 60.0
WORKER_PID_SQL = "SELECT pid FROM worker WHERE owner_id = ? ORDER BY started_at DESC LIMIT 1"
# the host identities of a drill on PostgreSQL (`--db`): two hosts, one store
PG_HOSTS = ("host-a", "host-b")
VIOLATED_POLLS = 3  # the settle wait ends early after this many checks in a row found a violation


@dataclass
class DrillConfig:
    role: str = "all"
    rounds: int = 5
    seed: int = 1
    release: bool = False
    lease_ms: int = 4_000
    settle_timeout_s: float = 180.0
    recover_timeout_s: float = 60.0
    load_rate: float = 4.0
    load_sessions: int = 6
    executors: int = 2
    agent_delay_ms: int = 150
    pause: bool = False
    # host identities, one `rem up` each on the shared store (PostgreSQL); () = one, unnamed
    hosts: tuple[str, ...] = ()
    # a tool-using load on rem's demo tools server (`backend.programs.drill_tools`)
    tools: bool = False
    # with tools: each executor round kills the owner of a send in flight on the tool server
    mid_send: bool = False
    # end the rounds at the first one after which the store holds a violation (the drill has
    # failed then: more rounds cannot make it pass, they only make it longer)
    stop_at_violation: bool = False

    def victims(self) -> list[str]:
        roles = (*ROLES, ZOMBIE) if self.pause else ROLES
        if self.role == "all":
            return [roles[i % len(roles)] for i in range(self.rounds)]
        if self.role not in (*ROLES, ZOMBIE):
            raise UsageError(
                f"unknown drill role {self.role!r}; use one of {', '.join((*ROLES, ZOMBIE))} or all"
            )
        return [self.role] * self.rounds


@dataclass
class Round:
    number: int
    role: str
    victim: str = ""  # the process killed (`host/name` when the drill runs several hosts)
    pid: int | None = None
    killed_at_s: float = 0.0
    delay_s: float = 0.0
    recovered: str = ""
    recovery_s: float | None = None
    released: int = 0
    error: str | None = None


@dataclass
class DrillResult:
    data_dir: str
    hosts: list[str] = field(default_factory=list)
    store: str = "sqlite"
    rounds: list[Round] = field(default_factory=list)
    settle_s: float | None = None
    # with stop_at_violation: the round after which the store held a violation (no round ran after it)
    stopped_after: int | None = None
    check: dict[str, Any] = field(default_factory=dict)
    # with --tools: the sends the tool server did, and those done twice for one key (must be 0)
    effects: dict[str, int] | None = None
    ok: bool = False
    duration_s: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["verdict"] = "pass" if self.ok else "FAIL"
        return data


@dataclass
class Host:
    """One `rem up` of the drill: its host identity (None: the default) and data dir."""

    name: str | None
    ctx: Context
    up: subprocess.Popen[bytes] | None = None
    load: bool = True


class Drill:
    """One drill run: a supervised system under load, and a sequence of SIGKILLs."""

    def __init__(
        self, ctx: Context, config: DrillConfig, on_round: Callable[[Round], None] | None = None
    ) -> None:
        self.ctx = ctx
        self.config = config
        self.rng = random.Random(config.seed)
        self.on_round = on_round
        self.started = time.monotonic()
        self.resolved = 0  # unknown tool outcomes the drill resolved (--tools)
        names = config.hosts or (None,)
        # the first host is the drill's own data dir; the others live inside it (`hosts/NAME`)
        self.hosts = [
            Host(
                name,
                ctx if i == 0 else Context(DataDir(ctx.data.root / "hosts" / str(name)), db_url=ctx.db_url),
                load=i == 0,
            )
            for i, name in enumerate(names)
        ]

    @property
    def up(self) -> subprocess.Popen[bytes] | None:
        return self.hosts[0].up

    # -- the system under test -------------------------------------------
    def _env(self, host: Host) -> dict[str, str]:
        extra = {"REM_HOST": host.name} if host.name else {}
        if self.ctx.db_url:  # in the environment, never in argv (`ps` shows argv to every user)
            extra["REM_DB_URL"] = self.ctx.db_url
        if self.config.tools:
            extra.update(drill_tools.tools_env(self.ctx.data.root))
        return {
            "REM_EXECUTION_LEASE_MS": str(self.config.lease_ms),
            "REM_SUMMARY_LEASE_MS": str(self.config.lease_ms),
            "REM_DREAM_LEASE_MS": str(self.config.lease_ms),
            "REM_AGENT_DELAY_MS": str(self.config.agent_delay_ms),
            **extra,
        }

    def start_system(self, host: Host | None = None, chroma_url: str | None = None) -> None:
        host = host or self.hosts[0]
        cmd = ["up", "--data", str(host.ctx.data.root), "--executors", str(self.config.executors)]
        if chroma_url:
            cmd += ["--chroma-url", chroma_url]
        if host.load:
            cmd += [
                "--load",
                "--load-rate",
                str(self.config.load_rate),
                "--load-sessions",
                str(self.config.load_sessions),
            ]
        host.ctx.data.ensure()
        command = processes.rem_child(*cmd, cwd=host.ctx.data.root, env=self._env(host))
        with host.ctx.data.open_log("drill-up.log") as out:
            host.up = command.popen(
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=private.private_child,
            )

    def manifest(self, host: Host | None = None) -> dict[str, Any] | None:
        return read_manifest((host or self.hosts[0]).ctx)

    def _victim_name(self, host: Host, name: str) -> str:
        return f"{host.name}/{name}" if len(self.hosts) > 1 else name

    def _host_of(self, name: str) -> tuple[Host, str]:
        if len(self.hosts) == 1:
            return self.hosts[0], name
        host_name, _, child = name.partition("/")
        return next(h for h in self.hosts if h.name == host_name), child

    async def wait_for(self, predicate: Callable[[], Any], timeout: float, what: str) -> Any:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            value = predicate()
            if asyncio.iscoroutine(value):
                value = await value
            if value:
                return value
            await asyncio.sleep(0.1)
        raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}")

    async def wait_ready(self, host: Host | None = None) -> None:
        host = host or self.hosts[0]

        def ready() -> bool:
            manifest = self.manifest(host)
            return bool(
                manifest and manifest["chroma"]["url"] and all(c["pid"] for c in manifest["children"])
            )

        where = f" on {host.name}" if host.name else ""
        await self.wait_for(ready, 90, f"rem up{where} to start every process")

    async def start_all(self) -> None:
        """The first host (and its Chroma server), then every other host on that Chroma."""
        self.start_system(self.hosts[0])
        await self.wait_ready(self.hosts[0])
        if len(self.hosts) == 1:
            return
        url = (self.manifest(self.hosts[0]) or {})["chroma"]["url"]
        for host in self.hosts[1:]:
            self.start_system(host, chroma_url=url)
        for host in self.hosts[1:]:
            await self.wait_ready(host)

    def stop_system(self) -> None:
        # the other hosts first: the first one owns the Chroma server they use
        for host in reversed(self.hosts):
            up = host.up
            if up is None or up.poll() is not None:
                continue
            up.send_signal(signal.SIGTERM)
            try:
                up.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(up.pid, signal.SIGKILL)
                up.wait(10)

    # -- one round ----------------------------------------------------------
    def _pick_victim(self, role: str) -> tuple[str, int, float] | None:
        """(name, pid, start time) of a live process of `role`, chosen by the seeded generator.

        Only processes that are still the ones `up.json` recorded (pid and start
        time) are candidates: a reused pid is never a victim.
        """
        if role == "chroma":
            chroma: dict[str, Any] = (self.manifest() or {}).get("chroma") or {}
            if not processes.same_process(chroma.get("pid"), chroma.get("started_at")):
                return None
            return "chroma", chroma["pid"], chroma["started_at"]
        live = sorted(
            (self._victim_name(host, c["name"]), c["pid"], c.get("started_at"))
            for host in self.hosts
            for c in (self.manifest(host) or {}).get("children", [])
            if c["role"] == role and processes.same_process(c["pid"], c.get("started_at"))
        )
        return self.rng.choice(live) if live else None

    def _pid_of(self, name: str) -> int | None:
        if name == "chroma":
            return ((self.manifest() or {}).get("chroma") or {}).get("pid")
        host, child = self._host_of(name)
        manifest = self.manifest(host) or {}
        return next((c["pid"] for c in manifest.get("children", []) if c["name"] == child), None)

    async def _busy_victim(
        self, role: str, patience_s: float = 5.0
    ) -> tuple[str, int, float, str | None, list[LeaseRecord]] | None:
        """A victim, preferably caught holding a lease (mid-turn is where crashes hurt)."""
        deadline = time.monotonic() + patience_s
        while True:
            victim = self._pick_victim(role)
            if victim is None:
                return None
            name, pid, started = victim
            owner = None if role == "chroma" else await self._owner_of(pid)
            held = await self._leases_of(owner)
            if held or role == "chroma" or time.monotonic() > deadline:
                return name, pid, started, owner, held
            await asyncio.sleep(self.rng.uniform(0.02, 0.15))

    async def _mid_send_victim(
        self, patience_s: float
    ) -> tuple[str, int, float, str | None, list[LeaseRecord]] | None:
        """The executor holding a send in flight on the tool server (its start logged, its finish
        not): the kill that leaves an unknown outcome for the drill to resolve. None past patience."""
        deadline = time.monotonic() + patience_s
        while time.monotonic() < deadline:
            owner = await drill_tools.in_flight_owner(self.ctx, self.ctx.data.root)
            pid = None if owner is None else await self.ctx_scalar(WORKER_PID_SQL, owner)
            child = None if pid is None else self._child_with_pid(int(pid))
            if child is not None:
                return child[0], child[1], child[2], owner, await self._leases_of(owner)
            await asyncio.sleep(0.02)
        return None

    def _child_with_pid(self, pid: int) -> tuple[str, int, float] | None:
        """(name, pid, start time) of the live executor `pid`, as `up.json` records it."""
        for host in self.hosts:
            for c in (self.manifest(host) or {}).get("children", []):
                if c["pid"] == pid and processes.same_process(pid, c.get("started_at")):
                    return self._victim_name(host, c["name"]), pid, c.get("started_at")
        return None

    async def ctx_scalar(self, sql: str, *params: Any) -> Any:
        db = await self.ctx.db()
        return await db.scalar(sql, params)

    async def _owner_of(self, pid: int) -> str | None:
        db = await self.ctx.db()
        owner = await db.scalar(
            "SELECT owner_id FROM worker WHERE pid = ? ORDER BY started_at DESC LIMIT 1", (pid,)
        )
        return None if owner is None else str(owner)

    async def _leases_of(self, owner: str | None) -> list[LeaseRecord]:
        """The leases `owner` holds. A turn parked for a person (`backend.execution.parking`) is
        held by nobody, whatever owner its row still names: nothing takes it over until a
        decision (the drill makes them when it settles), so waiting for it would time out."""
        if owner is None:
            return []
        snap = await ops.status(self.ctx)
        return [lease for lease in snap["leases"] if lease["owner_id"] == owner and not lease["parked"]]

    async def run_round(self, number: int, role: str) -> Round:
        rnd = Round(number=number, role=role)
        rnd.delay_s = round(self.rng.uniform(0.3, 2.5), 2)
        await asyncio.sleep(rnd.delay_s)
        # a zombie without a lease has nothing to write late, so its round could not show a
        # missing fence: wait longer for one caught mid-turn (early in a drill the load is still
        # ramping up, and 5 s often found none: the fencing-off drill then passed a broken build)
        patience = ZOMBIE_PATIENCE_S if role == ZOMBIE else 5.0
        if self.config.mid_send and role == "executor":
            victim = await self._mid_send_victim(MID_SEND_PATIENCE_S)
        else:
            victim = await self._busy_victim("executor" if role == ZOMBIE else role, patience)
        if victim is None:
            rnd.error = f"no live {role} to kill"
            return rnd
        name, pid, started, owner, held = victim
        rnd.victim, rnd.pid = name, pid
        rnd.killed_at_s = round(time.monotonic() - self.started, 2)
        killed = time.monotonic()
        if not processes.signal_if_same(pid, started, signal.SIGSTOP if role == ZOMBIE else signal.SIGKILL):
            rnd.error = f"{name} pid {pid} exited before the signal; nothing was killed"
            return rnd
        try:
            if role == ZOMBIE:
                rnd.recovered = await self._recover_from_zombie(pid, owner, held)
            else:
                rnd.recovered = await self._recover(name, pid, owner, held, rnd)
            rnd.recovery_s = round(time.monotonic() - killed, 2)
        except (TimeoutError, RemError) as exc:
            rnd.error = str(exc)
        finally:
            if role == ZOMBIE:
                await self._zombie_wakes(pid, started, owner)
        return rnd

    async def _recover_from_zombie(self, pid: int, owner: str | None, held: list[LeaseRecord]) -> str:
        """The paused executor's leases expire and are taken over while it sleeps."""
        held_ids = {lease["id"] for lease in held if lease["kind"] == "execution"}

        async def taken_over() -> bool:
            snap = await ops.status(self.ctx)
            return not any(lease["id"] in held_ids and lease["owner_id"] == owner for lease in snap["leases"])

        await self.wait_for(
            taken_over,
            self.config.recover_timeout_s + self.config.lease_ms / 1000,
            f"the leases of paused {owner} to be taken over",
        )
        return f"paused; {len(held_ids)} lease(s) taken over, then SIGCONT (late writes must be fenced)"

    async def _zombie_wakes(self, pid: int, started: float, owner: str | None) -> None:
        """After SIGCONT, give the zombie time to try its late writes (and find them fenced)."""
        db = await self.ctx.db()
        before = await db.scalar("SELECT coalesce(max(id), 0) FROM event")
        if not processes.signal_if_same(pid, started, signal.SIGCONT):
            return

        async def wrote() -> bool:
            # how its late turn ended: `execution.lease_lost` when fenced; when not
            # (REM_UNSAFE_DISABLE_FENCING), the late turn run to its end. Its first late row alone
            # (a step) left the duplicate reply unwritten when the check ran: a broken build passed
            return bool(
                await db.scalar(
                    "SELECT 1 FROM event WHERE id > ? AND actor = ? AND kind IN (?, ?, ?) LIMIT 1",
                    (before, owner, *ZOMBIE_ENDS),
                )
            )

        with contextlib.suppress(TimeoutError):
            await self.wait_for(wrote, 15.0, f"{owner} to try its late writes")

    async def _recover(
        self, name: str, pid: int, owner: str | None, held: list[LeaseRecord], rnd: Round
    ) -> str:
        """Wait until the victim is replaced and every lease it held is taken over."""
        timeout = self.config.recover_timeout_s

        def replaced() -> bool:
            if name == "chroma":
                url = chroma_server.recorded_url(self.ctx.data)
                return bool(url and chroma_server.is_alive(url))
            return self._pid_of(name) not in (None, pid)

        await self.wait_for(replaced, timeout, f"{name} to be restarted")
        if name == "chroma":
            return "chroma restarted on its port"
        if self.config.release:
            for lease in await self._leases_of(owner):
                with contextlib.suppress(RemError):
                    await ops.release(self.ctx, lease["id"], kind=lease["kind"], force=True)
                    rnd.released += 1

        async def taken_over() -> bool:
            return not await self._leases_of(owner)

        await self.wait_for(
            taken_over, timeout + self.config.lease_ms / 1000, f"the leases of {owner} to be taken over"
        )
        kinds = sorted({lease["kind"] for lease in held})
        return f"{name} restarted; {len(held)} lease(s) taken over" + (
            f" ({', '.join(kinds)})" if kinds else ""
        )

    # -- the whole drill --------------------------------------------------------
    async def settle(self) -> float | None:
        """Stop the load, then wait until nothing is in flight; None when a violation ends the wait
        first (`_violated`: the drill has failed, its settled check says how)."""
        started = time.monotonic()
        for host in self.hosts:
            manifest = self.manifest(host)  # None unless its pid is still that `rem up`
            if manifest is not None:
                # the load runs inside `rem up`: SIGUSR1 asks it to stop the load only
                processes.signal_if_same(manifest["pid"], manifest.get("started_at"), signal.SIGUSR1)

        seen = {"violated": 0}

        async def quiet() -> str:
            if self.config.tools:  # the operator of the unknown outcomes the kills left
                self.resolved += await drill_tools.resolve_unknown(self.ctx, self.ctx.data.root)
            result = await ops.check(self.ctx)
            if result["ok"]:
                return "settled" if result["counts"]["unsettled"] == 0 else ""
            # not Chroma being unreachable (a chroma round's restart): the state store's own findings,
            # in VIOLATED_POLLS checks in a row (a check that read mid-write is not the drill's verdict)
            seen["violated"] = seen["violated"] + 1 if await self._violated() else 0
            return "violated" if seen["violated"] >= VIOLATED_POLLS else ""

        if await self.wait_for(quiet, self.config.settle_timeout_s, "the system to settle") == "violated":
            log.warning("stopped waiting for the system to settle: rem check found a violation")
            return None
        return round(time.monotonic() - started, 2)

    async def _run_rounds(self, result: DrillResult) -> None:
        """One round per victim, each reported to `on_round` as it ends; with `stop_at_violation`,
        none after the first that leaves a violation in the store."""
        for number, role in enumerate(self.config.victims(), start=1):
            rnd = await self.run_round(number, role)
            result.rounds.append(rnd)
            if self.on_round is not None:
                self.on_round(rnd)
            if self.config.stop_at_violation and await self._violation_stays():
                log.warning("stopped the rounds after round %s: rem check found a violation", number)
                result.stopped_after = number
                return

    async def _violation_stays(self) -> bool:
        """`_violated` in VIOLATED_POLLS checks in a row (a check that read mid-write is no verdict)."""
        for poll in range(VIOLATED_POLLS):
            if poll:
                await asyncio.sleep(0.2)
            if not await self._violated():
                return False
        return True

    async def _violated(self) -> bool:
        """A violation in the state store (not work in flight, not Chroma unreachable): a correct build
        has none whatever the timing, so a longer wait cannot make the drill pass."""
        found = await ops.check(self.ctx, verify_chroma=False)
        return bool(found["violations"])

    async def run(self) -> DrillResult:
        result = DrillResult(
            data_dir=str(self.ctx.data.root),
            hosts=[h.name for h in self.hosts if h.name],
            store="postgresql" if self.ctx.db_url else "sqlite",
        )
        try:
            await self.start_all()
            await self._run_rounds(result)
            try:
                result.settle_s = await self.settle()
            except TimeoutError as exc:
                log.warning("%s", exc)
            result.check = await ops.check(self.ctx, settled=True, verify_chroma=True)
        finally:
            self.stop_system()
        if self.config.tools:
            result.effects = {**drill_tools.effects(self.ctx.data.root), "resolved_unknown": self.resolved}
        duplicated = bool(result.effects and result.effects["duplicated"])
        result.ok = (
            bool(result.check.get("ok")) and not any(r.error for r in result.rounds) and not duplicated
        )
        result.duration_s = round(time.monotonic() - self.started, 1)
        return result


def private_data_dir() -> DataDir:
    return DataDir(Path(tempfile.mkdtemp(prefix="rem-drill-")) / "data")


def refuse_a_live_data_dir(ctx: Context) -> None:
    """The drill kills processes: never on a data dir a live `rem up` (or Chroma server) owns."""
    manifest = read_manifest(ctx)
    if manifest is not None:
        raise Refused(
            f"data dir {ctx.data.root} belongs to a live `rem up` (pid {manifest['pid']}); the drill "
            "SIGKILLs the processes of its data dir: stop that `rem up` first, or omit --data "
            "for a private one"
        )
    if chroma_server.lock_is_held(ctx.data):
        pid = chroma_server.read_lock_info(ctx.data).get("pid")
        raise Refused(
            f"data dir {ctx.data.root} has a live Chroma server (pid {pid}); the drill SIGKILLs "
            "the processes of its data dir: stop what uses it first, or omit --data for a private one"
        )


async def run_drill(
    ctx: Context, config: DrillConfig, on_round: Callable[[Round], None] | None = None
) -> dict[str, Any]:
    """Run the drill and return its JSON-able report."""
    config.victims()  # validate the role before starting anything
    refuse_a_live_data_dir(ctx)
    result = await Drill(ctx, config, on_round).run()
    return result.as_dict()


def dumps(report: dict[str, Any]) -> str:
    return json.dumps(report, indent=2, default=str)
