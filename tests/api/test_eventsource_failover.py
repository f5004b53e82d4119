"""A WHATWG EventSource (npm `eventsource`, its own parser and reconnection) follows a session
through a load balancer while the `rem serve` replica it reads is SIGKILLed mid-turn and a second
replica takes over: it gets every event exactly once, and the list equals a fresh read from the
start. The turn it was watching runs on (a server holds no turn), and so does the next one."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import threading
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.api.node import eventsource_module, node
from tests.api.proxy import Proxy
from tests.api.serving import collect, sse_blocks
from tests.helpers import REM, rem_env, run_rem, spawn_rem, wait_until

TYPES = (
    "input.admitted,input.promoted,turn.started,turn.recovered,part,message.completed,turn.completed,reset"
)
SCRIPT = Path(__file__).with_name("eventsource_follow.mjs")


def _serve(data: Path, log: Path, env: dict[str, str]) -> tuple[subprocess.Popen[bytes], str]:
    proc = subprocess.Popen(
        [REM, "--data", str(data), "serve", "--listen", "127.0.0.1:0"],
        stdout=subprocess.DEVNULL,
        stderr=open(log, "wb"),
        env=env,
        start_new_session=True,
    )
    found = wait_until(
        lambda: re.search(r"serving (http://127\.0\.0\.1:\d+)", log.read_text()), message="serving"
    )
    return proc, found.group(1)


def _follow(
    url: str, token: str, module: Path, log: Path
) -> tuple[subprocess.Popen[str], list[dict[str, Any]]]:
    env = {**os.environ, "REM_EVENTSOURCE_MODULE": module.as_uri(), "REM_TEST_TOKEN": token}
    proc = subprocess.Popen(
        [node(), str(SCRIPT), url, TYPES, "turn.completed", "2"],
        stdout=subprocess.PIPE,
        stderr=open(log, "w"),
        env=env,
        text=True,
        start_new_session=True,
    )
    seen: list[dict[str, Any]] = []

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            seen.append(json.loads(line))

    threading.Thread(target=read, daemon=True).start()
    return proc, seen


def _kinds(seen: list[dict[str, Any]]) -> list[str]:
    return [e["type"] for e in list(seen)]


@pytest.mark.both_stores
async def test_an_eventsource_follows_a_session_across_a_sigkilled_replica(
    tmp_path: Path, store: str, db_url: str | None
) -> None:
    module = eventsource_module()
    data = tmp_path / "data"
    env = rem_env(REM_AGENT_DELAY_MS="400", REM_CHROMA_AUTOSTART="0")
    assert run_rem("--data", str(data), "init", env=env).returncode == 0
    token = run_rem("--data", str(data), "token", "create", "web", "--all-projects", env=env).stdout.strip()
    send = ("--data", str(data), "send", "s1")
    assert run_rem(*send, "What is the export format of the nightly report?", env=env).returncode == 0
    procs: list[subprocess.Popen[Any]] = []
    proxy: Proxy | None = None
    try:
        (a, a_url), (b, b_url) = (_serve(data, tmp_path / f"{n}.log", env) for n in "ab")
        procs += [a, b]
        proxy = Proxy(("127.0.0.1", int(a_url.rsplit(":", 1)[1])))
        client, seen = _follow(f"{proxy.url}/v1/sessions/s1/events", token, module, tmp_path / "client.log")
        procs.append(client)
        procs.append(
            spawn_rem("daemon", "--role", "executor", "--data", str(data), env=env, log=tmp_path / "x.log")
        )
        wait_until(lambda: "part" in _kinds(seen), message="the first streamed part")
        proxy.target = ("127.0.0.1", int(b_url.rsplit(":", 1)[1]))  # new connections reach replica b
        os.kill(a.pid, signal.SIGKILL)
        at_kill = _kinds(seen)
        assert "turn.completed" not in at_kill  # mid-turn
        a.wait(timeout=10)
        assert run_rem(*send, "And which timezone does it use?", env=env).returncode == 0
        assert client.wait(timeout=90) == 0, (tmp_path / "client.log").read_text()
        assert _kinds(seen).count("turn.completed") == 2
        assert len(seen) > len(at_kill) + 2  # the rest of the first turn came through replica b
        log = (tmp_path / "client.log").read_text()
        assert log.count("open") >= 2 and "error" in log  # it lost its stream and reconnected
        ids = [e["id"] for e in seen]
        assert len(set(ids)) == len(ids) and all(ids)
        async with (
            httpx.AsyncClient(base_url=b_url, headers={"Authorization": f"Bearer {token}"}) as http,
            http.stream("GET", "/v1/sessions/s1/events") as response,
        ):
            fresh = [blk for blk in await collect(sse_blocks(response), count=len(seen)) if blk.data]
        assert [{"id": f.id, "type": f.event, "data": f.json()} for f in fresh] == seen
    finally:
        if proxy is not None:
            proxy.close()
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
                proc.wait(timeout=30)
