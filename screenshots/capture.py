"""Capture the console's README screenshots as SVG, deterministically.

    .venv/bin/python screenshots/capture.py [--out screenshots]

Each picture is the real console over a real data dir built by
`tests/tui/scenes.py` (real schema, real rows) with a frozen clock, in UTC,
at a fixed terminal size. A real Chroma server is started for the data dir
so the header shows real health; only its random port is shown as 8000 so
the SVGs do not change from run to run. The main picture (`console.svg`)
replays three minutes of an incident step by step through the console, so
its sparklines are the history the console itself recorded. The same replay is
recorded into the data dir's status history, as `rem up` would, and
`post-mortem.svg` is the console opened on it with `--at`, two steps after the
kill; `post-mortem-tools.svg` the same moment with its Events panel filtered to the tool calls
(the send executor B had in flight, unknown after the takeover, the operator's resolve after).
In the replay's last
steps the model endpoint starts rate-limiting and one session is held after
a 401 (`model-sessions.svg`, `session-detail.svg`, `confirm-resume.svg`). The agent tool calls
waiting for a person are Backlog's first rows (`tool-calls.svg`, `confirm-approve.svg`); `k` on a
send in flight names its executor's blast radius (`confirm-kill.svg`), and `o` resolves the unknown
outcome a kill leaves (`resolve-unknown.svg`).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from textual.widgets import Static

from backend import ops
from backend.chroma import server as chroma_server
from backend.core import clock
from backend.core.datadir import DataDir
from backend.ops import timeline
from backend.runtime.context import Context
from backend.store.history import HistoryStore
from tests.tui import scenes
from tui.app import ConsoleApp
from tui.screens.detail import LOADING

SIZE = (120, 40)
# what the operator types resolving the unknown send as done (its result for the model)
RESOLVED = "sent once: outbox.jsonl has it"
STEP_MS = 10_000
STEPS = 18


async def fixed_port_status(ctx: Context, **options: Any) -> dict[str, Any]:
    snap = await ops.status(ctx, **options)
    if snap.get("chroma", {}).get("url"):
        snap["chroma"]["url"] = "http://127.0.0.1:8000"
    return snap


def new_app(data: DataDir, **kwargs: Any) -> ConsoleApp:
    return ConsoleApp(
        data,
        data_label="~/demo-data",
        watch=False,
        poll_s=3600,
        health_s=3600,
        cpu_share=None,  # the header's refresh interval: the floor, not what this machine's CPU made it
        status_loader=fixed_port_status,
        **kwargs,
    )


async def wait_applied(app: ConsoleApp, pilot: Any, count: int) -> None:
    for _ in range(400):
        await pilot.pause()
        if app.stats["applies"] >= count:
            return
        await asyncio.sleep(0.025)
    raise RuntimeError("the console did not apply a snapshot within 10 s")


async def settle(pilot: Any) -> None:
    """Let the screen finish: a few frames, and until no section still says "loading…" (10 s at most)."""
    for _ in range(20):
        await pilot.pause(0.025)
    # a detail screen loads its journal rows and its live diff (a replay dry run against
    # Chroma) in workers: on a busy machine that takes seconds, so wait for them to land
    for _ in range(1200):
        if not any(str(w.content) == LOADING for w in pilot.app.screen.query(Static)):
            return
        await pilot.pause(0.025)
    raise RuntimeError("a detail screen was still loading after 30 s")


def timeline_step(scene: scenes.Scene, k: int) -> None:
    """Step k of the incident: load flows, executor B dies at step 9, receipts and drift appear."""
    t = scene.now
    killed = 9
    scene.x(
        "UPDATE worker SET heartbeat_at = ? WHERE owner_id IN (?, ?, ?)",
        t - 400,
        scenes.EXEC_A,
        scenes.SUMM,
        scenes.DREAM,
    )
    if k < killed:
        scene.x("UPDATE worker SET heartbeat_at = ? WHERE owner_id = ?", t - 700, scenes.EXEC_B)
        scene.x(
            "UPDATE session_execution SET expires_at = ?, time_renewed = ? WHERE id = 'exe_0002'",
            t + 30_000,
            t,
        )
    scene.x(
        "UPDATE session_execution SET expires_at = ?, time_renewed = ? WHERE id = 'exe_0001'",
        t + 27_000,
        t - 3_000,
    )
    # inputs arrive every step; executor A promotes the oldest two, so the backlog swells
    # once executor B is gone
    sid = ("s-charlie", "s-delta", "s-echo")[k % 3]
    for i in range(3 if k >= killed else 2):
        scene.x(
            "INSERT INTO session_input (id, session_id, prompt, delivery, admitted_seq, "
            "wake_pending, time_created) VALUES (?,?,?,?,?,1,?)",
            f"tl_{k}_{i}",
            sid,
            "{}",
            "queue",
            500 + k * 10 + i,
            t - 1_000 * i,
        )
    scene.x(
        "UPDATE session_input SET promoted_seq = admitted_seq, wake_pending = 0 WHERE id IN "
        "(SELECT id FROM session_input WHERE promoted_seq IS NULL AND id LIKE 'tl_%' "
        "ORDER BY time_created LIMIT ?)",
        2,
    )
    timeline_tool_calls(scene, k, killed)
    if k == 12:
        scenes.receipt_mismatches(scene)
    if k == 14:
        scenes.dream_drift(scene)
    if k == 16:
        scenes.model_trouble(scene)
    scene.event(
        "execution.step",
        scenes.EXEC_A,
        ago_ms=0,
        session_id="s-alpha",
        target="exe_0001",
        step=k,
        phase="unknown",
    )


def timeline_tool_calls(scene: scenes.Scene, k: int, killed: int) -> None:
    """The post-mortem's tool calls: a find that completed; a send executor B had in flight when it
    was killed, made unknown by A's takeover, and resolved by an operator two steps later."""
    if k == killed - 3:
        scene.tool_call(
            "call_t1", "exe_0002", "s-bravo", "demo.notes_search", {"query": "invoice 2291"},
            state="completed", owner=scenes.EXEC_B, epoch=1, ago_ms=2_000, effect="read",
            permission="allow", result="1 note: invoice 2291 approved by finance", starts=1,
        )  # fmt: skip
    if k == killed - 1:
        scene.tool_call(
            "call_t2", "exe_0002", "s-bravo", "demo.outbox_send",
            {"to": "finance@example.com", "subject": "pay invoice 2291", "amount": 1250},
            state="running", owner=scenes.EXEC_B, epoch=1, ago_ms=3_000, step=2, permission="allow",
            starts=1,
        )  # fmt: skip
    if k == killed + 1:
        why = f"in flight when its executor {scenes.EXEC_B} (epoch 1) stopped; check the tool's own records"
        scene.x(
            "UPDATE tool_call SET state = 'unknown', reason = ?, owner_id = ?, epoch = 2, time_updated = ? "
            "WHERE id = 'call_t2'",
            why, scenes.EXEC_A, scene.now,
        )  # fmt: skip
        scene.event("tool.outcome_unknown", scenes.EXEC_A, ago_ms=0, session_id="s-bravo",
                    target="call_t2", execution_id="exe_0002", epoch=2, reason=why,
                    ran_by=scenes.EXEC_B, ran_epoch=1)  # fmt: skip
    if k == killed + 3:
        done = "sent: the outbox shows invoice 2291 once"
        scene.x(
            "UPDATE tool_call SET state = 'completed', result = ?, decided_by = 'alice', decided_at = ?, "
            "time_finished = ?, time_updated = ? WHERE id = 'call_t2'",
            done, scene.now, scene.now, scene.now,
        )  # fmt: skip
        scene.event("operator.resolve", "alice", ago_ms=0, session_id="s-bravo", target="call_t2",
                    decision="done", state="completed", decided_by="alice", text=done)  # fmt: skip


