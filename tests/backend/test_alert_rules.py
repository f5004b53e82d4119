"""`rem metrics --rules`: the file parses, promtool accepts it, and every rule fires exactly where it should.

Each rule is evaluated against the metrics of a data dir built to trigger it
and of one built not to. With `promtool` on the machine (`.ci/run` installs
it) the rendered rules are evaluated by Prometheus' own engine (`promtool
test rules`, the scraped samples as constant input series, `for` honoured);
the threshold reading (`AlertRule.firing`) is checked in every case, so a
machine without promtool still evaluates every rule, and says so in the skip.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from backend import ops
from backend.core import clock
from backend.core.datadir import DataDir
from backend.ops.alert_rules import RULES, firing, rules_document, rules_yaml
from backend.ops.prometheus import down_families, samples
from backend.runtime.context import Context
from tests.helpers import run_rem
from tests.tui import scenes

PROMTOOL = shutil.which("promtool")
NO_PROMTOOL = "promtool not on this machine (apt-get install prometheus; .ci/run does)"
REQUIRED = {
    "RemLeaseDeadOwner",
    "RemLeaseExpiredNotTakenOver",
    "RemRecoveryParked",
    "RemReceiptMismatch",
    "RemReceiptQuarantined",
    "RemDreamStuck",
    "RemBacklogOld",
    "RemNoLiveExecutor",
    "RemChromaDown",
    "RemToolOutcomeUnknown",
    "RemToolApprovalWaiting",
    "RemApiServerErrors",
}


@pytest.fixture(autouse=True)
def scene_clock() -> Iterator[clock.FrozenClock]:
    frozen = clock.FrozenClock(scenes.NOW)
    clock.set_clock(frozen)
    yield frozen
    clock.set_clock(None)


# -- the file -----------------------------------------------------------------------------
def test_the_rules_file_parses_and_names_a_console_key_in_every_summary() -> None:
    document = yaml.safe_load(rules_yaml())
    assert document == rules_document()
    rules = document["groups"][0]["rules"]
    assert {r["alert"] for r in rules} >= REQUIRED
    for rule in rules:
        assert set(rule) == {"alert", "expr", "for", "labels", "annotations"}
        assert rule["labels"]["severity"] in ("warning", "critical")
        assert re.match(r"^\d+[smh]$", rule["for"])
        summary = rule["annotations"]["summary"]
        assert re.search(r"console key \d|console's (red )?banner", summary), summary
        assert rule["annotations"]["console_key"]


def test_rem_metrics_rules_prints_the_file_and_json_too() -> None:
    proc = run_rem("metrics", "--rules")
    assert proc.returncode == 0 and yaml.safe_load(proc.stdout) == rules_document()
    as_json = run_rem("metrics", "--rules", "--json")
    import json

    assert json.loads(as_json.stdout) == rules_document()


@pytest.mark.skipif(PROMTOOL is None, reason=NO_PROMTOOL)
def test_promtool_check_rules_passes(tmp_path: Path) -> None:
    path = tmp_path / "rem-rules.yml"
    path.write_text(rules_yaml())
    proc = subprocess.run([PROMTOOL, "check", "rules", str(path)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"SUCCESS: {len(RULES)} rules found" in proc.stdout


# -- the data dirs: one built to trigger each rule, one built not to --------------------------
def _killed(scene: scenes.Scene, expired_ago_ms: int = 12_000) -> None:
    scenes.killed_executor(scene)
    scene.tx(
        lambda: scene.x(
            "UPDATE session_execution SET expires_at = ? WHERE id = 'exe_0002'", scene.now - expired_ago_ms
        )
    )


def _no_executor(scene: scenes.Scene) -> None:
    scene.tx(
        lambda: scene.x("UPDATE worker SET heartbeat_at = ? WHERE role = 'executor'", scene.now - 60_000)
    )


def _tool_call(scene: scenes.Scene, state: str, *, ago_ms: int) -> None:
    """A send on executor A's turn, waiting for a person since `ago_ms` (younger ones: no alert)."""

    def rows() -> None:
        scene.tool_call(
            "call_x",
            "exe_0001",
            "s-alpha",
            "demo.outbox_send",
            {"to": "ops"},
            state=state,
            owner=scenes.EXEC_A,
            epoch=3,
            ago_ms=ago_ms,
            starts=int(state == "unknown"),
        )
        scene.tool_call(
            "call_y",
            "exe_0001",
            "s-alpha",
            "demo.outbox_send",
            {"to": "ops"},
            state="awaiting_approval",
            owner=scenes.EXEC_A,
            epoch=3,
            ago_ms=60_000,
            idx=1,
        )

    scene.tx(rows)


def _api_errors(scene: scenes.Scene) -> None:
    """A live API server that answered a fifth of its requests with a 5xx (as its worker row says)."""
    info = {
        "listen": "http://127.0.0.1:8765",
        "server_error_ratio": 0.2,
        "requests": [{"method": "GET", "route": "/v1/status", "code": 503, "count": 2}],
    }

    def rows() -> None:
        scene.worker(API_SERVER, "server", 4200)
        scene.x("UPDATE worker SET info = ? WHERE owner_id = ?", json.dumps(info), API_SERVER)

    scene.tx(rows)


