"""`rem serve` as a process: it binds loopback, registers as a worker, answers /healthz with no token,
refuses a request without a live token with 401 and the RFC 9728 challenge, and SIGTERM stops it as a
drain does (the worker row says stopped)."""

from __future__ import annotations

import json
import re
import signal
import subprocess
from pathlib import Path

import httpx

from tests.helpers import REM, rem_env, run_rem, wait_until


def _serve(data: Path, log: Path) -> tuple[subprocess.Popen[bytes], str]:
    proc = subprocess.Popen(
        [REM, "--data", str(data), "serve", "--listen", "127.0.0.1:0"],
        stdout=subprocess.DEVNULL,
        stderr=open(log, "wb"),
        env=rem_env(),
        start_new_session=True,
    )
    found = wait_until(
        lambda: re.search(r"serving (http://127\.0\.0\.1:\d+)", log.read_text()), message="the serving line"
    )
    return proc, found.group(1)


def test_serve_answers_health_refuses_without_a_token_and_stops_on_sigterm(tmp_path: Path) -> None:
    data = tmp_path / "data"
    assert run_rem("--data", str(data), "init").returncode == 0
    token = run_rem("--data", str(data), "token", "create", "t", "--all-projects").stdout.strip()
    proc, url = _serve(data, tmp_path / "serve.log")
    try:
        assert httpx.get(f"{url}/healthz").json() == {"ok": True}
        refused = httpx.get(f"{url}/readyz")
        assert refused.status_code == 401
        assert refused.headers["www-authenticate"] == (
            f'Bearer realm="rem", resource_metadata="{url}/.well-known/oauth-protected-resource"'
        )
        assert refused.json()["error"]["code"] == "unauthorized"
        wrong = httpx.get(f"{url}/readyz", headers={"Authorization": f"Bearer {token}x"})
        assert wrong.status_code == 401 and token not in wrong.text
        assert httpx.get(f"{url}/readyz", headers={"Authorization": f"Bearer {token}"}).json() == {"ok": True}
        status = json.loads(run_rem("--data", str(data), "status", "--json").stdout)
        (server,) = [w for w in status["workers"] if w["role"] == "server"]
        assert server["state"] == "running" and server["pid"] == proc.pid
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    status = json.loads(run_rem("--data", str(data), "status", "--json").stdout)
    assert [w["state"] for w in status["workers"] if w["role"] == "server"] == ["stopped"]


def test_serve_refuses_a_remote_address_without_the_flag(tmp_path: Path) -> None:
    refused = run_rem("--data", str(tmp_path / "d"), "serve", "--listen", "0.0.0.0:8765")
    assert refused.returncode == 2
    assert "--allow-remote" in refused.stderr and "TLS" in refused.stderr
