"""`POST /v1/sessions/{session_id}/inputs`: admit an input, exactly once per id, forever.

The id is the body's `input_id` or the `Idempotency-Key` header (the same value if both). The
first admission answers 202; the same id with the same body, at any later time and on any
replica, answers that first admission again (`duplicate: true`, header `Idempotent-Replayed:
true`): the journal is the record, not a cache with an expiry. The same id with another text,
delivery or session is a 409 naming the id, and writes nothing. Without an id rem makes one,
and a retry admits a second input: a client that may retry sends an id.

It is the API's hot path: `fast_admission` answers most requests to it before they reach FastAPI,
as this route would.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Header, Path, Request, Response

from backend import ops
from backend.api.auth import Writer, acting, context_of
from backend.api.models import ERRORS, ID_PATTERN, ErrorBody, InputAdmitted, InputIn
from backend.api.scope import one_answer
from backend.core.errors import BadInput
from backend.execution.sessions import ID_RULE, validate_id

router = APIRouter(prefix="/v1", tags=["inputs"], responses=ERRORS)

SessionId = Annotated[str, Path(pattern=ID_PATTERN, max_length=100, description="The session's id.")]
IdempotencyKey = Annotated[
    str | None,
    Header(
        alias="Idempotency-Key",
        max_length=100,
        description=f"The input's id ({ID_RULE}), if not in the body: admission is idempotent on it.",
    ),
]


def input_id_of(body_id: str | None, header: str | None) -> str | None:
    """The input's id from the body or the `Idempotency-Key` header; both must agree."""
    if header is not None:
        validate_id("Idempotency-Key", header, "the Idempotency-Key header")
        if body_id is not None and body_id != header:
            raise BadInput(
                f"input_id {body_id!r} and Idempotency-Key {header!r} differ: give one, or the same in both"
            )
    return body_id or header


def answer_headers(admitted: dict[str, Any]) -> dict[str, str]:
    """Where the input is, and whether this answer replays its first admission."""
    headers = {"Location": f"/v1/inputs/{admitted['input_id']}"}
    if admitted["duplicate"]:
        headers["Idempotent-Replayed"] = "true"
    return headers


@router.post(
    "/sessions/{session_id}/inputs",
    status_code=202,
    response_model=InputAdmitted,
    summary="Admit an input into a session (created on first use); idempotent on its id.",
    openapi_extra={"x-rem-scope": "write"},
    responses={409: {"model": ErrorBody, "description": "The id was admitted with another body."}},
)
async def admit_input(
    request: Request,
    response: Response,
    session_id: SessionId,
    body: InputIn,
    who: Writer,
    idempotency_key: IdempotencyKey = None,
) -> dict[str, Any]:
    input_id = input_id_of(body.input_id, idempotency_key)
    with one_answer(session_id):
        admitted = await ops.send(
            acting(context_of(request), who),
            session_id,
            body.text,
            delivery=body.delivery,
            input_id=input_id,
            project=body.project,
            projects=who.projects,
        )
    response.headers.update(answer_headers(admitted))
    return {key: admitted[key] for key in ("session_id", "input_id", "delivery", "admitted_seq", "duplicate")}
