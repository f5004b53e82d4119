"""Operator action plans: what a confirmation names, and how the confirmed action is run.

A plan is built from what the operator sees (the selected rows, and for
replay the dry-run result the library returned), so the modal can name the
exact targets and counts. Running it calls `backend.ops` through the
console backend; the library re-checks every precondition against the
database (the release is fenced on the epoch shown here).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from backend.ops.records import LeaseKind, LeaseRecord, ReplayReport, WorkerState
from backend.ops.results import (
    ActionResult,
    DrainReport,
    KillReport,
    LeaseReleased,
    ResumeReport,
    ToolDecision,
)
from tui.console_backend import ConsoleBackend
from tui.format import compact_json, duration, short
from tui.widgets.leases import left_ms, owner_alive
from tui.widgets.receipts import VERDICT_LABEL, differing_keys
from tui.widgets.workers import worker_state

RELEASABLE_KINDS = tuple(LeaseKind)


@dataclass
class ActionPlan:
    """One confirmed-before-run operator action and everything its modal shows."""

    action: str  # replay | drain | release | resume | approve | deny | resolve | kill
    title: str
    targets: list[str]
    lines: list[str]
    confirm_label: str
    params: dict[str, Any] = field(default_factory=dict)
    preview: str = ""
    warning: str = ""
    # the kill's confirmation shows its lines in titled parts (`tui/screens/kill.py`)
    sections: list[tuple[str, list[str]]] = field(default_factory=list)

    @property
    def target_text(self) -> str:
        if len(self.targets) == 1:
            return self.targets[0]
        return f"{len(self.targets)} targets"


class NotActionable(Exception):
    """The selection cannot be acted on (explained in one line to the operator)."""


# -- replay ---------------------------------------------------------------------
def result_counts(result: Mapping[str, Any]) -> str:
    """`scanned 3 · present 1 · replayed 2`: the non-zero counters of a replay report."""
    counters = result.get("counters")
    source = counters if isinstance(counters, Mapping) else result
    parts = [
        f"{k.replace('_', ' ')} {v}"
        for k, v in source.items()
        if isinstance(v, int) and not isinstance(v, bool) and (v or k == "scanned")
    ]
    return " · ".join(parts)


def key_diff_lines(keys: Sequence[Any], indent: str = "    ") -> list[str]:
    lines = []
    for item in keys:
        if not isinstance(item, Mapping):
            lines.append(f"{indent}{item}")
            continue
        reason = str(item.get("reason") or "")
        if reason == "type_differs":
            reason += f": {item.get('expected_type')} vs {item.get('actual_type')}"
        why = f"  ({reason})" if reason else ""
        actual = "(missing)" if item.get("reason") == "missing" else _json(item.get("actual"))
        lines.append(
            f"{indent}{item.get('key')}: receipt {_json(item.get('expected'))} → Chroma {actual}{why}"
        )
    return lines


def _json(value: Any) -> str:
    return short(json.dumps(value, default=str, sort_keys=True), 60)


def replay_preview(records: Sequence[Mapping[str, Any]], dry_run: ReplayReport | None) -> str:
    """The dry-run diff: the library's per-receipt verdicts, else the snapshot's key diffs."""
    lines = []
    counts = result_counts(dry_run) if dry_run is not None else ""
    if counts:
        lines.append(f"dry run: {counts}")
    rows = dry_run["rows"] if dry_run is not None else []
    if rows:
        for row in rows:
            verdict = VERDICT_LABEL.get(str(row["verdict"]), row["verdict"] or "")
            reason = f" ({row['reason']})" if row["reason"] else ""
            lines.append(f"  {row['summary_id']}  {verdict}  → {row['outcome']}{reason}".rstrip())
            if row["document"]:
                lines.append(f"    document: {_json(row['document'])}")
            lines += key_diff_lines(row["keys"])
    else:
        for record in records:
            lines.append(
                f"  {record.get('summary_id')}  {VERDICT_LABEL.get(str(record.get('verdict')), '')}"
                f"  {differing_keys(record)}"
            )
            lines += key_diff_lines(record.get("keys") or [])
    return "\n".join(lines) or "dry run: nothing to replay"


def replay_plan(
    records: Sequence[Mapping[str, Any]], *, all_mismatched: bool, dry_run: ReplayReport
) -> ActionPlan:
    """Replay the selected receipt(s), or every mismatched one, with the dry-run diff shown."""
    ids = [str(r.get("summary_id")) for r in records]
    if all_mismatched:
        title = f"Replay all {len(ids)} mismatched receipts"
        lines = [
            f"Replays every receipt whose Chroma row differs ({len(ids)} shown in the panel; "
            "the library re-checks each one now)."
        ]
    else:
        title = f"Replay receipt {ids[0]}" if len(ids) == 1 else f"Replay {len(ids)} receipts"
        lines = [f"Replays {', '.join(ids)} into Chroma from its durable receipt."]
    lines.append(
        "No model call: the document and the synthesis-owned keys are upserted, read back "
        "and verified; Dream-owned keys are kept."
    )
    return ActionPlan(
        action="replay",
        title=title,
        targets=ids,
        lines=lines,
        confirm_label="Replay",
        params={"summary_ids": None if all_mismatched else ids, "all_mismatched": all_mismatched},
        preview=replay_preview(records, dry_run),
    )


# -- drain ------------------------------------------------------------------------
def drain_plan(worker: Mapping[str, Any], leases: Sequence[LeaseRecord], now: int) -> ActionPlan:
    """Drain one worker; names its role, pid, host, state and the leases it holds."""
    owner = str(worker.get("owner_id"))
    state = worker_state(dict(worker), now)
    held = [lease for lease in leases if lease["owner_id"] == owner]
    lines = [
        f"Worker {owner}",
        f"role {worker.get('role')} · pid {worker.get('pid')} on {worker.get('host')} · {state} · "
        f"heartbeat {duration(now - int(worker.get('heartbeat_at') or now))} ago",
        f"Holds {len(held)} lease{'s' if len(held) != 1 else ''}"
        + (": " + ", ".join(f"{lease['session_id']} ({lease['kind']})" for lease in held[:6]) if held else "")
        + (" …" if len(held) > 6 else ""),
        "It stops claiming, finishes or hands back in-flight work, releases its leases and exits.",
    ]
    warning = ""
    if state in (WorkerState.STOPPED, "dead"):
        warning = f"This worker is {state}: the library will refuse to drain it" + (
            "; release its leases instead." if state == "dead" else "."
        )
    return ActionPlan(
        action="drain",
        title=f"Drain {owner}",
        targets=[owner],
        lines=lines,
        confirm_label="Drain",
        params={"owner_id": owner},
        warning=warning,
    )


# -- release ----------------------------------------------------------------------
def owner_word(lease: Mapping[str, Any], alive: bool, now: int) -> str:
    """`alive`, `DEAD`, or `DEAD: exited 3s ago` when its supervisor saw the process die."""
    if alive:
        return "alive"
    exited = lease.get("owner_exited_at")
    if isinstance(exited, int):
        return f"DEAD: its supervisor saw it exit {duration(max(0, now - exited))} ago"
    return "DEAD"


def release_plan(lease: Mapping[str, Any], now: int) -> ActionPlan:
    """Release one lease, fenced on the epoch shown; names owner, epoch and time left."""
    kind = str(lease.get("kind") or "execution")
    if kind not in RELEASABLE_KINDS:
        raise NotActionable(f"unknown lease kind {kind!r}; select an execution, summary-job or Dream lease")
    lease_id = str(lease.get("id"))
    if lease.get("parked"):
        raise NotActionable(
            f"this turn is parked for a person ({lease.get('parked')}): nobody holds it and a release "
            "would run nothing; decide its tool calls in Backlog (key 1: a approve, n deny, o resolve)"
        )
    epoch = lease.get("epoch")
    left = left_ms(dict(lease), now)
    alive = owner_alive(dict(lease), now)
    when = f"expired {duration(-left)} ago" if left <= 0 else f"expires in {duration(left)}"
    lines = [
        f"{kind} lease {lease_id} of session {lease.get('session_id')}",
        f"owner {lease.get('owner_id')} ({owner_word(lease, alive, now)}) · epoch {epoch} · {when}",
        f"Expires the lease now and bumps the epoch past {epoch}, fencing the old owner's late writes; "
        "another worker takes over through the normal recovery path.",
        f"Refused if the lease changed since epoch {epoch} (you saw an old state).",
    ]
    warning = "The owner is alive and renewing this lease: release it only if it is stuck." if alive else ""
    return ActionPlan(
        action="release",
        title=f"Release lease {short(lease_id, 40)}",
        targets=[lease_id],
        lines=lines,
        confirm_label="Release",
        warning=warning,
        params={"lease_id": lease_id, "kind": kind, "expected_epoch": epoch},
    )


# -- resume -----------------------------------------------------------------------
def resume_plan(record: Mapping[str, Any]) -> ActionPlan:
    """Resume one session a model error holds; names why it is held and what will run."""
    sid = record.get("session_id") or record.get("target")
    held = record.get("what") == "held" or bool(record.get("held"))
    if not sid or not held:
        raise NotActionable("select a held session (a red `held` row in Backlog, or HELD in Sessions)")
    reason = record.get("reason") or (record.get("last_error") or {}).get("message") or "a model error"
    lines = [
        f"Session {sid} is held: {short(str(reason), 100)}",
        f"{record.get('waiting', 'its')} waiting input(s) run again, and the prompt that got the error "
        "reply is asked again as a new input.",
        "Fix the cause first (the key, the model name, the quota): otherwise it is held again at once.",
    ]
    return ActionPlan(
        action="resume",
        title=f"Resume {sid}",
        targets=[str(sid)],
        lines=lines,
        confirm_label="Resume",
        params={"session_id": str(sid)},
    )


# -- tool calls: approve, deny, resolve ---------------------------------------------
TOOL_DECISIONS = {
    "approve": (
        "awaiting_approval",
        "Approve",
        "It runs, with its one idempotency key, when its turn resumes.",
    ),
    "deny": ("awaiting_approval", "Deny", "It does not run; the model is told the operator denied it."),
    "resolve": (
        "unknown",
        "Resolve",
        "Done: it happened (the text is its result for the model). Retry: it runs again with the "
        "same key. Fail: the model is told it failed (the text says why).",
    ),
}


def tool_call_plan(record: Mapping[str, Any], action: str, now: int) -> ActionPlan:
    """Approve, deny or resolve one tool call; names session, tool, arguments, effect, owner, epoch, age."""
    state, label, what = TOOL_DECISIONS[action]
    call_id = record.get("call_id")
    if not call_id or record.get("state") != state:
        wanted = "an `unknown` row" if state == "unknown" else "an `approve` row"
        raise NotActionable(f"select {wanted} in Backlog (1): {action} decides a tool call {state}")
    alive = "alive" if record.get("owner_alive") else "DEAD"
    started = record.get("started_at")
    lines = [
        f"Tool call {call_id} of session {record.get('session_id')} (execution {record.get('execution_id')})",
        f"tool {record.get('tool')} · effect class {record.get('effect')} · permission {record.get('permission')}",
        f"arguments {short(json.dumps(record.get('arguments'), sort_keys=True, ensure_ascii=False), 300)}",
        f"owner {record.get('owner_id')} ({alive}) · epoch {record.get('epoch')} · "
        f"made {duration(now - int(record.get('since') or now))} ago"
        + (f" · started {duration(now - int(started))} ago" if isinstance(started, int) else ""),
        f"key {record.get('idempotency_key')} · starts {record.get('starts')} · retries {record.get('retries')}",
        what,
        f"Refused if the call is no longer {state} (you saw an old state); journaled either way.",
    ]
    warning = ""
    if action == "resolve":
        warning = "Check the tool's own side before Retry: an effect that happened would happen twice."
    return ActionPlan(
        action=action,
        title=f"{label} {record.get('tool')} for {record.get('session_id')}",
        targets=[str(call_id)],
        lines=lines,
        confirm_label=label,
        warning=warning,
        params={"call_id": str(call_id)},
    )


def describe_decision(decided: ToolDecision) -> str:
    return (
        f"{decided['decision']} {decided['call_id']} ({decided['tool']}): "
        f"{decided['previous_state']} → {decided['state']}"
        + ("; the turn resumes" if decided["unparked"] else "; other calls of the turn still wait")
    )


# -- running and describing ----------------------------------------------------
@dataclass(frozen=True)
class Outcome:
    """What a confirmed plan did: the library's typed result, and the one line that says it."""

    result: ActionResult
    text: str  # for the notification and the action log


