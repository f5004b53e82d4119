"""`rem send --server --follow` prints the reply as it streams, and survives its server going away
mid-reply: a real `rem serve` behind a load balancer (tests/api/proxy.py) is stopped while the reply
streams (SIGTERM, a drain, on SQLite; SIGKILL on PostgreSQL), another `rem serve` on the same store
answers (started after the stop on SQLite; already serving on PostgreSQL), and the follower resumes
from its cursor there: the whole reply is printed once, no part doubled or lost."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import threading
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.api.conftest import start_serve
from tests.api.proxy import Proxy
from tests.helpers import REM, rem_env, run_rem, spawn_rem, wait_until

QUESTION = "What is the export format of the nightly report, and which timezone does it use?"


def _token_file(data: Path, root: Path, env: dict[str, str]) -> Path:
    made = run_rem(
        "--data",
        str(data),
        "token",
        "create",
        "cli",
        "--all-projects",
        "--scope",
        "read",
        "--scope",
        "write",
        env=env,
    )
    assert made.returncode == 0, made.stderr
    path = root / "token"
    path.write_text(made.stdout)
    path.chmod(0o600)
    return path


def _follow(url: str, token: Path, log: Path) -> tuple[subprocess.Popen[bytes], bytearray]:
    """`rem send --server URL --follow` in the background; what it prints, as it prints it."""
    proc = subprocess.Popen(
        [REM, "send", "s1", QUESTION, "--id", "q1", "--server", url, "--follow"],
        stdout=subprocess.PIPE,
        stderr=open(log, "wb"),
        env=rem_env(REM_TOKEN_FILE=str(token)),
        start_new_session=True,
    )
    printed = bytearray()

    def read() -> None:
        assert proc.stdout is not None
        while chunk := proc.stdout.read1(4096):
            printed.extend(chunk)

    threading.Thread(target=read, daemon=True).start()
    return proc, printed


def _port(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


@pytest.mark.both_stores
def test_send_follow_prints_the_whole_reply_once_across_a_server_going_away(
    tmp_path: Path, store: str, db_url: str | None
) -> None:
    data = tmp_path / "data"
    env = rem_env(REM_AGENT_DELAY_MS="400", REM_CHROMA_AUTOSTART="0", REM_MEMORY_CONTEXT_ITEMS="0")
    assert run_rem("--data", str(data), "init", env=env).returncode == 0
    token = _token_file(data, tmp_path, env)
    procs: list[subprocess.Popen[Any]] = []
    proxy: Proxy | None = None
    try:
        a, a_url = start_serve(data, env, tmp_path / "a.log")
        procs.append(a)
        second = None
        if store == "postgres":  # a second replica already serves the same database
            second = start_serve(data, env, tmp_path / "b.log")
            procs.append(second[0])
        proxy = Proxy(("127.0.0.1", _port(a_url)))
        procs.append(
            spawn_rem(
                "--data", str(data), "daemon", "--role", "executor", env=env, log=tmp_path / "executor.log"
            )
        )
        client, printed = _follow(proxy.url, token, tmp_path / "client.log")
        procs.append(client)
        wait_until(lambda: len(printed) > 0, timeout=60, message="the reply's first part printed")
        a.send_signal(signal.SIGKILL if store == "postgres" else signal.SIGTERM)
        at_stop = bytes(printed)
        assert a.wait(timeout=30) is not None
        if second is None:  # the same store served again, by a new process
            second = start_serve(data, env, tmp_path / "b.log")
            procs.append(second[0])
        proxy.target = ("127.0.0.1", _port(second[1]))
        assert client.wait(timeout=120) == 0, (tmp_path / "client.log").read_text()
        with httpx.Client(
            base_url=second[1], headers={"Authorization": f"Bearer {token.read_text().strip()}"}
        ) as api:
            answer = api.get("/v1/inputs/q1").json()
            events = _session_events(api)
    finally:
        if proxy is not None:
            proxy.close()
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
                proc.wait(timeout=30)
    reply = answer["reply"]["text"]
    assert answer["state"] == "answered" and reply
    assert printed.decode() == reply + "\n"  # every part once, in order, and nothing else on stdout
    parts = [e["text"] for e in events if e.get("message_id") == answer["reply"]["message_id"]]
    assert "".join(parts) == reply and len(parts) > 2
    assert 0 < len(at_stop) < len(reply)  # the server went away mid-reply
    log = (tmp_path / "client.log").read_text()
    assert "rem: admitted q1 into session s1" in log
    assert re.search(
        r"rem: lost the event stream from http://127\.0\.0\.1:\d+ \(.+\); resuming from its cursor", log
    ), log


def _session_events(api: httpx.Client) -> list[dict[str, Any]]:
    """The session's `part` events, read fresh from its first event up to its turn's completion."""
    import json

    found: list[dict[str, Any]] = []
    with api.stream("GET", "/v1/sessions/s1/events", timeout=30) as response:
        kind = ""
        for line in response.iter_lines():
            if line.startswith("event: "):
                kind = line[7:]
            elif line.startswith("data: ") and kind == "part":
                found.append(json.loads(line[6:]))
            elif line.startswith("data: ") and kind == "turn.completed":
                return found
    return found
