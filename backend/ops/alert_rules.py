"""`rem metrics --rules`: Prometheus alerting rules over `rem metrics`, each naming the console key to press.

A rule is data (a metric, label matchers, a comparison, a threshold, how long
it must hold) rendered to PromQL, so the same rule can also be evaluated
here without Prometheus: `firing()` reads the threshold against a
snapshot's samples (the history store marks incidents with it, and the tests
use it where `promtool` is not installed). Every expression is a plain
`metric{matchers} OP threshold`, so both evaluations agree by construction;
with `promtool` on the machine the tests also run `promtool check rules` and
`promtool test rules` on the rendered file.
"""

from __future__ import annotations

import operator
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import yaml

GROUP = "rem"
# Each rule's runbook is a section of the operators' guide whose heading is the rule's name, so its
# anchor is the name in lower case (MkDocs' and GitHub's heading ids agree on that). The base is the
# page in rem's source tree unless `rem metrics --rules --runbook-url` names where the docs are served.
RUNBOOK_PAGE = "docs/operators.md"
OPS: dict[str, Callable[[float, float], bool]] = {">": operator.gt, "==": operator.eq, ">=": operator.ge}


@dataclass(frozen=True)
class AlertRule:
    """One alert: `metric{matchers} op threshold` held for `hold`."""

    name: str
    metric: str
    op: str
    threshold: float
    hold: str
    severity: str
    summary: str
    description: str
    console_key: str
    # label -> regex (fully anchored, as PromQL's =~)
    matchers: Mapping[str, str] = field(default_factory=dict)

    @property
    def expr(self) -> str:
        selector = ", ".join(f'{k}=~"{v}"' for k, v in self.matchers.items())
        return (
            f"{self.metric}{{{selector}}} {self.op} {self.threshold:g}"
            if selector
            else (f"{self.metric} {self.op} {self.threshold:g}")
        )

    @property
    def runbook_anchor(self) -> str:
        """The id of this rule's section in the operators' guide (its heading, `### RemLeaseDeadOwner`)."""
        return self.name.lower()

    def runbook_url(self, page: str = RUNBOOK_PAGE) -> str:
        return f"{page.split('#')[0]}#{self.runbook_anchor}"

    def matches(self, name: str, labels: Mapping[str, str]) -> bool:
        return name == self.metric and all(
            re.fullmatch(pattern, labels.get(label, "")) for label, pattern in self.matchers.items()
        )

    def firing(self, samples: Iterable[tuple[str, Mapping[str, str], float]]) -> list[dict[str, Any]]:
        """The series for which the condition holds now (the `for` hold is not applied)."""
        compare = OPS[self.op]
        return [
            {"labels": dict(labels), "value": value}
            for name, labels, value in samples
            if self.matches(name, labels) and compare(value, self.threshold)
        ]


