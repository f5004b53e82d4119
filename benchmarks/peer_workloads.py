"""The peer benchmark's workload, as each system runs it in a process of its own (`benchmarks/peers.py`).

The workload (the same for rem, DBOS Transact and LangGraph): `inputs` inputs
spread over `sessions` sessions (input i goes to session i % sessions, with id
`in-i`), admitted by `concurrency` admitters at once (admitter k owns the
sessions whose number is k modulo `concurrency`, and admits each of them in
order), answered by an instant model whose reply is rem's own offline reply to
that text (the same bytes for every system), `concurrency` at a time. Timed
from the first admission to the last reply durable.

What each system is asked to guarantee, as close to the same as each offers:

* admission durable and idempotent on the input id: rem's `sessions.admit`
  (`session_input`, unique id); DBOS's workflow id (`SetWorkflowID`) on an
  enqueued workflow (its status row, inputs included, committed before it
  runs); LangGraph's thread checkpoint of the input, written before the node
  runs (`durability="sync"`), the input a `HumanMessage` whose id is the
  input id (`add_messages` replaces, never duplicates, a message of the same id);
* the reply durable before it counts: rem's turn committed (its reply row,
  parts and journal); DBOS's workflow output (and its step's checkpoint);
  LangGraph's checkpoint after the node (`durability="sync"`);
* per-session order: rem's session lease (one turn at a time, inputs in
  admission order); DBOS's partitioned queue (`partition_concurrency=1`, the
  session as the partition key); LangGraph, which offers none across
  invocations of one thread, by the admitter that owns the session invoking
  its inputs one after another;
* the same durability on each store: PostgreSQL with fsync and
  `synchronous_commit` on for all three; SQLite in WAL with
  `synchronous=NORMAL` for all three.

Each child prints one JSON line: turns, seconds, its CPU seconds.
"""

from __future__ import annotations

import asyncio
import os
import resource
import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ASKS = (
    "Why did the nightly ledger export stall after the PgBouncer change?",
    "Summarise what Priya said about the Canary Pipeline.",
    "List the risks of moving the Invoice Service behind Stripe webhooks.",
    "Draft a runbook step for when the Frankfurt region is late again.",
)
# how often DBOS's queue looks for work, and the harness for DBOS's finished workflows (its default
# queue poll is 1 s; 10 ms is what a latency-minded deployment would set)
DBOS_POLL_S = 0.01


def workload(inputs: int, sessions: int) -> list[tuple[str, str, str]]:
    """(input id, session id, text) for every input, in admission order."""
    return [(f"in-{i}", f"s{i % sessions}", f"{ASKS[i % len(ASKS)]} (#{i})") for i in range(inputs)]


def shares(items: list[tuple[str, str, str]], admitters: int) -> list[list[tuple[str, str, str]]]:
    """Each admitter's inputs: those of the sessions it owns, in admission order."""
    owned: list[list[tuple[str, str, str]]] = [[] for _ in range(admitters)]
    for item in items:
        owned[int(item[1][1:]) % admitters].append(item)
    return owned


def model_reply(session_id: str, text: str) -> str:
    """The instant model: rem's offline reply to `text` (pure), the same bytes for every system."""
    from backend.execution.agent import OfflineResponder, StepRequest

    return "".join(
        OfflineResponder(delay_ms=0).compose(StepRequest(session_id=session_id, prompts=[text], step=1))
    )


def cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def measured(run: Callable[[], int]) -> dict[str, Any]:
    """Run the timed part; its turns, wall seconds and this process's CPU seconds (every thread)."""
    cpu, start = cpu_s(), time.perf_counter()
    turns = run()
    return {"turns": turns, "seconds": time.perf_counter() - start, "cpu_s": cpu_s() - cpu}


