"""`rem demo`: a fresh data dir, `rem up --load` as a child process, and the console over it.

On exit (q in the console, SIGTERM, or an error) the demo stops everything it
started: SIGTERM to the supervisor (which drains its daemons and stops
Chroma), then SIGKILL to its process group if it has not exited in time.
The console itself is passed in by the CLI (`backend.cli.demo`): `backend` never imports `tui`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from backend.core import private, processes
from backend.core.datadir import DataDir
from backend.core.errors import ExitCode, RemError, UsageError
from backend.core.settings import Settings
from backend.runtime.context import Context, store_env

log = logging.getLogger("rem.demo")

READY_TIMEOUT_S = 90.0
# the demo's API token, in its data dir (0600): `curl -H "Authorization: Bearer $(cat DATA/api.token)"`
API_TOKEN_FILE = "api.token"
# the same token as a header line, for `curl -H @FILE` (the token stays out of argv, which `ps` shows)
AUTH_HEADER_FILE = "auth.header"
# the supervisor drains each daemon for up to 20 s, then stops Chroma
STOP_TIMEOUT_S = 35.0
ConsoleRunner = Callable[[DataDir], object]


class DemoFailed(RemError):
    """`rem up` did not come up (its log says why)."""


def note(message: str) -> None:
    """A line on stderr; a terminal that hung up (EIO) must not stop the clean-up that follows."""
    with contextlib.suppress(OSError, ValueError):
        sys.stderr.write(message + "\n")
        sys.stderr.flush()


def fresh_data_dir(data: str | os.PathLike[str] | None) -> tuple[Path, bool]:
    """The demo's data dir and whether the demo created it (a new temp dir by default)."""
    if data is None:
        return Path(tempfile.mkdtemp(prefix="rem-demo-")), True
    root = Path(data).expanduser().absolute()
    if root.exists() and any(root.iterdir()):
        raise UsageError(
            f"{root} is not empty; `rem demo` wants a fresh data dir (omit --data for a temporary one)"
        )
    private.make_private_dir(root)
    DataDir(root).check_usable()  # e.g. an empty folder of another user: refused before anything starts
    return root, False


def _parsed_model_url(model_url: str) -> str:
    """`--model-url` as REM_MODEL_BASE_URL parses it, or a UsageError with an example."""
    parser = Settings.model_base_url.parser
    try:
        return str(parser.parse(model_url.strip()))
    except ValueError:
        raise UsageError(
            f"--model-url {model_url!r} is not {parser.expects}, e.g. http://127.0.0.1:11434/v1"
        ) from None


def model_env(model_url: str | None, model: str | None, embedding_model: str | None = None) -> dict[str, str]:
    """The settings that make the demo's daemons answer with a real model endpoint (none: offline)."""
    if (model_url is None) != (model is None):
        raise UsageError("pass --model-url and --model together (the endpoint, and the model to ask there)")
    if embedding_model is not None and model_url is None:
        raise UsageError("--embedding-model needs --model-url and --model")
    if model_url is None or model is None:
        return {}
    env = {
        "REM_AGENT": "openai",
        "REM_SYNTHESIZER": "openai",
        Settings.model_base_url.env: _parsed_model_url(model_url),
        Settings.model.env: model,
    }
    if embedding_model is not None:
        env.update({"REM_EMBEDDER": "openai", Settings.embedding_model.env: embedding_model})
    return env


# outbox_send's delay in the demo: long enough to see the send run in Backlog, select it and `k` its
# executor by hand while it is in flight (2 s, then 5 s, ended `completed` when tried by hand)
DEMO_EFFECT_DELAY_MS = 8_000
TOOLS_CONFIG = "mcp.json"


def write_tools_config(
    root: Path, *, effect_permission: str = "ask", effect_delay_ms: int = DEMO_EFFECT_DELAY_MS
) -> Path:
    """The agent's tools for the demo (REM_MCP_CONFIG): rem's demo tools server over stdio on `root`.

    Notes are `allow` (idempotent: they run at once, and again with the same key after a crash);
    `outbox_send` is an effect and stays `ask`, so approvals wait in the console; approve one, and
    `k` on its `running` row in Backlog kills its executor during the send's delay: an unknown
    outcome to resolve (`o`). The drill
    passes `effect_permission="allow"` (nobody approves there).
    """
    from backend.programs.demo_tools import server_config  # import time: the MCP SDK, only with tools

    config = {
        "mcpServers": {"demo": server_config(root, effect_delay_ms=effect_delay_ms)},
        "rem": {
            "tools": {
                "demo.notes_add": {"permission": "allow"},
                "demo.notes_search": {"permission": "allow"},
                "demo.outbox_send": {"permission": effect_permission, "timeout_ms": effect_delay_ms * 6},
            }
        },
    }
    path = root / TOOLS_CONFIG
    private.write_private_text(path, json.dumps(config, indent=2))
    return path


