"""`rem demo`: it starts `rem up --load`, opens the console, and stops everything it started."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from backend.core.datadir import DataDir
from backend.programs.demo import model_env as demo_model_env
from backend.programs.demo import run_demo, stop
from tests.helpers import rem_json, run_rem, wait_until


def pid_alive(pid: int | None) -> bool:
    if pid is None:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie still answers kill(0); it is gone for our purposes once it is not running
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except OSError:
        return False


def test_demo_runs_rem_up_for_the_console_and_stops_it_all_on_exit(capfd: pytest.CaptureFixture[str]) -> None:
    seen: dict[str, Any] = {}

    def console(data: DataDir) -> None:
        # what the console would see while the demo runs
        manifest = json.loads((data.root / "up.json").read_text())
        seen.update(root=data.root, supervisor=manifest["pid"], chroma=manifest["chroma"]["pid"])
        assert pid_alive(seen["supervisor"]) and pid_alive(seen["chroma"])
        seen["status"] = rem_json("status", "--data", str(data.root))
        seen["reap"] = manifest["reap"]
        # its API server, with the token it printed
        (server,) = seen["status"]["api"]["servers"]
        token = (data.root / "api.token").read_text().strip()
        header = data.root / "auth.header"  # for `curl -H @FILE`: the token out of argv
        assert header.read_text() == f"Authorization: Bearer {token}\n" and header.stat().st_mode & 0o077 == 0
        seen["url"], seen["token"], seen["header"] = server["url"], token, header
        seen["sessions"] = httpx.get(
            f"{server['url']}/v1/sessions", headers={"Authorization": f"Bearer {token}"}
        )

    assert (
        run_demo(None, console=console, up_args=["--executors", "0", "--summarizers", "0", "--dreams", "0"])
        == 0
    )
    assert seen["status"]["chroma"]["healthy"] is True
    assert seen["sessions"].status_code == 200 and "sessions" in seen["sessions"].json()
    assert "server" in {w["role"] for w in seen["status"]["workers"]}
    printed = capfd.readouterr().err
    assert f"the API is at {seen['url']}" in printed and seen["token"] in printed
    assert f"curl -H @{seen['header']} {seen['url']}/v1/sessions" in printed
    assert seen["reap"] is False  # a killed daemon's lease stays visible in the demo
    wait_until(
        lambda: not pid_alive(seen["supervisor"]) and not pid_alive(seen["chroma"]),
        timeout=40,
        message="rem up and its Chroma server to exit",
    )
    assert not Path(seen["root"]).exists()  # a temp demo dir is removed unless --keep


def test_stop_kills_the_group_of_a_supervisor_that_ignores_sigterm() -> None:
    code = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ok', flush=True); time.sleep(60)"
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, start_new_session=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == b"ok"
    assert stop(proc, timeout_s=0.5) == "killed after 0 s"
    assert proc.returncode is not None and proc.returncode < 0


def test_demo_refuses_a_data_dir_that_is_not_empty(tmp_path: Path) -> None:
    (tmp_path / "junk").write_text("x")
    proc = run_rem("demo", "--data", str(tmp_path))
    assert proc.returncode == 2
    assert proc.stderr.startswith("rem: error: ") and "not empty" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_console_refuses_a_data_dir_without_state_db(tmp_path: Path) -> None:
    proc = run_rem("console", "--data", str(tmp_path / "nothing"))
    assert proc.returncode == 2
    assert "state.db missing" in proc.stderr and "rem init" in proc.stderr
    assert not (tmp_path / "nothing").exists()  # writes nothing


DEMO_THAT_WAITS = """
import json, sys, time
from backend.programs.demo import run_demo
def console(data):
    manifest = json.loads((data.root / "up.json").read_text())
    print(json.dumps({"supervisor": manifest["pid"], "chroma": manifest["chroma"]["pid"],
                      "root": str(data.root)}), flush=True)
    time.sleep(120)
