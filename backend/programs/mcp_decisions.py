"""`rem mcp --allow-writes --allow-decisions`: the operator's decisions on agent tool calls, over MCP.

The same `backend.ops` functions as `rem approve|deny|resolve` and the console's `a`, `n`, `o`:

* `list_tool_calls_waiting()`: `rem status --json`'s `tools.awaiting_approval` and
  `tools.unknown_outcome` (`ops.tool_calls_waiting`), kept to the server's scope;
* `approve_tool_call(call_id)`, `deny_tool_call(call_id, reason)`: a call awaiting approval;
* `resolve_tool_call(call_id, choice, result, reason)`: an unknown outcome, `done` (with its
  `result`), `retry` or `fail` (with a `reason`).

The gate. A decision lets an agent's effect run (a mail, a payment) or settles one nobody
knows happened; it is the person's half of an approval, and an MCP client is often another
agent. So these tools need a flag of their own, `--allow-decisions`, on top of
`--allow-writes` (read-only stays read-only): `--allow-writes` alone offers `add_memory` and
no decision, so a server configured before these tools existed grants no more than it did.
The list comes with the decisions: it is what they are taken on, and it shows the calls'
arguments (recipients, payloads) that the memory tools never show.

The actor. Each decision is journaled as the CLI's is (`operator.approve|deny|resolve`, a
refusal `operator.refused`), its actor the context's operator: `rem mcp` runs with
`rem mcp (OPERATOR)` (`mcp_server.mcp_operator`), as a reindex's recovery is
`rem reindex (OPERATOR)`, so the journal says the decision came through MCP and for whom; the
row's `os_uid` and `os_user` name who ran the server, which no client can claim.

Scope. A call of a session outside the served projects is not found, in the words an unknown
id is (the client learns nothing of it), and the refusal is journaled. Every error reaches
the client as one line through `RemMCPServer.call_tool`.
"""

from __future__ import annotations

from typing import Annotated, Any

from mcp.server.mcpserver import MCPServer
from mcp.types import ToolAnnotations
from pydantic import Field

from backend import ops
from backend.core.errors import BadInput
from backend.ops.actions import refusals_journaled
from backend.ops.operator_input import operator_id
from backend.ops.tool_decisions import Choice, ToolCallNotFound
from backend.programs.mcp_scope import Bound, Scope
from backend.runtime.context import Context

CallId = Annotated[
    str, Field(description="The tool call's id, as list_tool_calls_waiting shows it (call_id).")
]
Reason = Annotated[str | None, Field(description="Why, in a sentence; the model is told it.")]
Resolution = Annotated[
    Choice,
    Field(
        description="done: it happened (give `result`); retry: it did not, run it again with the "
        "same idempotency key; fail: it must not happen (give a `reason`)."
    ),
]
Result = Annotated[
    str | None, Field(description="With done: what the tool returned, as the model is to see it.")
]

# A decision is taken once and cannot be taken back: approve lets an effect run, deny and a
# resolution end a call, retry runs it again. A repeat is refused (and journaled as
# `operator.refused`), never applied twice, so it is not idempotent in MCP's sense (the second
# answer and the journal differ). Approve and resolve let a tool act on the world outside rem.
DECIDES = ToolAnnotations(
    read_only_hint=False, destructive_hint=True, idempotent_hint=False, open_world_hint=True
)
LISTS = ToolAnnotations(title="Tool calls waiting", read_only_hint=True, open_world_hint=False)
# the call's project, to keep a decision to the server's scope
CALL_PROJECT_SQL = (
    "SELECT s.project FROM tool_call AS c JOIN session AS s ON s.id = c.session_id WHERE c.id = ?"
)


def add_decision_tools(server: MCPServer[None], bound: Bound) -> None:
    """The list of calls waiting and the three decisions, each on the context and scope of `bound()`."""

    @server.tool(
        description="The agent tool calls waiting for an operator, oldest first: awaiting_approval "
        "(approve or deny them) and unknown_outcome (resolve them), each with its call_id, session, "
        "tool, arguments, effect class and age, as rem status --json lists them.",
        annotations=LISTS,
    )
    async def list_tool_calls_waiting() -> dict[str, Any]:
        ctx, scope = bound()
        return {**await ops.tool_calls_waiting(ctx, projects=scope.projects)}

    _add_approval_tools(server, bound)
    _add_resolve_tool(server, bound)


def _add_approval_tools(server: MCPServer[None], bound: Bound) -> None:
    @server.tool(
        description="Approve a tool call awaiting approval: it runs, once, with its idempotency key, "
        "when its turn resumes. Read its arguments first.",
        annotations=DECIDES.model_copy(update={"title": "Approve a tool call"}),
    )
    async def approve_tool_call(call_id: CallId) -> dict[str, Any]:
        ctx, scope = bound()
        await _in_scope(ctx, scope, call_id, "approve")
        return {**await ops.approve(ctx, call_id)}

    @server.tool(
        description="Deny a tool call awaiting approval: it never runs, and the model is told so "
        "(and the reason).",
        annotations=DECIDES.model_copy(update={"title": "Deny a tool call", "open_world_hint": False}),
    )
    async def deny_tool_call(call_id: CallId, reason: Reason = None) -> dict[str, Any]:
        ctx, scope = bound()
        await _in_scope(ctx, scope, call_id, "deny")
        return {**await ops.deny(ctx, call_id, reason)}


def _add_resolve_tool(server: MCPServer[None], bound: Bound) -> None:
    @server.tool(
        description="Decide a tool call whose outcome is unknown (an effect in flight when its executor "
        "died): check the tool's own records first, then done, retry or fail.",
        annotations=DECIDES.model_copy(update={"title": "Resolve an unknown outcome"}),
    )
    async def resolve_tool_call(
        call_id: CallId, choice: Resolution, result: Result = None, reason: Reason = None
    ) -> dict[str, Any]:
        text = _resolution_text(choice, result, reason)
        ctx, scope = bound()
        await _in_scope(ctx, scope, call_id, "resolve")
        return {**await ops.resolve(ctx, call_id, choice, text)}


def _resolution_text(choice: Choice, result: str | None, reason: str | None) -> str | None:
    """The text `ops.resolve` takes: the result with done, the reason with fail, none with retry."""
    if result is not None and choice != "done":
        raise BadInput("result goes with choice done; give a reason with fail, nothing with retry")
    if reason is not None and choice != "fail":
        raise BadInput("reason goes with choice fail; give a result with done, nothing with retry")
    return result if choice == "done" else reason


async def _in_scope(ctx: Context, scope: Scope, call_id: str, action: str) -> None:
    """Refuse a call outside the scope as an unknown one, journaled as the library's refusals are
    (a malformed id, like an over-long one, is refused first, and never journaled)."""
    operator_id("tool call id", call_id)
    if scope.projects is None:
        return  # every project: the library names an unknown id itself
    db = await ctx.db()
    if await db.scalar(CALL_PROJECT_SQL, (call_id,)) not in scope.projects:
        async with refusals_journaled(ctx, action, call_id):
            raise ToolCallNotFound(
                f"no tool call {call_id!r} in {scope.describe()}; list_tool_calls_waiting lists the calls "
                "waiting for a decision"
            )