async def capture_timeline(out: Path, work: Path) -> None:
    """console.svg: three minutes of an incident, replayed through the console."""
    start = scenes.NOW - STEPS * STEP_MS
    frozen = clock.FrozenClock(start)
    clock.set_clock(frozen)
    data = DataDir(work / "timeline")
    with scenes.Scene(data.root, start) as scene:
        scene.tx(lambda: scenes.healthy(scene))
        server = chroma_server.resolve(data, start=True)
        try:
            app = new_app(data)
            async with app.run_test(size=SIZE) as pilot:
                await wait_applied(app, pilot, 1)
                history = HistoryStore.open(data.root)
                recorder = Context(data, read_only=True, start_chroma=False)
                for k in range(1, STEPS + 1):
                    scene.now = start + k * STEP_MS
                    frozen.now = scene.now
                    scene.tx(lambda k=k: timeline_step(scene, k))
                    applies = app.stats["applies"]
                    app.request_refresh(force=True)
                    await wait_applied(app, pilot, applies + 1)
                    shown = await fixed_port_status(recorder)
                    await timeline.record(recorder, history, "interval", shown)
                await recorder.close()
                history.close()
                app.tick()
                await settle(pilot)
                app.save_screenshot("console.svg", str(out))
            post_mortem = new_app(data, read_only=True, at=start + 11 * STEP_MS)
            async with post_mortem.run_test(size=SIZE) as pilot:
                for _ in range(400):
                    await pilot.pause()
                    if post_mortem.moment is not None and post_mortem.applied is post_mortem.moment:
                        break
                    await asyncio.sleep(0.025)
                await settle(pilot)
                post_mortem.save_screenshot("post-mortem.svg", str(out))
                await pilot.press("6", "slash", *"tool.", "enter")  # the Events panel: the tool calls
                await settle(pilot)
                post_mortem.save_screenshot("post-mortem-tools.svg", str(out))
        finally:
            server.stop()