run_demo(None, console=console, up_args=["--executors", "0", "--summarizers", "0", "--dreams", "0"])
"""


def test_a_sigkilled_demo_takes_rem_up_and_chroma_down_with_it() -> None:
    demo = subprocess.Popen(
        [sys.executable, "-c", DEMO_THAT_WAITS], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL
    )
    seen: dict[str, Any] = {}
    try:
        assert demo.stdout is not None
        line = demo.stdout.readline()
        assert line, "the demo never reached its console"
        seen = json.loads(line)
        assert pid_alive(seen["supervisor"]) and pid_alive(seen["chroma"])
        demo.kill()  # SIGKILL: no finally runs in the demo
        demo.wait(5)
        wait_until(
            lambda: not pid_alive(seen["supervisor"]) and not pid_alive(seen["chroma"]),
            timeout=40,
            message="the orphaned rem up and its Chroma server to exit",
        )
    finally:
        if demo.poll() is None:
            demo.kill()
        if seen:
            if pid_alive(seen["supervisor"]):  # the test failed: do not leak what it started
                os.kill(seen["supervisor"], signal.SIGTERM)
                wait_until(
                    lambda: not pid_alive(seen["supervisor"]),
                    timeout=40,
                    message="the leaked rem up to drain",
                )
            shutil.rmtree(seen["root"], ignore_errors=True)


def test_a_hangup_before_the_console_still_stops_rem_up_and_removes_the_dir() -> None:
    # SIGHUP while waiting for `rem up` (before the console): `rem demo` stops it, removes its
    # dir, and says so in one line with exit 130 (not a traceback, not an orphan)
    code = (
        "import os, signal, threading\n"
        "from backend.programs import demo\n"
        "real_wait = demo.wait_ready\n"
        "def wait_ready(root, proc, *a, **k):\n"
        "    print(root, flush=True)\n"
        "    os.kill(os.getpid(), signal.SIGHUP)\n"
        "    return real_wait(root, proc, *a, **k)\n"
        "demo.wait_ready = wait_ready\n"
        "real_start = demo.start_up\n"
        "demo.start_up = lambda root, extra=None, env=None: real_start(\n"
        "    root, ['--executors', '0', '--summarizers', '0', '--dreams', '0'], env)\n"
        "import sys\n"
        "sys.argv = ['rem', 'demo']\n"
        "from backend.cli.app import main\n"
        "main()\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    root = Path(proc.stdout.strip().splitlines()[0])
    assert proc.returncode == 130, proc.stderr
    assert "SIGHUP before the console opened" in proc.stderr and "Traceback" not in proc.stderr
    assert "stopping `rem up`" in proc.stderr and "removed" in proc.stderr
    assert not root.exists()


def test_demo_with_a_model_url_answers_with_that_endpoint() -> None:
    from tests.fake_openai import FakeOpenAIServer, Scenario

    reply = "The export stalled because the pool was recycled mid-window."
    seen: dict[str, Any] = {}
    with FakeOpenAIServer(Scenario(reply=reply, tokens_per_second=200)) as server:
        model = demo_model_env(server.base_url, "gpt-4o-mini")

        def console(data: DataDir) -> None:
            def answered() -> Any:
                status = rem_json("status", "--data", str(data.root))
                return status if status["usage"]["total"]["sessions"] else None

            seen["status"] = wait_until(answered, timeout=90, message="a reply from the endpoint")

        assert (
            run_demo(
                None,
                console=console,
                up_args=["--executors", "1", "--summarizers", "0", "--dreams", "0"],
                model=model,
            )
            == 0
        )
        assert server.requests() and server.requests()[0].path == "/v1/chat/completions"
    status = seen["status"]
    assert status["model"]["state"] in ("ok", "degraded") and status["model"]["models"] == ["gpt-4o-mini"]
    assert status["usage"]["total"]["tokens"]["output"] > 0


def test_demo_model_options_go_together() -> None:
    proc = run_rem("demo", "--model-url", "http://127.0.0.1:1/v1")
    assert proc.returncode == 2 and "--model-url and --model together" in proc.stderr
    proc = run_rem("demo", "--model-url", "ftp://x", "--model", "m")
    assert proc.returncode == 2 and "is not an http:// or https:// URL" in proc.stderr
