"""The peer benchmark's crash column: SIGKILL each system while its model call is in flight, restart it,
and count what happened (`benchmarks/peers.py --crash`).

Per system and store, on a fresh database: one process admits two inputs to one session (`c1`,
then `c2` behind it) and starts on `c1`; its model call records itself (a line in `calls.jsonl`,
fsynced) and then hangs. The harness SIGKILLs the process as soon as the call is recorded, starts
a fresh process of the same system with a model that answers at once, and waits until both
inputs are answered (or 120 s pass). What the restart needed:

* rem: nothing; an executor takes the dead owner's execution over when its lease expires (here
  `REM_EXECUTION_LEASE_MS=2000`), with a continuation message, and then runs `c2` from its queue;
* DBOS: nothing; `DBOS.launch()` recovers the pending workflows of its executor id, and the
  queue still holds `c2`;
* LangGraph: the application must know which thread was running and invoke it again with no
  input (it resumes from the last checkpoint); `c2` was never admitted (a thread runs one
  invocation at a time, so it waited in the client) and is sent again.

Counted: model calls for `c1` (two: the step in flight is repeated by all three), the replies
stored for each input (one each: none lost, none duplicated), and whether `c2` needed resending.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

INPUTS = (
    ("c1", "s1", "What broke the nightly export? (crash 1)"),
    ("c2", "s1", "And what fixed it? (crash 2)"),
)
LEASE_MS = "2000"
DEADLINE_S = 120.0


def record_call(scratch: Path, input_id: str, hang: bool) -> None:
    """The model call's trace (fsynced before anything else), then a hang for the victim."""
    with open(scratch / "calls.jsonl", "a") as out:
        out.write(json.dumps({"input": input_id, "pid": os.getpid()}) + "\n")
        out.flush()
        os.fsync(out.fileno())
    if hang:
        time.sleep(600)


def input_of(text: str) -> str:
    return next(i for i, _, t in INPUTS if t in text)


# -- the children -------------------------------------------------------------------------
def crash_child(system: str, phase: str, store: str, target: str, scratch: Path) -> dict[str, Any]:
    """One side of a crash trial, in its own process: `victim` (admit, start, hang) or `restart`."""
    return {"rem": _rem_child, "dbos": _dbos_child, "langgraph": _langgraph_child}[system](
        phase, store, target, scratch
    )


def _rem_child(phase: str, store: str, target: str, scratch: Path) -> dict[str, Any]:
    return asyncio.run(_rem(phase, store, target, scratch))


async def _rem(phase: str, store: str, target: str, scratch: Path) -> dict[str, Any]:
    from backend.core.datadir import DataDir
    from backend.execution import sessions
    from backend.execution.agent import OfflineResponder, StepRequest
    from backend.execution.executor import Executor
    from backend.runtime.context import Context

    class Traced(OfflineResponder):
        async def stream(self, request: StepRequest) -> AsyncIterator[str]:
            record_call(scratch, input_of(" ".join(request.prompts)), hang=phase == "victim")
            async for part in super().stream(request):
                yield part

    root, url = (Path(target), None) if store == "sqlite" else (scratch / "rem-data", target)
    ctx = Context(DataDir(root), start_chroma=False, db_url=url)
    db = await ctx.db()
    if phase == "victim":
        for input_id, session_id, text in INPUTS:
            await sessions.admit(db, session_id, text, input_id=input_id)
    executor = Executor(ctx, agent=Traced(delay_ms=0), concurrency=8)
    running = asyncio.create_task(executor.run())
    start = time.monotonic()
    while time.monotonic() - start < DEADLINE_S and len(await _rem_replies(db)) < len(INPUTS):
        await asyncio.sleep(0.05)
    replies = await _rem_replies(db)
    executor.request_stop()
    await running
    await ctx.close()
    return {"replies": replies, "recovered_s": time.monotonic() - start, "resent": []}


async def _rem_replies(db: Any) -> dict[str, int]:
    rows = await db.fetchall("SELECT data FROM session_message WHERE type = 'assistant'")
    counts: dict[str, int] = {}
    for (data,) in rows:
        reply = json.loads(data)
        if reply.get("status") == "completed":
            for answered in reply.get("answers", []):
                counts[answered] = counts.get(answered, 0) + 1
    return counts


def _dbos_child(phase: str, store: str, target: str, scratch: Path) -> dict[str, Any]:
    from benchmarks.peer_workloads import dbos_app, dbos_enqueue, model_reply

    def model(session_id: str, text: str) -> str:
        record_call(scratch, input_of(text), hang=phase == "victim")
        return model_reply(session_id, text)

    dbos, queue, turn = dbos_app(store, target, 8, model)  # launch: recovers this executor's workflows
    if phase == "victim":
        for input_id, session_id, text in INPUTS:
            dbos_enqueue(queue, turn, input_id, session_id, text)
    start = time.monotonic()
    replies: dict[str, int] = {}
    while time.monotonic() - start < DEADLINE_S:
        replies = {}
        for input_id, _, _ in INPUTS:
            status = dbos.get_workflow_status(input_id)
            if status is not None and status.status == "SUCCESS":
                replies[input_id] = len([s for s in dbos.list_workflow_steps(input_id) if s.get("output")])
        if len(replies) == len(INPUTS):
            break
        time.sleep(0.05)
    elapsed = time.monotonic() - start
    dbos.destroy()
    return {"replies": replies, "recovered_s": elapsed, "resent": []}