def start_up(
    root: Path, extra: list[str] | None = None, env: dict[str, str] | None = None
) -> subprocess.Popen[bytes]:
    """Start `rem up --load` in its own process group, logging to DATA/logs/up.log."""
    # --no-reap: a daemon killed during the demo leaves its lease counting down in the
    # console (dead-worker marker, then expired in red) until it expires or the
    # operator releases it with `l`; the supervisor still restarts the daemon.
    args = ["up", "--load", "--no-reap", "--data", str(root), *(extra or [])]
    command = processes.rem_child(*args, cwd=root, env=env)
    with DataDir(root).open_log("up.log") as out:
        # PDEATHSIG: if the demo itself is SIGKILLed (or its terminal vanishes), `rem up`
        # gets SIGTERM and drains instead of running on as an orphan.
        return command.popen(
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=private.private_child_dying_with_parent,
        )


def free_port() -> int:
    """A loopback port free now, for the demo's API server (fixed from then on: it keeps it across restarts)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_serving(
    root: Path, url: str, proc: subprocess.Popen[bytes], timeout_s: float = READY_TIMEOUT_S
) -> None:
    """Block until the API server answers `/healthz` (it needs no token)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise DemoFailed(f"`rem up` exited with code {proc.returncode}: {log_tail(root)}")
        with contextlib.suppress(OSError):
            with urllib.request.urlopen(f"{url}/healthz", timeout=1) as answer:
                if answer.status == 200:
                    return
        time.sleep(0.2)
    raise DemoFailed(
        f"the API server at {url} did not answer within {timeout_s:.0f} s; see logs/server-1.log"
    )


def demo_token(root: Path, db_url: str | None) -> str:
    """A token of every project and scope for the demo's API, kept in DATA/api.token (private)."""
    from backend.ops.tokens import token_create  # import time: only once the demo is up

    async def create() -> str:
        async with Context(DataDir(root), db_url=db_url, start_chroma=False) as ctx:
            made = await token_create(ctx, "demo", all_projects=True, scopes=("read", "write", "decide"))
            return str(made["token"])

    token = asyncio.run(create())
    private.write_private_text(root / API_TOKEN_FILE, token + "\n")
    private.write_private_text(root / AUTH_HEADER_FILE, f"Authorization: Bearer {token}\n")
    return token


def announce_api(root: Path, url: str, proc: subprocess.Popen[bytes], db_url: str | None) -> None:
    """Once the demo's API server answers: its URL, and a token to use it (printed once, and kept)."""
    wait_serving(root, url, proc)
    token = demo_token(root, db_url)
    note(f"rem demo: the API is at {url} (OpenAPI: {url}/v1/openapi.json); a token of every scope:")
    note(f"rem demo:   {token}")
    note(
        f"rem demo:   (also in {root / API_TOKEN_FILE}) e.g. curl -H @{root / AUTH_HEADER_FILE} {url}/v1/sessions"
    )


def running_workers(root: Path) -> int:
    """How many workers have registered and are running (0 while state.db is being made)."""
    path = root / "state.db"
    if not path.is_file():
        return 0
    try:
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=1)
        try:
            return int(conn.execute("SELECT count(*) FROM worker WHERE state = 'running'").fetchone()[0])
        finally:
            conn.close()
    except sqlite3.Error:
        return 0


def log_tail(root: Path, lines: int = 5) -> str:
    with contextlib.suppress(OSError):
        text = (root / "logs" / "up.log").read_text(errors="replace").strip().splitlines()
        return " | ".join(text[-lines:])
    return "(no log)"


def wait_ready(
    root: Path, proc: subprocess.Popen[bytes], timeout_s: float = READY_TIMEOUT_S, settle_s: float = 15.0
) -> int:
    """Block until `rem up` is up (Chroma started, daemons spawned), then briefly for daemons.

    Fails fast, quoting its log, if `rem up` exits. Returns how many daemons
    have registered (the console shows the rest arriving live).
    """
    deadline = time.monotonic() + timeout_s
    settle: float | None = None
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise DemoFailed(f"`rem up` exited with code {proc.returncode}: {log_tail(root)}")
        count = running_workers(root)
        if settle is None and (root / "up.json").is_file() and (root / "state.db").is_file():
            settle = time.monotonic() + settle_s
        if settle is not None and (count > 0 or time.monotonic() > settle):
            return count
        time.sleep(0.2)
    raise DemoFailed(f"`rem up` did not start within {timeout_s:.0f} s; see {root}/logs/up.log")


