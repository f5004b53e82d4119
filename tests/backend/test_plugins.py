"""The plug-in loader: a name two installed packages register is refused naming both, and a plug-in
is checked against its Protocol when it loads, in one line naming what is missing."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from backend.chroma.embedder import Embedder
from backend.core.plugins import PluginError, installed, load_plugin, protocol_problems
from backend.execution.agent import Agent, OfflineResponder
from backend.summaries.synthesizer import ExtractiveSynthesizer, Synthesizer
from tests.helpers import rem_env, run_rem

ROOT = Path(__file__).resolve().parents[2]


def _distribution(site: Path, name: str, version: str, entry_points: str) -> None:
    """An installed package as importlib.metadata finds one: a .dist-info folder on sys.path."""
    info = site / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    (info / "entry_points.txt").write_text(entry_points)


def test_a_name_two_installed_packages_register_is_refused_naming_both(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    site = tmp_path / "site"
    _distribution(site, "agents-one", "1.0", "[rem.agents]\ntwice = agents_one:make\n")
    _distribution(site, "agents-two", "2.3", "[rem.agents]\ntwice = agents_two.factory:build\n")
    monkeypatch.syspath_prepend(str(site))
    assert installed("rem.agents").count("twice") == 1
    with pytest.raises(PluginError) as caught:
        load_plugin("rem.agents", "twice", "REM_AGENT", Agent)
    message = str(caught.value)
    assert message.startswith(
        "REM_AGENT='twice' is ambiguous: 2 installed packages register 'twice' in rem.agents"
    )
    assert (
        "agents-one 1.0 (agents_one:make)" in message
        and "agents-two 2.3 (agents_two.factory:build)" in message
    )
    assert "\n" not in message
    # a name only one package registers still loads, beside the ambiguous one
    assert isinstance(load_plugin("rem.agents", "offline", "REM_AGENT", Agent), OfflineResponder)


class NamelessAgent:
    """An agent whose name is a number and which cannot stream."""

    name = 7

    def system_prompt(self) -> str:
        return ""

    def snapshot(self) -> dict[str, Any]:
        return {}


class SyncSynthesizer:
    name = "sync"

    def synthesize(self, session_id: str, turns: Sequence[Any]) -> Any:
        return None


class DeafEmbedder:
    name = "deaf"
    dim = 8

    def embed(self) -> list[list[float]]:
        return []


class OddAgent(OfflineResponder):
    async def stream(self, request: Any, extra: str) -> AsyncIterator[str]:  # type: ignore[override]
        yield extra


@pytest.mark.parametrize(
    ("factory", "protocol", "variable", "problems"),
    [
        ("NamelessAgent", Agent, "REM_AGENT", ["its name is int, not str", "it has no method stream()"]),
        ("SyncSynthesizer", Synthesizer, "REM_SYNTHESIZER", ["synthesize() is not async"]),
        ("DeafEmbedder", Embedder, "REM_EMBEDDER", ["embed() does not take the 1 argument(s) rem passes"]),
        ("OddAgent", Agent, "REM_AGENT", ["stream() does not take the 1 argument(s) rem passes"]),
    ],
)
def test_a_plugin_is_checked_against_its_protocol_in_one_line(
    factory: str, protocol: type, variable: str, problems: list[str]
) -> None:
    spec = f"{__name__}:{factory}"
    with pytest.raises(PluginError) as caught:
        load_plugin("rem.unused", spec, variable, protocol)
    kind = protocol.__name__.lower()
    assert str(caught.value) == (
        f"{variable}={spec!r} is not a usable {kind}: {'; '.join(problems)} "
        f"(see {protocol.__module__}.{protocol.__qualname__})"
    )


def test_rems_own_plugins_conform_to_their_protocols() -> None:
    assert protocol_problems(OfflineResponder(), Agent) == []
    assert protocol_problems(ExtractiveSynthesizer(), Synthesizer) == []
    assert load_plugin("rem.embedders", "hashing", "REM_EMBEDDER", Embedder).dim > 0


def test_a_daemon_refuses_a_plugin_that_is_not_one_at_start_in_one_line(tmp_path: Path) -> None:
    data = tmp_path / "d"
    assert run_rem("send", "s1", "hello", "--data", str(data)).returncode == 0
    spec = "tests.backend.test_plugins:NamelessAgent"
    env = rem_env(REM_AGENT=spec, REM_CHROMA_AUTOSTART="0", PYTHONPATH=str(ROOT))
    proc = run_rem("daemon", "--role", "executor", "--once", "--data", str(data), env=env)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.splitlines() == [
        f"rem: error: REM_AGENT={spec!r} is not a usable agent: its name is int, not str; it has no method "
        "stream() (see backend.execution.agent.Agent)"
    ]
