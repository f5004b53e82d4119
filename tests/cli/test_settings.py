"""One settings module: every REM_* variable declared once, validated the same way, documented in the docs
(docs/configuration.md, generated from it: tests/docs/test_generated.py keeps them equal)."""

from __future__ import annotations

import dataclasses
import re
import socket
from pathlib import Path

import pytest

from backend.core import settings as settings_module
from backend.core.plugins import PluginError, installed, load_plugin
from backend.core.settings import SettingsError, declared, settings, validate
from backend.execution.agent import OfflineResponder
from backend.models.config import ModelConfig, ModelConfigError
from backend.store import workers
from tests.helpers import rem_env, run_rem

ROOT = Path(__file__).resolve().parents[2]
# read outside the settings module on purpose: the test harness's own switches
NOT_SETTINGS = {"REM_BENCH_T0"}


def test_every_rem_variable_the_code_names_is_declared_once() -> None:
    source = "\n".join(p.read_text() for p in (ROOT / "backend").rglob("*.py"))
    named = set(re.findall(r"\bREM_[A-Z0-9_]+\b", source)) - NOT_SETTINGS
    envs = [s.env for s in declared()]
    assert len(envs) == len(set(envs))
    assert named <= set(envs), named - set(envs)


def test_only_the_settings_module_reads_rem_variables_from_the_environment() -> None:
    for path in (ROOT / "backend").rglob("*.py"):
        if path.name == "settings.py":
            continue
        assert not re.search(r"environ(\.get)?\(\s*[\"']REM_|getenv\(\s*[\"']REM_", path.read_text()), path


def _bad_value(setting: settings_module.Setting) -> str | None:  # type: ignore[type-arg]
    expects = setting.parser.expects
    return (
        "twelve"
        if expects.startswith("a whole number")
        else "maybe"
        if expects.startswith("1 or 0")
        else "two words"
        if expects.startswith("a host name")
        else None
    )


@pytest.mark.parametrize("setting", [s for s in declared() if _bad_value(s)], ids=lambda s: s.env)
def test_a_bad_value_is_one_clear_error_naming_the_variable_and_the_fix(
    setting: settings_module.Setting,
) -> None:  # type: ignore[type-arg]
    bad = _bad_value(setting)
    with pytest.raises(SettingsError) as caught:
        validate({setting.env: bad})
    message = str(caught.value)
    assert message.startswith(f"{setting.env}={bad!r} is not ") and "fix it or unset it" in message


def test_bounds_are_checked_and_every_problem_is_named_at_once() -> None:
    with pytest.raises(SettingsError) as caught:
        validate({"REM_EXECUTOR_CONCURRENCY": "0", "REM_RECOVERY_BUDGET": "x"})
    assert "REM_EXECUTOR_CONCURRENCY='0' is not a whole number, at least 1" in str(caught.value)
    assert "REM_RECOVERY_BUDGET='x'" in str(caught.value)
    validate({"REM_EXECUTOR_CONCURRENCY": " 3 "})  # surrounding blanks are forgiven


def test_a_model_url_with_credentials_is_refused_in_one_line_without_its_password(tmp_path: Path) -> None:
    env = rem_env(REM_MODEL_BASE_URL="https://me:hunter22@llm.example/v1")
    proc = run_rem("status", "--data", str(tmp_path / "d"), env=env)
    assert proc.returncode == 2 and proc.stdout == ""
    (line,) = proc.stderr.splitlines()
    assert line.startswith("rem: error: REM_MODEL_BASE_URL='https://me:***@llm.example/v1' is not ")
    assert "without credentials" in line and "REM_MODEL_API_KEY_FILE" in line and "hunter22" not in line
    # a config built another way (a plug-in, a test) is refused when it is made, not at each request
    with pytest.raises(ModelConfigError, match="carries credentials") as caught:
        dataclasses.replace(ModelConfig.from_settings(), base_url="https://me:hunter22@llm.example/v1")
    assert "hunter22" not in str(caught.value)