RULES: tuple[AlertRule, ...] = (
    AlertRule(
        name="RemLeaseDeadOwner",
        metric="rem_leases_dead_owner",
        op=">",
        threshold=0,
        hold="1m",
        severity="warning",
        summary="{{ $value }} {{ $labels.kind }} lease(s) held by a dead worker: "
        "console key 2 (Leases), pick the row marked ✗, l to release",
        description="A worker stopped heartbeating while holding leases; they expire on their own "
        "(execution: 30 s) unless it comes back. Releasing bumps the epoch and fences the old owner.",
        console_key="2 then l",
    ),
    AlertRule(
        name="RemLeaseExpiredNotTakenOver",
        metric="rem_lease_expired_max_seconds",
        op=">",
        threshold=60,
        hold="2m",
        severity="critical",
        summary="a {{ $labels.kind }} lease expired {{ $value | humanizeDuration }} ago and nobody "
        "took it over: console key 2 (Leases), l to release; 5 shows whether any worker is alive",
        description="An expired lease is normally taken over within a second by a live worker of the "
        "same role. One that stays expired means no live worker can claim it.",
        console_key="2 then l",
    ),
    AlertRule(
        name="RemRecoveryParked",
        metric="rem_recoveries",
        matchers={"state": "parked"},
        op=">",
        threshold=0,
        hold="0m",
        severity="critical",
        summary="{{ $value }} recovery row(s) parked after the attempt budget: console key 1 "
        "(Backlog), enter for the recovery error, then 2 and l to release the session's lease",
        description="A takeover failed REM_RECOVERY_BUDGET times; the session waits for an operator.",
        console_key="1 then enter",
    ),
    AlertRule(
        name="RemReceiptMismatch",
        metric="rem_receipts",
        matchers={"verdict": "missing|document_differs|keys_differ"},
        op=">",
        threshold=0,
        hold="5m",
        severity="warning",
        summary="{{ $value }} summary receipt(s) {{ $labels.verdict }} against Chroma: console key 3 "
        "(Receipts), enter for the diff, r to replay it (R: all)",
        description="A Chroma summary row differs from its durable receipt on owned keys. Replay "
        "rewrites it from the receipt with no model call.",
        console_key="3 then r",
    ),
    AlertRule(
        name="RemReceiptQuarantined",
        metric="rem_receipts",
        matchers={"verdict": "quarantined"},
        op=">",
        threshold=0,
        hold="0m",
        severity="critical",
        summary="{{ $value }} receipt envelope(s) quarantined as corrupt: console key 3 (Receipts), "
        "enter to see the envelope and why",
        description="A corrupt envelope is kept byte for byte and never guessed at; the other "
        "sessions' recovery goes on.",
        console_key="3 then enter",
    ),
    AlertRule(
        name="RemToolOutcomeUnknown",
        metric="rem_tool_calls_waiting",
        matchers={"state": "unknown"},
        op=">",
        threshold=0,
        hold="1m",
        severity="critical",
        summary="{{ $value }} effect tool call(s) whose outcome is unknown, their sessions held: "
        "console key 1 (Backlog, unknown outcomes first), the call's row, o to resolve it done, retry or fail",
        description="An executor died (or the tool timed out) while an effect tool call was in "
        "flight. rem never repeats it by itself: check the tool's own side (did the mail go?) and "
        "resolve it; the turn waits until then.",
        console_key="1 then o",
    ),
    AlertRule(
        name="RemToolApprovalWaiting",
        metric="rem_tool_calls_waiting_oldest_seconds",
        matchers={"state": "awaiting_approval"},
        op=">",
        threshold=900,
        hold="0m",
        severity="warning",
        summary="a tool call has waited {{ $value | humanizeDuration }} for approval: console key 1 "
        "(Backlog), the call's row, a to approve or n to deny",
        description="An `ask` tool (by default every effect tool) waits for a person; its session's "
        "turn is parked until someone approves or denies it.",
        console_key="1 then a",
    ),
    AlertRule(
        name="RemDreamStuck",
        metric="rem_backlog_oldest_age_seconds",
        matchers={"kind": "dream"},
        op=">",
        threshold=1800,
        hold="10m",
        severity="warning",
        summary="Dream has not digested a published revision for {{ $value | humanizeDuration }}: "
        "console key 4 (Dream drift), enter for the defer reason",
        description="Drift older than 30 minutes: Dream is down, deferring, or parked revisions as "
        "undigestible.",
        console_key="4 then enter",
    ),
    AlertRule(
        name="RemBacklogOld",
        metric="rem_backlog_oldest_age_seconds",
        matchers={"kind": "input|recovery|summary"},
        op=">",
        threshold=300,
        hold="5m",
        severity="warning",
        summary="the oldest {{ $labels.kind }} has waited {{ $value | humanizeDuration }}: console "
        "key 1 (Backlog), s to sort by age",
        description="Work waiting over 5 minutes: too few workers, or a stuck one.",
        console_key="1 then s",
    ),
    AlertRule(
        name="RemNoLiveExecutor",
        metric="rem_workers_alive",
        matchers={"role": "executor"},
        op="==",
        threshold=0,
        hold="1m",
        severity="critical",
        summary="no live executor, so no turn runs: console key 5 (Workers) shows the last ones and "
        "why they stopped; `rem up` restarts them",
        description="Every executor is stopped or has stopped heartbeating.",
        console_key="5",
    ),
    AlertRule(
        name="RemChromaDown",
        metric="rem_chroma_up",
        op="==",
        threshold=0,
        hold="1m",
        severity="critical",
        summary="Chroma is not answering: the console's red banner says why; summaries and "
        "replay (3, r) wait for it, turns go on",
        description="`rem up` restarts its own Chroma server; an external one (--chroma-url) is yours.",
        console_key="banner",
    ),
    AlertRule(
        name="RemApiServerErrors",
        metric="rem_api_server_error_ratio",
        op=">",
        threshold=0.05,
        hold="5m",
        severity="warning",
        summary="API server {{ $labels.owner_id }} answered {{ $value | humanizePercentage }} of its "
        "requests with a 5xx over five minutes: its log (DATA/logs, or its stderr) has the cause; "
        "console key 5 (Workers) shows whether it is alive",
        description="A 503 says the state store (or Chroma, for recall) is unreachable, busy or full: "
        "the store's own alerts say which. A 500 is a bug: the server logged its traceback.",
        console_key="5",
    ),
    AlertRule(
        name="RemStateUnreadable",
        metric="rem_up",
        op="==",
        threshold=0,
        hold="1m",
        severity="critical",
        summary="rem metrics cannot read state.db: the console's banner says why "
        "(locked, full disk, corrupt); `rem check` next",
        description="The exporter is up but the snapshot failed (rem_scrape_error has the message).",
        console_key="banner",
    ),
)


