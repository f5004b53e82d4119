"""Fixtures every suite reuses: a temp data dir, a real Chroma server, a live Context."""

from __future__ import annotations

import compileall
import json
import shutil
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from backend.chroma import server as chroma_server
from backend.chroma.server import ChromaServer
from backend.core import clock, faults
from backend.core.datadir import DataDir
from backend.models import health
from backend.runtime.context import Context
from tests import pg
from tests.fake_openai import FakeOpenAIServer, Scenario
from tests.helpers import counter_drift
from tests.summaries import shared_embedder

pytest_plugins = ["tests.gates"]

MODEL = "gpt-4o-mini"


# Seconds each of the longest files took, summed over its tests (setup included), in one whole run
# with 3 workers on the 2-core machine under load (`--durations=0`, summed per file: 2026-12-07, load
# 4-17, median 7.5, 26:27 in all); only the order matters.
FILE_SECONDS = {
    "tests/reliability/test_fault_matrix_pg.py": 404,
    "tests/reliability/test_fault_matrix.py": 297,
    "tests/reliability/test_drill.py": 251,
    "tests/reliability/test_drill_pg.py": 224,
    "tests/reliability/test_bad_input.py": 220,
    "tests/reliability/test_two_hosts.py": 159,
    "tests/api/test_cli_client.py": 134,
    "tests/api/test_openapi_conformance.py": 132,
    "tests/reliability/test_tool_sigkill.py": 108,
    "tests/tui/test_console.py": 92,
    "tests/reliability/test_pgbouncer.py": 90,
    "tests/reliability/test_execution_crash.py": 87,
    "tests/reliability/test_tool_sigkill_effect.py": 87,
    "tests/backend/test_recall.py": 85,
    "tests/tui/test_demo_tmux.py": 82,
    "tests/reliability/test_summarizer_sigkill.py": 73,
    "tests/backend/test_replay.py": 72,
    "tests/cli/test_replay_cli.py": 72,
    "tests/reliability/test_model_crash.py": 64,
    "tests/reliability/test_tool_sigkill_pg.py": 62,
    "tests/backend/test_postgres.py": 60,
    "tests/reliability/test_children.py": 57,
    "tests/reliability/test_read_only.py": 49,
    "tests/cli/test_memory_cli.py": 47,
    "tests/reliability/test_dependencies.py": 47,
    "tests/reliability/test_chroma_impostor.py": 45,
    "tests/cli/test_inert_output.py": 44,
    "tests/tui/test_demo.py": 44,
    "tests/reliability/test_tool_usage_fleet.py": 41,
    "tests/cli/test_cli.py": 40,
}
ROOT = Path(__file__).resolve().parents[1]