def _langgraph_child(phase: str, store: str, target: str, scratch: Path) -> dict[str, Any]:
    from benchmarks.peer_workloads import langgraph_app, langgraph_invoke, model_reply

    def model(session_id: str, text: str) -> str:
        record_call(scratch, input_of(text), hang=phase == "victim")
        return model_reply(session_id, text)

    graph, close = langgraph_app(store, target, 8, model)
    config = {"configurable": {"thread_id": "s1"}}
    start, resent = time.monotonic(), []
    if phase == "victim":
        for input_id, session_id, text in INPUTS:  # one thread: c2 waits in the client for c1
            langgraph_invoke(graph, input_id, session_id, text)
    else:
        # the application must know the thread was running: invoked again with no input, it resumes
        # from its last checkpoint (the node runs again); c2 never reached LangGraph: sent again
        graph.invoke(None, config, durability="sync")
        answered = _langgraph_replies(graph, config)
        for input_id, session_id, text in INPUTS:
            if input_id not in answered:
                langgraph_invoke(graph, input_id, session_id, text)
                resent.append(input_id)
    replies = _langgraph_replies(graph, config)
    close()
    return {"replies": replies, "recovered_s": time.monotonic() - start, "resent": resent}


def _langgraph_replies(graph: Any, config: dict[str, Any]) -> dict[str, int]:
    messages = graph.get_state(config).values.get("messages", [])
    counts: dict[str, int] = {}
    for message in messages:
        if str(message.id).startswith("reply-"):
            key = str(message.id).removeprefix("reply-")
            counts[key] = counts.get(key, 0) + 1
    return counts


# -- the harness ----------------------------------------------------------------------------
def _spawn(system: str, phase: str, store: str, target: str, scratch: Path) -> subprocess.Popen[str]:
    command = [sys.executable, str(Path(__file__).with_name("peers.py")), "--crash-child", system]
    command += ["--phase", phase, "--store", store, "--target", target]
    env = {
        **os.environ,
        "PEERS_SCRATCH": str(scratch),
        "REM_DATA": str(scratch),
        "REM_EXECUTION_LEASE_MS": LEASE_MS,
    }
    return subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def crash_one(system: str, store: str, target: str, scratch: Path) -> dict[str, Any]:
    """One trial: the victim killed mid-call, a restart, what it took and what was stored."""
    calls = scratch / "calls.jsonl"
    victim = _spawn(system, "victim", store, target, scratch)
    deadline = time.monotonic() + 60
    while not (calls.exists() and calls.read_text().strip()):
        if victim.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(
                f"{system} on {store}: no model call before the kill\n{victim.communicate()[1][-3000:]}"
            )
        time.sleep(0.01)
    victim.send_signal(signal.SIGKILL)
    victim.wait()
    restart = _spawn(system, "restart", store, target, scratch)
    out, err = restart.communicate(timeout=DEADLINE_S + 60)
    if restart.returncode != 0:
        raise SystemExit(f"{system} on {store}: the restart failed\n{err[-3000:]}")
    result = json.loads(out.strip().splitlines()[-1])
    traced = [json.loads(line)["input"] for line in calls.read_text().splitlines()]
    return {
        "system": system,
        "store": store,
        "model_calls_c1": traced.count("c1"),
        "replies": {i: result["replies"].get(i, 0) for i, _, _ in INPUTS},
        "resent_by_client": result["resent"],
        "recovered_s": round(result["recovered_s"], 2),
    }


def crash_all(
    systems: list[str], stores: list[str], server_url: str | None, tmp: Path
) -> list[dict[str, Any]]:
    from benchmarks.peers import target_for

    trials = []
    for store in stores:
        for system in systems:
            scratch = tmp / f"crash-{store}-{system}"
            scratch.mkdir()
            with target_for(
                store, server_url, tmp, f"crash_{store[:2]}_{system.replace('-', '_')}"
            ) as target:
                trials.append(crash_one(system, store, target, scratch))
            print(f"crash {store:8} {system:9} {trials[-1]}", file=sys.stderr)
    return trials


def print_crashes(trials: list[dict[str, Any]]) -> None:
    print(
        "\ncrash mid-turn (SIGKILL while the model call for c1 is in flight), then a restart:",
        file=sys.stderr,
    )
    for t in trials:
        print(
            f"  {t['store']:8} {t['system']:9} model calls for c1: {t['model_calls_c1']}  "
            f"replies c1/c2: {t['replies']['c1']}/{t['replies']['c2']}  "
            f"resent by the client: {', '.join(t['resent_by_client']) or 'none'}  "
            f"answered {t['recovered_s']} s after the restart",
            file=sys.stderr,
        )