def test_the_host_identity_is_rem_host_else_the_machines_name(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("REM_HOST", raising=False)
    assert workers.host_name() == socket.gethostname()
    monkeypatch.setenv("REM_HOST", "rack-2.example")
    assert workers.host_name() == "rack-2.example"
    assert workers.new_owner_id(workers.WorkerRole.EXECUTOR).startswith("executor-rack-2.example-")
    for bad in ("-lead", "a/b", "x" * 64):
        with pytest.raises(SettingsError, match="REM_HOST="):
            validate({"REM_HOST": bad})


def test_settings_follow_the_environment_at_the_moment_they_are_read(monkeypatch: pytest.MonkeyPatch) -> None:
    assert settings.executor_concurrency == 8
    monkeypatch.setenv("REM_EXECUTOR_CONCURRENCY", "3")
    assert settings.executor_concurrency == 3
    monkeypatch.setenv("REM_EXECUTOR_CONCURRENCY", "")
    assert settings.executor_concurrency == 8  # blank is unset
    monkeypatch.setenv("REM_CHROMA_AUTOSTART", "no")
    assert settings.chroma_autostart is False


def test_any_command_refuses_a_bad_value_at_start_up_in_one_line(tmp_path: Path) -> None:
    proc = run_rem("status", "--data", str(tmp_path / "d"), env=rem_env(REM_EXECUTION_LEASE_MS="30s"))
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "rem: error: REM_EXECUTION_LEASE_MS='30s' is not a whole number of ms, at least 100; "
        "fix it or unset it (default: 30000)"
    ]
    assert not (tmp_path / "d").exists()


def test_plugins_load_by_entry_point_name_or_module_factory() -> None:
    assert "offline" in installed("rem.agents")
    assert isinstance(load_plugin("rem.agents", "offline", "REM_AGENT"), OfflineResponder)
    assert isinstance(
        load_plugin("rem.agents", "backend.execution.agent:OfflineResponder", "REM_AGENT"), OfflineResponder
    )
    with pytest.raises(PluginError, match=r"no plug-in of that name in rem.agents \(installed: .*offline"):
        load_plugin("rem.agents", "nosuch", "REM_AGENT")
    with pytest.raises(PluginError, match="cannot be loaded .*ModuleNotFoundError"):
        load_plugin("rem.agents", "no.such.module:make", "REM_AGENT")


@pytest.mark.parametrize("variable", ["REM_EMBEDDER", "REM_SYNTHESIZER"])
def test_a_bad_plugin_is_one_line_not_a_traceback(tmp_path: Path, variable: str) -> None:
    data = tmp_path / "d"
    assert run_rem("init", "--data", str(data)).returncode == 0
    env = rem_env(**{variable: "no.such:thing", "REM_CHROMA_AUTOSTART": "0"})
    role = "summarizer"
    proc = run_rem("daemon", "--role", role, "--once", "--data", str(data), env=env)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    assert f"{variable}='no.such:thing' cannot be loaded" in proc.stderr