def stop(proc: subprocess.Popen[bytes], timeout_s: float = STOP_TIMEOUT_S) -> str:
    """SIGTERM the supervisor (it drains everything), SIGKILL its group after `timeout_s`."""
    if proc.poll() is not None:
        return f"already exited ({proc.returncode})"
    with contextlib.suppress(ProcessLookupError):
        proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout_s)
        return "drained and stopped"
    except subprocess.TimeoutExpired:
        # the group is the one start_up created for the supervisor and its children
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(5)
        return f"killed after {timeout_s:.0f} s"


class DemoInterrupted(RemError):
    """SIGTERM or SIGHUP before the console was open."""

    exit_code = ExitCode.INTERRUPTED


def set_signal_handlers(handler: Any) -> dict[int, Any]:
    """Install `handler` for SIGTERM and SIGHUP; returns the previous ones (main thread only)."""
    previous: dict[int, Any] = {}
    for sig in (signal.SIGTERM, signal.SIGHUP):
        with contextlib.suppress(ValueError):  # not the main thread: leave signals alone
            previous[sig] = signal.signal(sig, handler)
    return previous


def restore_signal_handlers(previous: dict[int, Any]) -> None:
    for sig, handler in previous.items():
        signal.signal(sig, handler)


def _interrupted(signum: int, _frame: Any) -> None:
    raise DemoInterrupted(
        f"{signal.Signals(signum).name} before the console opened; everything the demo started was stopped"
    )


def run_demo(
    data: str | os.PathLike[str] | None = None,
    *,
    keep: bool = False,
    console: ConsoleRunner,
    up_args: list[str] | None = None,
    model: dict[str, str] | None = None,
    db_url: str | None = None,
) -> int:
    """The whole demo; returns the exit code. Everything started here is stopped here.

    `model` (from `model_env`) makes the daemons answer with a real endpoint; `db_url` puts the
    state store on PostgreSQL (`rem --db URL demo`), passed to `rem up` in its environment.
    """
    root, created = fresh_data_dir(data)
    note(f"rem demo: data dir {root}")
    note(
        "rem demo: starting `rem up --load --serve` (Chroma server, 2 executors, a summarizer, a Dream "
        f"daemon, an API server, synthetic sessions); log in {root}/logs/up.log"
    )
    if model:
        note(
            f"rem demo: replies and summaries from {model[Settings.model.env]} at "
            f"{model[Settings.model_base_url.env]} (the API key from REM_MODEL_API_KEY_FILE or "
            "REM_MODEL_API_KEY, if it needs one); the console's header shows the endpoint's health"
        )
    tools = write_tools_config(root)
    note(
        f"rem demo: agent tools from {tools} (notes run at once; outbox_send waits for approval: "
        "a in the console's Backlog approves, n denies; k on its running row kills its executor)"
    )
    previous = set_signal_handlers(_interrupted)
    env = {**(model or {}), **store_env(db_url), Settings.mcp_config.env: str(tools)}
    url = f"http://127.0.0.1:{free_port()}"
    proc = start_up(root, [*(up_args or []), "--serve", url.removeprefix("http://")], env)
    try:
        count = wait_ready(root, proc)
        announce_api(root, url, proc, db_url)
        note(
            f"rem demo: up, {count} daemon(s) registered so far; opening the console "
            "(q quits, ? lists every key)"
        )
        console(DataDir(root))
    finally:
        # the clean-up is bounded (stop() SIGKILLs after STOP_TIMEOUT_S): a second
        # SIGTERM, or the SIGHUP of a closing terminal, must not cut it short
        set_signal_handlers(signal.SIG_IGN)
        try:
            note(f"rem demo: stopping `rem up` (pid {proc.pid}): {stop(proc)}")
            if created and not keep:
                shutil.rmtree(root, ignore_errors=True)
                note(f"rem demo: removed {root} (pass --keep to keep it)")
            else:
                note(f"rem demo: data kept in {root}; reopen with `rem console --data {root}`")
        finally:
            restore_signal_handlers(previous)
    return 0