async def capture_state(
    out: Path,
    name: str,
    data: DataDir,
    keys: tuple[str, ...] = (),
    size: tuple[int, int] = SIZE,
    chroma: bool = True,
    **kwargs: Any,
) -> None:
    clock.set_clock(clock.FrozenClock(scenes.NOW))
    server = chroma_server.resolve(data, start=True) if chroma else None
    try:
        app = new_app(data, **kwargs)
        async with app.run_test(size=size) as pilot:
            await wait_applied(app, pilot, 1)
            if keys:
                await pilot.press(*keys)
            await settle(pilot)
            app.save_screenshot(f"{name}.svg", str(out))
    finally:
        if server is not None:
            server.stop()


def states(work: Path) -> list[tuple[str, Callable[[], DataDir], tuple[str, ...], dict[str, Any]]]:
    def build(name: str, *steps: Callable[[scenes.Scene], None]) -> Callable[[], DataDir]:
        return lambda: scenes.build(work / name, *steps)

    return [
        ("healthy", build("healthy", scenes.healthy), (), {}),
        ("killed-executor", build("killed", scenes.healthy, scenes.killed_executor), (), {}),
        ("receipt-diff", build("receipts", scenes.healthy, scenes.receipt_mismatches), ("3", "enter"), {}),
        ("dream-drift", build("drift", scenes.healthy, scenes.dream_drift), ("4",), {}),
        ("confirm-release", build("confirm", scenes.incident), ("2", "l"), {}),
        ("narrow-80x24", build("narrow", scenes.incident), (), {"size": (80, 24)}),
        ("model-sessions", build("sessions", scenes.incident), ("8", "z"), {}),
        ("session-detail", build("detail", scenes.incident), ("8", "end", "enter"), {}),
        # Backlog's first rows are the tool calls waiting for a person: s-bravo's unknown outcome,
        # then s-alpha's send awaiting approval; the held session (s-tango) after them
        ("confirm-resume", build("resume", scenes.incident), ("1", "down", "down", "u"), {}),
        ("tool-calls", build("tools", scenes.incident), ("1", "z"), {}),
        ("confirm-approve", build("approve", scenes.incident), ("1", "down", "a"), {}),
        # `k` on Backlog's running send (after the unknown outcome and the approval): its executor
        (
            "confirm-kill",
            build("kill", scenes.incident, scenes.send_in_flight),
            ("1", "down", "down", "k"),
            {},
        ),
        # `o` on s-bravo's unknown outcome, the operator's text typed, Done focused
        (
            "resolve-unknown",
            build("resolve", scenes.incident),
            ("1", "o", "shift+tab", *RESOLVED, "tab", "tab"),
            {},
        ),
    ]


async def main(out: Path) -> None:
    os.environ["TZ"] = "UTC"
    time.tzset()
    os.environ["REM_HOST"] = "ops-1"  # the scenes' host: their workers are this host's (`k` names them)
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="rem-shots-") as tmp:
        work = Path(tmp)
        await capture_timeline(out, work)
        print(f"wrote {out / 'console.svg'} and {out / 'post-mortem.svg'}")
        for name, make, keys, extra in states(work):
            await capture_state(out, name, make(), keys, **extra)
            print(f"wrote {out / (name + '.svg')}")
    clock.set_clock(None)


def run(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "screenshots")
    args = parser.parse_args(argv)
    asyncio.run(main(args.out))


if __name__ == "__main__":
    run()