@pytest.mark.parametrize(
    ("variable", "value", "role", "needle"),
    [
        ("REM_SYNTHESIZER", "nope", "summarizer", "no plug-in of that name in rem.synthesizers"),
        ("REM_SYNTHESIZER", "os:nothing", "summarizer", "AttributeError"),
        ("REM_EMBEDDER", "nope", "summarizer", "no plug-in of that name in rem.embedders"),
        ("REM_EMBEDDER", "json:loads", "summarizer", "failed to start (TypeError"),
        ("REM_AGENT", "no.such.module:make", "executor", "ModuleNotFoundError"),
    ],
)
def test_a_bad_plug_in_is_one_line_not_a_traceback(
    tmp_path: Path, variable: str, value: str, role: str, needle: str
) -> None:
    data = tmp_path / "d"
    assert run_rem("send", "s1", "hello", "--data", str(data)).returncode == 0
    env = rem_env(**{variable: value, "REM_CHROMA_AUTOSTART": "0"})
    proc = run_rem("daemon", "--role", role, "--once", "--data", str(data), env=env, timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith(f"rem: error: {variable}={value!r}") and needle in proc.stderr
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr


@pytest.mark.parametrize(
    ("variable", "value"), [("REM_FAULTS", "dream.mid_graph@999"), ("REM_UNSAFE_DISABLE_FENCING", "1")]
)
def test_unsafe_switches_are_refused_unless_the_test_marker_is_set(
    tmp_path: Path, variable: str, value: str
) -> None:
    data = str(tmp_path / "d")
    production = rem_env(**{variable: value})
    production.pop("REM_TEST_MODE", None)
    proc = run_rem("init", "--data", data, env=production)
    assert proc.returncode == 2 and not (tmp_path / "d").exists()
    assert (
        proc.stderr.startswith(f"rem: error: {variable} is a test-only switch")
        and "REM_TEST_MODE=1" in proc.stderr
    )
    assert proc.stderr.count("\n") == 1
    assert (
        run_rem("init", "--data", data, env=rem_env(**{variable: value, "REM_TEST_MODE": "1"})).returncode
        == 0
    )
    # `rem drill` is a test of its own: it sets the marker (here it then stops at the bad role)
    drill = run_rem("drill", "sigkill", "--role", "bogus", "--data", data, env=production)
    assert drill.returncode == 2 and "unknown drill role 'bogus'" in drill.stderr, drill.stderr


def test_the_library_refuses_faults_without_the_marker(monkeypatch: pytest.MonkeyPatch) -> None:
    from backend.core import faults
    from backend.core.errors import UsageError

    monkeypatch.delenv("REM_TEST_MODE")
    monkeypatch.setenv("REM_FAULTS", "dream.mid_graph")
    faults.reset()
    with pytest.raises(UsageError, match="REM_FAULTS is a test-only switch"):
        faults.point("dream.mid_graph")
    faults.reset()


def test_a_daemon_running_with_an_unsafe_switch_journals_it(tmp_path: Path) -> None:
    import json
    import sqlite3

    data = tmp_path / "d"
    env = rem_env(REM_FAULTS="dream.mid_graph@999", REM_TEST_MODE="1", REM_CHROMA_AUTOSTART="0")
    proc = run_rem("daemon", "--role", "executor", "--once", "--data", str(data), env=env, timeout=60)
    assert proc.returncode == 0, proc.stderr
    with sqlite3.connect(data / "state.db") as conn:
        rows = conn.execute("SELECT actor, data FROM event WHERE kind = 'unsafe.switch'").fetchall()
    ((actor, payload),) = rows
    assert actor.startswith("executor") and json.loads(payload)["switches"] == {
        "REM_FAULTS": "dream.mid_graph@999"
    }


def test_the_recall_and_model_knobs_are_settings_read_where_they_are_used(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The recall pipeline's and the model endpoint's knobs are declared here too: their defaults are
    the settings' defaults, and each REM_* value reaches the config built from them."""
    from backend.memory.config import INDEX, IndexConfig, RecallConfig, index_config, recall_config

    assert recall_config() == RecallConfig() and index_config() == IndexConfig() == INDEX
    assert ModelConfig.from_settings().base_url == settings_module.Settings.model_base_url.default
    monkeypatch.setenv("REM_RECALL_SPEAKER_BOOST", "0")
    monkeypatch.setenv("REM_RECALL_CONTEXT_WEIGHT", "0.25")
    monkeypatch.setenv("REM_RECALL_FUSION", "rrf")
    monkeypatch.setenv("REM_INDEX_CONTEXT_TURNS", "2")
    monkeypatch.setenv("REM_MODEL_BASE_URL", "http://127.0.0.1:11434/v1/")
    config = recall_config()
    assert (config.speaker_boost, config.fts_weights, config.fusion, config.lexical_weight) == (
        0.0,
        (1.0, 0.25),
        "rrf",
        1.0,
    )
    assert index_config().ctx_turns == 2 and index_config().key() != INDEX.key()
    assert ModelConfig.from_settings().base_url == "http://127.0.0.1:11434/v1"
    monkeypatch.setenv("REM_RECALL_GRAPH_WEIGHT", "-1")
    with pytest.raises(SettingsError, match=r"REM_RECALL_GRAPH_WEIGHT='-1' is not a number, at least 0"):
        validate()