def rules_document(rules: Iterable[AlertRule] = RULES, runbook_page: str = RUNBOOK_PAGE) -> dict[str, Any]:
    """The rules file as data: one group, one entry per rule, each linking its runbook section."""
    return {
        "groups": [
            {
                "name": GROUP,
                "rules": [
                    {
                        "alert": r.name,
                        "expr": r.expr,
                        "for": r.hold,
                        "labels": {"severity": r.severity},
                        "annotations": {
                            "summary": r.summary,
                            "description": r.description,
                            "console_key": r.console_key,
                            "runbook_url": r.runbook_url(runbook_page),
                        },
                    }
                    for r in rules
                ],
            }
        ]
    }


def rules_yaml(rules: Iterable[AlertRule] = RULES, runbook_page: str = RUNBOOK_PAGE) -> str:
    """The Prometheus rules file `rem metrics --rules` prints."""
    header = (
        "# Prometheus alerting rules for `rem metrics` (generated by `rem metrics --rules`).\n"
        "# Load with `rule_files:` in prometheus.yml; every summary names the console key to press,\n"
        "# and every runbook_url the rule's section of the operators' guide.\n"
    )
    body: str = yaml.safe_dump(
        rules_document(rules, runbook_page), sort_keys=False, allow_unicode=True, width=1000
    )
    return header + body


def firing(samples: Iterable[tuple[str, Mapping[str, str], float]]) -> dict[str, list[dict[str, Any]]]:
    """Each rule whose condition holds in these samples, with the series that hold it."""
    listed = list(samples)
    out = {}
    for rule in RULES:
        series = rule.firing(listed)
        if series:
            out[rule.name] = series
    return out


def metric_rules(runbook_page: str | None = None) -> str:
    """The Prometheus alerting rules over `rem metrics` (YAML), each naming the console key to press
    and linking its runbook (`runbook_page`: where the operators' guide is served)."""
    return rules_yaml(RULES, runbook_page or RUNBOOK_PAGE)