def pytest_sessionstart(session: pytest.Session) -> None:
    """Compile rem's own modules to bytecode once, before any test starts a `rem` process.

    An editable install leaves rem's sources uncompiled, and with PYTHONDONTWRITEBYTECODE (set
    in this machine's environment, so in CI) every `rem` process the tests start compiled
    them all again: ~0.15-0.25 s of CPU a `rem daemon` (measured: importing the executor and
    chromadb, 0.94 s user uncompiled, 0.80 s compiled), over thousands of processes. Python reads
    a `__pycache__` file whatever that variable says, and checks it against its source's mtime,
    so an edited module is compiled afresh. The controller does it before its workers start;
    `__pycache__/` is ignored by git."""
    if hasattr(session.config, "workerinput"):
        return  # an xdist worker: the controller has done it
    for package in ("backend", "tui"):
        compileall.compile_dir(ROOT / package, quiet=1, workers=1)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The longest files first (FILE_SECONDS; then any other file with a `slow` test), the rest after
    in their own order: a stable sort, the same in every xdist worker. With `--dist loadfile
    --no-loadscope-reorder` a file runs whole on one worker, handed out in the order collected, so
    a file of minutes handed out last is the run's tail while the other workers idle (measured:
    the two-hosts and impostor files ran last, alone, for minutes)."""
    slow = {item.path for item in items if item.get_closest_marker("slow")}

    def weight(item: pytest.Item) -> int:
        known = FILE_SECONDS.get(item.path.relative_to(ROOT).as_posix())
        return known if known is not None else (60 if item.path in slow else 0)

    items.sort(key=lambda item: -weight(item))


@pytest.fixture
def data_dir(tmp_path: Path) -> DataDir:
    """An empty, not yet initialised data dir."""
    return DataDir(tmp_path / "data")


@pytest.fixture(scope="session")
def chroma(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ChromaServer]:
    """One real `chroma run` server on a free loopback port for the whole session."""
    data = DataDir(tmp_path_factory.mktemp("chroma-session") / "data").ensure()
    server = chroma_server.resolve(data)
    assert server.started_here
    yield server
    server.stop()


@pytest.fixture
def chroma_url(chroma: ChromaServer) -> str:
    if not chroma.alive():  # a test SIGKILLed it: give the next test a fresh one
        assert chroma.data is not None
        fresh = chroma_server.resolve(chroma.data)
        chroma.url, chroma.process = fresh.url, fresh.process
    return chroma.url


@pytest.fixture
def collection() -> str:
    """A Chroma collection name of this test's own, so tests never see each other's rows."""
    return f"t_{uuid.uuid4().hex[:12]}"


# The state stores a test marked `both_stores` runs on (its `ctx` / `db_ctx` and every rem
# process it starts); a test marked `sqlite_only` too (SQLite's query plans, PRAGMAs) runs once.
STORES = ("sqlite", "postgres")


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if (
        "store" in metafunc.fixturenames
        and metafunc.definition.get_closest_marker("both_stores")
        and not metafunc.definition.get_closest_marker("sqlite_only")
    ):
        metafunc.parametrize("store", STORES, indirect=True)


@pytest.fixture
def store(request: pytest.FixtureRequest) -> str:
    """`sqlite` (the default), `postgres` (18) or `postgres15`: which state store this run of the test uses."""
    return str(getattr(request, "param", "sqlite"))


def _session_server(major: int | None) -> Iterator[pg.LocalPostgres]:
    server = pg.start_server(major)
    try:
        yield server
    finally:
        server.stop(remove=True)
        shutil.rmtree(server.root, ignore_errors=True)  # its scratch dir (on /dev/shm: memory)


@pytest.fixture(scope="session")
def pg_server() -> Iterator[pg.LocalPostgres]:
    """One real PostgreSQL server (18, embedded) for the whole session, stopped (and removed) at its end."""
    yield from _session_server(None)


@pytest.fixture(scope="session")
def pg15_server() -> Iterator[pg.LocalPostgres]:
    """Debian's PostgreSQL 15 for the session, for the tests with `store` "postgres15" (tests/pg.py
    OLDEST_TESTED says which); skipped locally, failed in CI, without its binaries."""
    yield from _session_server(pg.OLDEST_TESTED)


@pytest.fixture
def db_url(
    store: str, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> Iterator[str | None]:
    """None on SQLite; on PostgreSQL a fresh migrated database's URL, also in REM_DB_URL so
    every rem process the test starts uses the same store; dropped after the test."""
    if not store.startswith("postgres"):
        yield None
        return
    for url in pg.database_url(pg.store_server(store, request)):
        monkeypatch.setenv("REM_DB_URL", url)
        yield url


@pytest.fixture
async def ctx(
    data_dir: DataDir, chroma_url: str, collection: str, db_url: str | None
) -> AsyncIterator[Context]:
    """A writable Context over a fresh, migrated data dir, using the session Chroma server."""
    context = Context(data_dir, chroma_url=chroma_url, collection=collection, db_url=db_url)
    context._embedder = shared_embedder()  # loaded once per test process, as a daemon loads it once
    await context.db()
    yield context
    await context.close()
    drift = counter_drift(data_dir.state_db)
    assert not drift, f"status counters drifted from their rows: {drift}"


@pytest.fixture
async def db_ctx(data_dir: DataDir, db_url: str | None) -> AsyncIterator[Context]:
    """A writable Context over a fresh data dir with no Chroma at all."""
    context = Context(data_dir, start_chroma=False, db_url=db_url)
    context._embedder = shared_embedder()
    await context.db()
    yield context
    await context.close()
    # every write a test made through any path kept the triggers' counters equal to real counts
    drift = counter_drift(data_dir.state_db)
    assert not drift, f"status counters drifted from their rows: {drift}"


@pytest.fixture
def frozen_clock() -> Iterator[clock.FrozenClock]:
    frozen = clock.FrozenClock()
    clock.set_clock(frozen)
    yield frozen
    clock.set_clock(None)


@pytest.fixture
def fake_model(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeOpenAIServer]:
    """A scripted OpenAI-compatible server (tests/fake_openai.py) on a loopback port, in a
    thread, with the `REM_MODEL_*` settings pointing at it and short retry waits."""
    with FakeOpenAIServer(
        Scenario(reply="The ledger export stalled because the window closed early.")
    ) as server:
        monkeypatch.setenv("REM_MODEL_BASE_URL", server.base_url)
        monkeypatch.setenv("REM_MODEL", MODEL)
        monkeypatch.setenv("REM_MODEL_RETRY_MAX_MS", "2000")
        yield server


@pytest.fixture
def tools_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """rem's demo MCP server as the only tool source (`REM_MCP_CONFIG`), its files in the returned
    folder; tool-call arguments bounded at 1 KiB."""
    from backend.programs.demo_tools import server_config

    data = tmp_path / "tools"
    config = tmp_path / "mcp.json"
    config.write_text(json.dumps({"mcpServers": {"demo": server_config(data, effect_delay_ms=0)}}))
    monkeypatch.setenv("REM_MCP_CONFIG", str(config))
    monkeypatch.setenv("REM_TOOL_ARGUMENTS_MAX_BYTES", "1024")
    return data


@pytest.fixture(autouse=True)
def _isolate_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for name in (
        "REM_DATA",
        "REM_CHROMA_URL",
        "REM_DB_URL",
        "REM_FAULTS",
        "REM_CLOCK_SKEW_MS",
        "REM_OPERATOR",
        "REM_MODEL_API_KEY",
        "REM_SERVER",
        "REM_TOKEN_FILE",
    ):
        monkeypatch.delenv(name, raising=False)
    # this is a test run: the unsafe test switches (REM_FAULTS, REM_UNSAFE_DISABLE_FENCING) are
    # honoured here and in every rem process a test starts; production refuses them
    monkeypatch.setenv("REM_TEST_MODE", "1")
    faults.reset()
    health.take()  # model request records are per process: a test starts with none
    yield
    faults.reset()
    health.take()
    clock.set_clock(None)