async def execute(plan: ActionPlan, backend: ConsoleBackend) -> Outcome:
    """Run a confirmed plan through `backend.ops` (the library re-checks and journals it).

    Each action reads its own typed result (`backend.ops.results`); a new
    action adds its branch here and its describer below.
    """
    p = plan.params
    if plan.action == "replay":
        report = await backend.replay(p["summary_ids"], all_mismatched=p["all_mismatched"])
        return Outcome(report, describe_replay(plan, report))
    if plan.action == "drain":
        drained = await backend.drain(p["owner_id"])
        return Outcome(drained, describe_drain(drained))
    if plan.action == "release":
        released = await backend.release(p["lease_id"], kind=p["kind"], expected_epoch=p["expected_epoch"])
        return Outcome(released, describe_release(released))
    if plan.action == "resume":
        resumed = await backend.resume(p["session_id"])
        return Outcome(resumed, describe_resume(plan, resumed))
    if plan.action in TOOL_DECISIONS:
        decided = await _decide(plan, backend)
        return Outcome(decided, describe_decision(decided))
    if plan.action == "kill":  # its plans: tui/kill.py
        killed = await backend.kill(p["target"])
        return Outcome(killed, describe_kill(killed))
    raise ValueError(f"unknown action {plan.action!r}")


async def _decide(plan: ActionPlan, backend: ConsoleBackend) -> ToolDecision:
    call_id, text = plan.params["call_id"], plan.params.get("text") or None
    if plan.action == "approve":
        return await backend.approve(call_id)
    if plan.action == "deny":
        return await backend.deny(call_id, text)
    return await backend.resolve(call_id, plan.params["choice"], text)


