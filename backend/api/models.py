"""The API's request and response bodies, as the OpenAPI document describes them.

Requests refuse unknown fields (a mistyped `input_Id` is a 400 naming it, not an input admitted
without its id). Ids follow rem's rule (`backend.execution.sessions.ID_PATTERN`). Times are
integers: milliseconds since the Unix epoch, as everywhere in rem.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$"
Id = Annotated[str, Field(pattern=ID_PATTERN, max_length=100)]
# characters, an upper bound; the byte bound (256 KiB of UTF-8) is checked on admission
MAX_TEXT_CHARS = 256 * 1024
MAX_REASON_CHARS = 64 * 1024


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ErrorDetail(BaseModel):
    code: str = Field(description="What went wrong, for programs (e.g. not_found, input_conflict).")
    message: str = Field(description="One line for people: the thing, and the fix.")
    state: str | None = Field(default=None, description="wrong_state only: the state the call is in.")


class ErrorBody(BaseModel):
    error: ErrorDetail


class InputIn(Strict):
    text: str = Field(
        min_length=1, max_length=MAX_TEXT_CHARS, description="The prompt (at most 256 KiB of UTF-8)."
    )
    input_id: Id | None = Field(
        default=None,
        description="Your id for this input: admission is idempotent on it, forever "
        "(or give it as the Idempotency-Key header). Without one, rem makes one (not idempotent).",
    )
    delivery: Literal["queue", "steer"] = Field(
        default="queue", description="queue: starts the next turn; steer: joins the running turn."
    )
    project: Id | None = Field(
        default=None, description="The project of a new session (default: the token's only project)."
    )


class InputAdmitted(BaseModel):
    session_id: str
    input_id: str
    delivery: Literal["queue", "steer"]
    admitted_seq: int = Field(description="The input's place in the session's sequence.")
    duplicate: bool = Field(description="True when this id was admitted before: this is that admission.")


class Counts(BaseModel):
    messages: int
    inputs: int
    turns: int
    inputs_waiting: int = Field(description="Inputs admitted and not yet taken into a turn.")


SessionStateName = Literal["idle", "queued", "running", "held"]


class SessionSummary(BaseModel):
    id: str
    project: str
    title: str
    state: SessionStateName
    counts: Counts
    created_at: int
    updated_at: int


class SessionsPage(BaseModel):
    sessions: list[SessionSummary]
    next_cursor: str | None = Field(description="Pass as `cursor` for the next page; null on the last.")


class WaitingCall(BaseModel):
    call_id: str
    tool: str
    state: str


class Hold(BaseModel):
    reason: str = Field(description="tool_awaiting_approval, tool_outcome_unknown, or a model error's class.")
    since: int
    model_error: dict[str, Any] | None
    tool_calls: list[WaitingCall]
    lifted_by: str


class Execution(BaseModel):
    id: str
    phase: str
    step: int


class Usage(BaseModel):
    tokens: dict[str, int]
    cost: float


class SessionState(SessionSummary):
    model: str | None
    held: Hold | None
    execution: Execution | None
    usage: Usage
    last_seq: int


class Part(BaseModel):
    idx: int
    type: str
    text: str


class Message(BaseModel):
    model_config = ConfigDict(extra="allow")

    id: str
    type: str = Field(description="user, assistant, synthetic (a recovery's continuation), ...")
    seq: int
    time: int
    status: str | None
    marker: str | None
    text: str
    parts: list[Part]


class MessagesPage(BaseModel):
    session_id: str
    messages: list[Message]
    next_after: int | None = Field(description="Pass as `after` for the next page; null on the last.")


class ToolCall(BaseModel):
    model_config = ConfigDict(extra="allow")

    call_id: str
    session_id: str
    tool: str
    arguments: Any
    effect: str
    state: Literal["awaiting_approval", "unknown"]
    since: int


class ToolCallsPage(BaseModel):
    tool_calls: list[ToolCall]


class DenyIn(Strict):
    reason: str | None = Field(
        default=None, max_length=MAX_REASON_CHARS, description="Why; the model is told."
    )


class ResolveIn(Strict):
    outcome: Literal["done", "retry", "fail"]
    result: str | None = Field(
        default=None, max_length=MAX_REASON_CHARS, description="With done: the result the model sees."
    )
    reason: str | None = Field(default=None, max_length=MAX_REASON_CHARS, description="With fail: why.")


class Decision(BaseModel):
    model_config = ConfigDict(extra="allow")

    call_id: str
    session_id: str
    tool: str
    decision: str
    previous_state: str
    state: str
    unparked: bool
    decided_by: str
    decided_at: int


class RecallIn(Strict):
    query: str = Field(min_length=1, max_length=4000)
    project: Id | None = Field(default=None, description="Default: the token's only project.")
    session_id: Id | None = Field(default=None, description="Recall from this session only.")
    k: int = Field(default=10, ge=1, le=200)
    kinds: list[Literal["turn", "summary", "fact"]] | None = Field(
        default=None,
        min_length=1,
        max_length=3,
        description="Only items of these kinds (default: all three).",
    )
    all_projects: bool = Field(
        default=False, description="Search every project (a token that reaches every project only)."
    )


class Health(BaseModel):
    ok: bool


def _error(description: str) -> dict[str, Any]:
    return {"model": ErrorBody, "description": description}


# the errors every route under /v1 may answer, in the one shape
ERRORS: dict[int | str, dict[str, Any]] = {
    400: _error("Bad input: a malformed id, a body that is not the documented shape, an unknown field."),
    401: _error("No live bearer token (with `WWW-Authenticate: Bearer resource_metadata=...`)."),
    403: _error("The token lacks the route's scope, or names a project it does not reach."),
    404: _error("No such resource, or one of a project the token does not reach (the same answer)."),
    413: _error("The request body is over the bound."),
    503: _error("The state store (or Chroma, for recall) is unreachable, busy or full; retry."),
}
