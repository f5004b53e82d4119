"""`rem up --serve [HOST:PORT]`: the supervisor runs one API server as a child, restarts it on the same
address after a SIGKILL (the worker row says the dead one exited), and drains it with the rest."""

from __future__ import annotations

import json
import os
import signal
import socket
from pathlib import Path

import httpx
import pytest

from backend.api.listen import DEFAULT_LISTEN
from backend.chroma.server import ChromaServer
from backend.cli.app import serve_default
from tests.helpers import rem_env, rem_json, run_rem, spawn_rem, wait_until


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _answers(url: str) -> bool:
    try:
        return httpx.get(f"{url}/healthz", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


def _server_pid(data: Path) -> int | None:
    manifest = json.loads((data / "up.json").read_text())
    (child,) = [c for c in manifest["children"] if c["role"] == "server"]
    return child["pid"]  # type: ignore[no-any-return]


def test_rem_up_serve_runs_an_api_server_restarts_it_and_drains_it(
    tmp_path: Path, chroma: ChromaServer
) -> None:
    data, url = tmp_path / "data", f"http://127.0.0.1:{_free_port()}"
    env = rem_env(REM_CHROMA_URL=chroma.url)
    up = spawn_rem(
        "up", "--data", str(data), "--executors", "0", "--summarizers", "0", "--dreams", "0",
        "--serve", url.removeprefix("http://"), env=env, log=tmp_path / "up.log",
    )  # fmt: skip
    try:
        wait_until(lambda: _answers(url), timeout=60, message=f"the API server at {url}")
        first = _server_pid(data)
        assert first is not None
        os.kill(first, signal.SIGKILL)
        wait_until(
            lambda: _server_pid(data) not in (None, first) and _answers(url),
            timeout=60,
            message="the supervisor to restart the API server on its address",
        )
        servers = [
            w for w in rem_json("status", "--data", str(data), env=env)["workers"] if w["role"] == "server"
        ]
        assert sorted(w["alive"] for w in servers) == [False, True]  # the killed one, seen dead at once
    finally:
        up.send_signal(signal.SIGTERM)
        assert up.wait(60) == 0
    states = [
        w["state"]
        for w in rem_json("status", "--data", str(data), env=env)["workers"]
        if w["role"] == "server"
    ]
    assert "running" not in states and not _answers(url)


def test_a_bare_serve_means_the_default_address_and_a_remote_one_needs_the_flag(tmp_path: Path) -> None:
    assert serve_default(["up", "--serve"]) == ["up", "--serve", DEFAULT_LISTEN]
    assert serve_default(["--data", "d", "up", "--serve", "--executors", "1"]) == [
        "--data", "d", "up", "--serve", DEFAULT_LISTEN, "--executors", "1",
    ]  # fmt: skip
    assert serve_default(["up", "--serve", "127.0.0.1:9"]) == ["up", "--serve", "127.0.0.1:9"]
    assert serve_default(["send", "--serve"]) == ["send", "--serve"]
    refused = run_rem("up", "--data", str(tmp_path / "d"), "--serve", "0.0.0.0:8765")
    assert refused.returncode == 2 and "--allow-remote" in refused.stderr
    assert not (tmp_path / "d").exists()  # refused before anything started


@pytest.mark.parametrize("value", ["nonsense", "127.0.0.1:99999"])
def test_a_malformed_serve_address_is_refused_in_one_line(tmp_path: Path, value: str) -> None:
    refused = run_rem("up", "--data", str(tmp_path / "d"), "--serve", value)
    assert refused.returncode == 2 and refused.stderr.startswith("rem: error: ")
    assert len(refused.stderr.strip().splitlines()) == 1