def describe_replay(plan: ActionPlan, report: ReplayReport) -> str:
    return f"replay {plan.target_text}: {result_counts(report) or compact_json(report, 120)}"


def describe_release(released: LeaseReleased) -> str:
    return (
        f"released {released['kind']} lease {released['id']} of {released['owner_id']}: "
        f"epoch {released['old_epoch']} → {released['new_epoch']}"
        + (" (forced)" if released["forced"] else "")
    )


def describe_drain(drained: DrainReport) -> str:
    return (
        f"drain {drained['owner_id']}: {drained['previous_state']} → {drained['state']}; "
        "it hands back its work and exits"
    )


def describe_resume(plan: ActionPlan, resumed: ResumeReport) -> str:
    if not resumed["resumed"]:
        return f"resume {plan.target_text}: nothing was held"
    item = resumed["resumed"][0]
    again = f"; asked again as {', '.join(item['reasked'])}" if item["reasked"] else ""
    return f"resumed {item['session_id']}: {item['inputs_woken']} waiting input(s) woken{again}"


def describe_kill(killed: KillReport) -> str:
    """What was killed, what it held, and whether its death is recorded yet."""
    leases, calls = len(killed["leases"]), len(killed["running_calls"])
    seen = "dead" if killed["exited"] else "not seen to exit yet"
    return (
        f"SIGKILL {killed['role']} pid {killed['pid']} ({killed['target']}): {seen}; it held "
        f"{leases} lease{'s' if leases != 1 else ''}, {calls} tool call{'s' if calls != 1 else ''} running"
    )