def in_threads(
    work: Callable[[int, list[tuple[str, str, str]]], None], owned: list[list[tuple[str, str, str]]]
) -> None:
    """`work(k, share)` for each admitter's share, each in a thread of its own; the first failure raised."""
    failures: list[BaseException] = []

    def guarded(k: int, share: list[tuple[str, str, str]]) -> None:
        try:
            work(k, share)
        except BaseException as exc:
            failures.append(exc)

    threads = [threading.Thread(target=guarded, args=(k, share)) for k, share in enumerate(owned)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if failures:
        raise failures[0]


# -- rem ----------------------------------------------------------------------------
def run_rem(store: str, target: str, inputs: int, sessions: int, concurrency: int) -> dict[str, Any]:
    """One in-process `Executor`; the admitters on a connection of their own, as a client's."""
    return asyncio.run(_rem(store, target, inputs, sessions, concurrency))


async def _rem(store: str, target: str, inputs: int, sessions: int, concurrency: int) -> dict[str, Any]:
    from backend.core.datadir import DataDir
    from backend.execution import sessions as admission
    from backend.execution.agent import OfflineResponder
    from backend.execution.executor import Executor
    from backend.runtime.context import Context

    root, url = (Path(target), None) if store == "sqlite" else (Path(os.environ["PEERS_SCRATCH"]), target)
    ctx = Context(DataDir(root), start_chroma=False, db_url=url)
    client = Context(DataDir(root), start_chroma=False, db_url=url)
    await ctx.db()
    db = await client.db()
    executor = Executor(ctx, agent=OfflineResponder(delay_ms=0), concurrency=concurrency)
    running = asyncio.create_task(executor.run())
    while not executor.registered:
        await asyncio.sleep(0.01)
    items = workload(inputs, sessions)

    async def admit(share: list[tuple[str, str, str]]) -> None:
        for input_id, session_id, text in share:
            await admission.admit(db, session_id, text, input_id=input_id)

    cpu, start = cpu_s(), time.perf_counter()
    await asyncio.gather(*(admit(share) for share in shares(items, concurrency)))
    while executor.turns_completed < inputs:
        await asyncio.sleep(0.005)
    result = {
        "turns": executor.turns_completed,
        "seconds": time.perf_counter() - start,
        "cpu_s": cpu_s() - cpu,
    }
    executor.request_stop()
    await running
    await client.close()
    await ctx.close()
    return result


# -- DBOS Transact --------------------------------------------------------------------
def _dbos_sqlite_engine(path: Path) -> Any:
    """DBOS's own SQLite engine (IMMEDIATE transactions, busy timeout, foreign keys), in WAL with
    synchronous=NORMAL like the others."""
    import sqlalchemy as sa
    from sqlalchemy import event

    engine = sa.create_engine(f"sqlite:///{path}")

    @event.listens_for(engine, "connect")
    def pragmas(dbapi_conn: Any, _record: Any) -> None:
        dbapi_conn.isolation_level = "IMMEDIATE"
        dbapi_conn.execute("PRAGMA busy_timeout=30000")
        dbapi_conn.execute("PRAGMA foreign_keys=ON")
        dbapi_conn.execute("PRAGMA journal_mode=WAL")
        dbapi_conn.execute("PRAGMA synchronous=NORMAL")

    return engine


def dbos_app(store: str, target: str, concurrency: int, model: Callable[[str, str], str]) -> Any:
    """DBOS configured on `target` with the turn workflow and its partitioned queue; (DBOS, queue, turn)."""
    from dbos import DBOS, DBOSConfig

    config: DBOSConfig = {"name": "peers", "log_level": "ERROR", "run_migrations": True}
    if store == "sqlite":
        path = Path(target) / "dbos.sqlite"
        config["system_database_url"] = f"sqlite:///{path}"
        config["system_database_engine"] = _dbos_sqlite_engine(path)
    else:
        config["system_database_url"] = target
        config["sys_db_pool_size"] = concurrency + 4
    DBOS(config=config)

    @DBOS.step()
    def call_model(session_id: str, text: str) -> str:
        return model(session_id, text)

    @DBOS.workflow()
    def turn(session_id: str, text: str) -> str:
        return call_model(session_id, text)

    DBOS.launch()
    queue = DBOS.register_queue(
        "turns", worker_concurrency=concurrency, partition_concurrency=1, polling_interval_sec=DBOS_POLL_S
    )
    return DBOS, queue, turn


def dbos_enqueue(queue: Any, turn: Any, input_id: str, session_id: str, text: str) -> None:
    from dbos import SetEnqueueOptions, SetWorkflowID

    with SetWorkflowID(input_id), SetEnqueueOptions(queue_partition_key=session_id):
        queue.enqueue(turn, session_id, text)


def dbos_finished(dbos: Any, count: int) -> bool:
    """Whether `count` workflows finished (their output durable): one row asked for, past the first
    `count - 1`, so the server counts, not this process."""
    return bool(
        dbos.list_workflows(status="SUCCESS", offset=count - 1, limit=1, load_input=False, load_output=False)
    )


def run_dbos(store: str, target: str, inputs: int, sessions: int, concurrency: int) -> dict[str, Any]:
    dbos, queue, turn = dbos_app(store, target, concurrency, model_reply)
    items = workload(inputs, sessions)

    def admit(_k: int, share: list[tuple[str, str, str]]) -> None:
        for item in share:
            dbos_enqueue(queue, turn, *item)

    def run() -> int:
        in_threads(admit, shares(items, concurrency))
        while not dbos_finished(dbos, inputs):
            time.sleep(DBOS_POLL_S)
        return inputs

    result = measured(run)
    dbos.destroy()
    return result


def run_dbos_direct(store: str, target: str, inputs: int, sessions: int, concurrency: int) -> dict[str, Any]:
    """DBOS's fastest way to this workload: `concurrency` threads, each running its sessions' workflows
    one after another in the calling thread (per-session order by ownership, as for LangGraph). The
    workflow's start is its admission: durable and idempotent on the id, but an input still waiting
    in a thread's list is only in the client's memory (no durable queue, unlike `dbos`)."""
    from dbos import SetWorkflowID

    dbos, _queue, turn = dbos_app(store, target, concurrency, model_reply)
    items = workload(inputs, sessions)
    done = [0] * concurrency

    def worker(k: int, share: list[tuple[str, str, str]]) -> None:
        for input_id, session_id, text in share:
            with SetWorkflowID(input_id):
                turn(session_id, text)  # returns once its output is durable
            done[k] += 1

    def run() -> int:
        in_threads(worker, shares(items, concurrency))
        return sum(done)

    result = measured(run)
    dbos.destroy()
    return result


# -- LangGraph ------------------------------------------------------------------------
def langgraph_app(
    store: str, target: str, concurrency: int, model: Callable[[str, str], str]
) -> tuple[Any, Any]:
    """A one-node chat graph (`MessagesState`) on LangGraph's SQLite or Postgres checkpointer; (graph, closer)."""
    from langchain_core.messages import AIMessage, HumanMessage
    from langgraph.graph import END, START, MessagesState, StateGraph

    def answer(state: MessagesState) -> dict[str, Any]:
        asked = next(m for m in reversed(state["messages"]) if isinstance(m, HumanMessage))
        reply_id = f"reply-{asked.id}"
        if any(m.id == reply_id for m in state["messages"]):
            return {}  # answered already (the same input admitted again): no model call
        return {"messages": [AIMessage(content=model(str(asked.name), str(asked.content)), id=reply_id)]}

    builder = StateGraph(MessagesState)
    builder.add_node("answer", answer)
    builder.add_edge(START, "answer")
    builder.add_edge("answer", END)
    if store == "sqlite":
        from langgraph.checkpoint.sqlite import SqliteSaver

        conn = sqlite3.connect(Path(target) / "langgraph.sqlite", check_same_thread=False)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")
        saver: Any = SqliteSaver(conn)
        saver.setup()
        return builder.compile(checkpointer=saver), conn.close
    from langgraph.checkpoint.postgres import PostgresSaver
    from psycopg.rows import dict_row
    from psycopg_pool import ConnectionPool

    pool = ConnectionPool(
        target,
        min_size=concurrency,
        max_size=concurrency,
        kwargs={"autocommit": True, "prepare_threshold": 0, "row_factory": dict_row},
        open=True,
    )
    saver = PostgresSaver(pool)  # type: ignore[arg-type]
    saver.setup()
    return builder.compile(checkpointer=saver), pool.close


def langgraph_invoke(graph: Any, input_id: str, session_id: str, text: str) -> None:
    from langchain_core.messages import HumanMessage

    graph.invoke(
        {"messages": [HumanMessage(content=text, id=input_id, name=session_id)]},
        {"configurable": {"thread_id": session_id}},
        durability="sync",
    )


def run_langgraph(store: str, target: str, inputs: int, sessions: int, concurrency: int) -> dict[str, Any]:
    graph, close = langgraph_app(store, target, concurrency, model_reply)
    items = workload(inputs, sessions)
    done = [0] * concurrency

    def worker(k: int, share: list[tuple[str, str, str]]) -> None:
        for item in share:
            langgraph_invoke(graph, *item)  # returns once the reply's checkpoint is durable
            done[k] += 1

    def run() -> int:
        threads = [
            threading.Thread(target=worker, args=(k, s)) for k, s in enumerate(shares(items, concurrency))
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        return sum(done)

    result = measured(run)
    close()
    return result


RUNNERS: dict[str, Callable[[str, str, int, int, int], dict[str, Any]]] = {
    "rem": run_rem,
    "dbos": run_dbos,
    "dbos-direct": run_dbos_direct,
    "langgraph": run_langgraph,
}