API_SERVER = "server-ops-1-4200-a0b0c0"
TRIGGERS: dict[str, tuple[Callable[[scenes.Scene], None], bool]] = {
    "RemLeaseDeadOwner": (_killed, True),
    "RemLeaseExpiredNotTakenOver": (lambda s: _killed(s, expired_ago_ms=90_000), True),
    "RemRecoveryParked": (
        lambda s: s.tx(lambda: s.recovery("exe_9", "s-x", attempts=10, error="wake budget exhausted")),
        True,
    ),
    "RemReceiptMismatch": (
        lambda s: s.tx(lambda: s.summary("s-x", verdict="keys_differ", keys=[{"key": "title"}])),
        True,
    ),
    "RemReceiptQuarantined": (
        lambda s: s.tx(lambda: s.summary("s-x", verdict="quarantined", quarantine="not JSON")),
        True,
    ),
    "RemDreamStuck": (
        lambda s: s.tx(
            lambda: s.dream("s-x", input_rev=scenes.REV_B, completed_rev=None, published_ago_ms=7_200_000)
        ),
        True,
    ),
    "RemBacklogOld": (lambda s: s.tx(lambda: s.inputs("s-x", 2, oldest_ago_ms=900_000)), True),
    "RemNoLiveExecutor": (_no_executor, True),
    "RemChromaDown": (lambda s: None, False),
    "RemToolOutcomeUnknown": (lambda s: _tool_call(s, "unknown", ago_ms=30_000), True),
    "RemToolApprovalWaiting": (lambda s: _tool_call(s, "awaiting_approval", ago_ms=1_200_000), True),
    "RemApiServerErrors": (_api_errors, True),
}


async def _samples(root: Path, build: Callable[[scenes.Scene], None], chroma_url: str | None) -> list[Any]:
    with scenes.Scene(root) as scene:
        scenes.healthy(scene)
        build(scene)
    ctx = Context(DataDir(root), read_only=True, chroma_url=chroma_url, start_chroma=False)
    try:
        return samples(await ops.status(ctx))
    finally:
        await ctx.close()


def _promtool_test(tmp_path: Path, listed: list[Any], expected: dict[str, list[dict[str, str]]]) -> None:
    """Run `promtool test rules`: the samples held constant for 20 minutes, alerts checked at 15m."""
    rules = rules_document()
    for rule in rules["groups"][0]["rules"]:
        rule.pop("annotations")  # their templates are checked by `promtool check rules`; labels here
    (tmp_path / "rules.yml").write_text(yaml.safe_dump(rules))

    def series(name: str, labels: dict[str, str]) -> str:
        inner = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
        return f"{name}{{{inner}}}"

    test = {
        "rule_files": ["rules.yml"],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": [{"series": series(n, lab), "values": f"{v:g}+0x20"} for n, lab, v in listed],
                "alert_rule_test": [
                    {
                        "eval_time": "15m",
                        "alertname": rule.name,
                        "exp_alerts": [
                            {"exp_labels": {**labels, "severity": rule.severity}}
                            for labels in expected.get(rule.name, [])
                        ],
                    }
                    for rule in RULES
                ],
            }
        ],
    }
    (tmp_path / "test.yml").write_text(yaml.safe_dump(test))
    assert PROMTOOL is not None
    proc = subprocess.run(
        [PROMTOOL, "test", "rules", "test.yml"], cwd=tmp_path, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.parametrize("rule", sorted(TRIGGERS))
async def test_each_rule_fires_on_the_data_dir_built_to_trigger_it(
    tmp_path: Path, chroma_url: str, rule: str
) -> None:
    build, chroma_up = TRIGGERS[rule]
    listed = await _samples(tmp_path / "data", build, chroma_url if chroma_up else None)
    fired = firing(listed)
    assert rule in fired, f"{rule} did not fire; fired: {sorted(fired)}"
    if PROMTOOL is not None:  # the same verdict from Prometheus' engine, every rule at once
        expected = {name: [s["labels"] for s in series] for name, series in fired.items()}
        _promtool_test(tmp_path, listed, expected)


async def test_no_rule_fires_on_a_healthy_data_dir(tmp_path: Path, chroma_url: str) -> None:
    listed = await _samples(tmp_path / "data", lambda s: None, chroma_url)
    assert firing(listed) == {}
    if PROMTOOL is not None:
        _promtool_test(tmp_path, listed, {})


def test_an_unreadable_state_db_fires_rem_state_unreadable(tmp_path: Path) -> None:
    listed = [
        (s.name, dict(s.labels), float(s.value)) for f in down_families("DatabaseCorrupt") for s in f.samples
    ]
    assert set(firing(listed)) == {"RemStateUnreadable"}
    if PROMTOOL is not None:
        _promtool_test(tmp_path, listed, {"RemStateUnreadable": [{}]})


@pytest.mark.skipif(
    PROMTOOL is not None, reason="promtool is here: the rules were evaluated by Prometheus' engine"
)
def test_without_promtool_the_rules_were_read_against_the_thresholds_only() -> None:
    pytest.skip(NO_PROMTOOL + "; each rule's threshold was read against the scraped samples instead")
