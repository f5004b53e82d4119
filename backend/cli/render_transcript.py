"""`rem show`'s human view: the session's header, its messages with their markers, usage and memory."""

from __future__ import annotations

from typing import Any

from rich.console import Console

from backend.cli.render import _e, _money, _tokens, unhold_hint
from backend.cli.render_tools import print_session_calls
from backend.core.inert import visible


def print_transcript(result: dict[str, Any]) -> None:
    """`rem show`: the session's header, then each message with its markers and usage."""
    console = Console(highlight=False, emoji=False)  # values print as typed
    _print_session_head(console, result["session"])
    for message in result["messages"]:
        _print_message(console, message)
    print_session_calls(console, result.get("tool_calls", []))
    _print_through_api(console, result)
    for waiting in result.get("waiting", []):
        asleep = " (asleep: session held)" if waiting["asleep"] else ""
        console.print(
            f"[dim]waiting[/] {_e(waiting['id'])} {_e(waiting['delivery'])}{asleep}: {_e(waiting['text'])}"
        )
    if result["execution"]:
        ex = result["execution"]
        owner = f" owner {_e(ex['owner_id'])} epoch {ex['epoch']}" if "owner_id" in ex else ""
        console.print(f"[yellow]running[/] {_e(ex['id'])}{owner} phase {_e(ex['phase'])}")


def _print_through_api(console: Console, result: dict[str, Any]) -> None:
    """What `rem show --server` has instead of the store's tool calls and waiting inputs: the calls
    the session's hold waits on, and how many inputs wait."""
    held = result.get("held") or {}
    for call in held.get("tool_calls", []):
        console.print(
            f"[yellow]waits on[/] tool call {_e(call['call_id'])} ({_e(call['tool'])}): {_e(call['state'])}"
        )
    if result.get("inputs_waiting"):
        console.print(f"[dim]waiting[/] {result['inputs_waiting']} input(s) not yet in a turn")


def _print_session_head(console: Console, session: dict[str, Any]) -> None:
    """The session's id, title, counts, model, usage and cost; whether it is held; its last model error."""
    console.print(
        f"[bold]{_e(session['id'])}[/] {_e(session['title'] or '')}  project {_e(session['project'])}, "
        f"{session['turn_count']} turns, {session['message_count']} messages; {_e(session['model'] or 'no model')}: "
        f"{_tokens(session['usage'])}, cost {_money(session['cost'])}"
    )
    if session["held_at"]:
        console.print(
            f"[red]held[/]: {_e(session['held_reason'])}; {unhold_hint(session['id'], session['held_reason'])}"
        )
    if session["model_error"]:
        error = session["model_error"]
        console.print(f"last model error: {_e(error.get('class'))} {_e(error.get('message') or '')}")


def _message_notes(message: dict[str, Any]) -> list[str]:
    """What a message's head line adds after it: usage, cost, first token, a re-ask, its parts."""
    extra = []
    if message.get("usage"):
        extra.append(_tokens(message["usage"]))
    if "cost" in message:
        extra.append(_money(message["cost"]))
    if message.get("ttft_ms") is not None:
        extra.append(f"first token {message['ttft_ms']:.0f} ms")
    if message.get("reask"):
        extra.append(f"re-asked after {_e(message['reask'])}")
    if message["type"] == "assistant" and message["parts"]:
        extra.append(f"{len(message['parts'])} parts")
    return extra


def _print_message(console: Console, message: dict[str, Any]) -> None:
    role = message["type"]
    marker = f" [yellow]\\[{_e(message['marker'])}][/]" if message.get("marker") else ""
    head = f"[bold]#{message['seq']} {_e(role)}[/] {_e(message['id'])}{marker}"
    extra = _message_notes(message)
    console.print(head + (f"  [dim]{'; '.join(extra)}[/]" if extra else ""))
    console.print(f"  {visible(message['text'], multiline=True)}", markup=False)
    error = message.get("error")
    if isinstance(error, dict):
        console.print(f"  [red]{_e(error.get('class'))}[/]: {_e(error.get('message'))}")
    memory = message.get("memory") or {}
    reused = " (reused after recovery)" if memory.get("reused") else ""
    for item in memory.get("items") or []:
        console.print(
            f"  [cyan]memory[/] {_e(item['kind'])} {_e(item['id'])} ({_e(item['session_id'])}, {item['score']:.2f})"
            f"{reused}: {_e(str(item['text'])[:120])}"
        )
