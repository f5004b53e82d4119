"""The CLI as a client of `rem serve`: `rem send|show|approve|deny|resolve|recall --server URL`.

With `--server URL` (or REM_SERVER) those commands go through the API instead
of the local store: the server runs the same `backend.ops` functions, kept to
the token's projects and scopes and journaled with the token's name. This
module is their one HTTP client (httpx2, imported only when a command is given
a server: `rem --help` and a local `rem send` never load it); `backend.api.follow`
follows a reply for `rem send --follow`.

The token comes from the file REM_TOKEN_FILE names, never from argv or an
environment variable's value, and the file must be yours and private (mode 0600
or stricter), as rem's other key files (`private.private_to_owner`). It goes
only to the server given, in the `Authorization` header: plain http is refused
unless the server is on this machine's loopback (a bearer token sent across a
network in clear is given away), and redirects are never followed.

The API's refusals come back as rem's own errors carrying the API's one-line
message (`REFUSALS`), so a command exits as it does on the local store: a 404
is a NotFound (1), a 400 a BadInput (2), a 409 on a tool call a refusal (1), a
503 an unreachable store (3). A server that does not answer, or answers as no
`rem serve` would, is a `ServerUnreachable` (3) naming the URL and the fix.
"""

from __future__ import annotations

import ipaddress
import json
import os
import stat
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import quote, urlsplit

import httpx2

from backend.core import private
from backend.core.errors import (
    BadInput,
    ChromaUnreachable,
    DatabaseFull,
    DatabaseIOError,
    DatabaseLocked,
    DatabaseUnreachable,
    InputConflict,
    NotFound,
    OutOfReach,
    ReadOnly,
    Refused,
    RemError,
    ServerUnreachable,
    SessionNotFound,
    UsageError,
)
from backend.core.inert import visible
from backend.core.redact import has_credentials, redact_url
from backend.core.settings import Settings, settings
from backend.execution import sessions
from backend.ops.operator_input import operator_id, operator_reason

T = TypeVar("T")

CONNECT_TIMEOUT_S = 10.0
READ_TIMEOUT_S = 60.0  # recall and status may take seconds; an event stream has its own (follow)
# the largest answer read: a transcript page holds at most 4 MiB of text, which JSON may spell in 6x
MAX_RESPONSE_BYTES = 64 * 1024 * 1024
MAX_TOKEN_CHARS = 128  # backend.ops.tokens.MAX_TOKEN_CHARS (tested equal; importing it loads the store)
MAX_URL_CHARS = 2000
MAX_MESSAGE_CHARS = 500
PAGE = 100  # messages per transcript page (the API's most)
TOKEN_HELP = (
    "put the token `rem token create` prints in a file only you can read and name it in REM_TOKEN_FILE, "
    "e.g. `(umask 077; rem token create me --project P --scope read --scope write > ~/.rem-token)`"
)

# the API's error code -> the error rem raises for the same refusal on the local store
REFUSALS: dict[str, type[RemError]] = {
    "bad_request": BadInput,
    "payload_too_large": BadInput,
    "input_conflict": InputConflict,
    "unauthorized": UsageError,
    "insufficient_scope": Refused,
    "forbidden": OutOfReach,
    "read_only": ReadOnly,
    "not_found": NotFound,
    "wrong_state": Refused,
    "conflict": Refused,
    "store_busy": DatabaseLocked,
    "store_unreachable": DatabaseUnreachable,
    "store_full": DatabaseFull,
    "store_io": DatabaseIOError,
    "chroma_unreachable": ChromaUnreachable,
    "draining": ServerUnreachable,
}
# what a proxy or load balancer answers when no server is behind it
GATEWAY = frozenset({502, 503, 504})


# -- where, and as whom ----------------------------------------------------------------------------
def server_url(raw: str) -> str:
    """The server's base URL, checked: http(s), a host, nothing else but a port and a path; plain
    http only to this machine's loopback."""
    text = raw.strip()
    try:
        parts = urlsplit(text)
        parts.port  # noqa: B018  (a port out of range or not a number raises here)
    except ValueError:
        parts = None
    if (
        parts is None
        or len(text) > MAX_URL_CHARS
        or parts.scheme not in ("http", "https")
        or not parts.hostname
        or parts.query
        or parts.fragment
        or has_credentials(text)
    ):
        shown = visible(redact_url(text[:200]))
        raise UsageError(
            f"{shown!r} is not a server's URL (--server, REM_SERVER): give the http(s)://HOST:PORT a "
            "`rem serve` printed (no user:password@: the token goes in REM_TOKEN_FILE)"
        )
    if parts.scheme == "http" and not _loopback(parts.hostname):
        raise UsageError(
            f"the server {visible(text)!r} is plain http to another host: the token would cross the "
            "network in clear; serve rem behind a TLS proxy and give its https:// URL"
        )
    return text.rstrip("/")


def _loopback(host: str) -> bool:
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def read_token(path: Path | None) -> str:
    """The bearer token in `path` (REM_TOKEN_FILE): refused unless the file is yours and private."""
    env = Settings.token_file.env
    if path is None:
        raise UsageError(f"--server needs a token and {env} is not set: {TOKEN_HELP}")
    where = f"{env}={str(path)!r}"
    try:  # O_NONBLOCK: a FIFO put there is opened, refused as not a file, never waited on
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError as exc:
        raise UsageError(f"{where} cannot be read ({exc.strerror}); check the path") from None
    try:
        st = os.fstat(fd)  # the file opened, not whatever the path names a moment later
        if not stat.S_ISREG(st.st_mode):
            raise UsageError(f"{where} is not a file; {TOKEN_HELP}")
        _check_private(where, path, st)
        raw = os.read(fd, 4 * MAX_TOKEN_CHARS + 1)
    except OSError as exc:
        raise UsageError(f"{where} cannot be read ({exc.strerror}); check the path") from None
    finally:
        os.close(fd)
    try:
        token = raw.decode("utf-8").strip()
    except UnicodeDecodeError:
        token = "\x00"
    if not token:
        raise UsageError(f"{where} is empty; {TOKEN_HELP}")
    if len(token) > MAX_TOKEN_CHARS or not token.isprintable() or any(c.isspace() for c in token):
        # the file's text is never shown: it may be a secret of something else
        raise UsageError(f"{where} does not hold one token (one line, as `rem token create` prints it)")
    return token


def _check_private(where: str, path: Path, st: os.stat_result) -> None:
    if private.private_to_owner(st):
        return
    if st.st_uid != os.geteuid():
        owner = private.user_name(st.st_uid)
        raise UsageError(
            f"{where} is owned by {owner} (uid {st.st_uid}), not by you: a token file must be your own "
            "(copy the token into a file of yours, mode 600)"
        )
    raise UsageError(
        f"{where} may be read by others (mode {stat.S_IMODE(st.st_mode):03o}): a token is a secret; "
        f"`chmod 600 {path}` (and consider revoking the token: `rem token revoke NAME`)"
    )


# -- one server ------------------------------------------------------------------------------------
class Remote:
    """One `rem serve` and the token sent to it: the commands' HTTP client."""

    def __init__(self, url: str, token: str) -> None:
        self.url = url
        self.http = httpx2.Client(
            base_url=url,
            headers={"Authorization": f"Bearer {token}", "User-Agent": "rem-cli"},
            timeout=httpx2.Timeout(READ_TIMEOUT_S, connect=CONNECT_TIMEOUT_S),
            follow_redirects=False,  # a redirect could carry the token to another server
        )

    def close(self) -> None:
        self.http.close()

    def call(
        self,
        method: str,
        path: str,
        *,
        body: dict[str, Any] | None = None,
        params: dict[str, Any] | None = None,
        if_sent: str = "",
    ) -> dict[str, Any]:
        """One request's JSON object; a refusal raised as rem's error (`if_sent`: added to the error
        when the request may have reached the server before its connection broke)."""
        try:
            with self.http.stream(method, path, json=body, params=params) as response:
                payload = self.read(response)
        except httpx2.HTTPError as exc:
            raise self.unreachable(exc, if_sent) from None
        if not response.is_success:
            raise self.refusal(response.status_code, payload)
        document = _json(payload)
        if not isinstance(document, dict):
            raise self.not_rem(response.status_code)
        return document

    @contextmanager
    def stream(self, path: str, headers: dict[str, str], read_timeout_s: float) -> Iterator[httpx2.Response]:
        """An event stream's response, once the server answered 200 (a refusal raised as rem's error;
        transport errors propagate, for the follower to reconnect)."""
        timeout = httpx2.Timeout(read_timeout_s, connect=CONNECT_TIMEOUT_S)
        with self.http.stream("GET", path, headers=headers, timeout=timeout) as response:
            if response.status_code != 200:
                raise self.refusal(response.status_code, self.read(response))
            yield response

    def read(self, response: httpx2.Response) -> bytes:
        """A response's body, refused past MAX_RESPONSE_BYTES (never held whole beyond it)."""
        chunks, size = [], 0
        for chunk in response.iter_bytes():
            size += len(chunk)
            if size > MAX_RESPONSE_BYTES:
                raise ServerUnreachable(
                    f"the server at {self.url} answered more than {MAX_RESPONSE_BYTES} bytes; "
                    "is --server a `rem serve`?"
                )
            chunks.append(chunk)
        return b"".join(chunks)

    def unreachable(self, exc: httpx2.HTTPError, if_sent: str = "") -> ServerUnreachable:
        """The error for a request that got no answer: the URL, what happened, the fix."""
        reason = visible(" ".join(str(exc).split())[:200]) or type(exc).__name__
        if isinstance(exc, (httpx2.ConnectError, httpx2.ConnectTimeout)):
            return ServerUnreachable(
                f"cannot reach the rem server at {self.url} ({reason}): start it (`rem serve`), or "
                "point --server (or REM_SERVER) at one that runs"
            )
        return ServerUnreachable(
            f"the connection to the rem server at {self.url} broke before its answer ({reason}){if_sent}"
        )

    def refusal(self, status: int, payload: bytes) -> RemError:
        """A non-2xx answer as rem's error: the API's code and message, else what the status says."""
        document = _json(payload)
        error = document.get("error") if isinstance(document, dict) else None
        if not isinstance(error, dict) or not isinstance(error.get("message"), str):
            if status in GATEWAY:
                return ServerUnreachable(
                    f"the rem server at {self.url} is not there (a proxy answered {status}): start it "
                    "(`rem serve`), or point --server (or REM_SERVER) at one that runs"
                )
            return self.not_rem(status)
        message = visible(" ".join(error["message"].split())[:MAX_MESSAGE_CHARS])
        code = str(error.get("code"))
        if code == "unauthorized":
            message += f" (the token in {Settings.token_file.env})"
        kind = REFUSALS.get(code, ServerUnreachable if status in GATEWAY else RemError)
        return kind(message)

    def not_rem(self, status: int) -> UsageError:
        return UsageError(
            f"the server at {self.url} answered {status} as no `rem serve` does; is --server (or "
            "REM_SERVER) the URL `rem serve` printed?"
        )


def _json(payload: bytes) -> Any:
    try:
        return json.loads(payload)
    except ValueError:
        return None


def connect(url: str) -> Remote:
    """A client of the server at `url` (`--server`, REM_SERVER), with the token from REM_TOKEN_FILE."""
    return Remote(server_url(url), read_token(settings.token_file))


def through(url: str, operation: Callable[[Remote], T]) -> T:
    """Run `operation` against the server at `url` (connected here, closed after)."""
    remote = connect(url)
    try:
        return operation(remote)
    finally:
        remote.close()


def segment(value: str) -> str:
    """An id as one path segment (ids are plain; a call id is quoted whatever it holds)."""
    return quote(value, safe="")


# -- the commands' operations ----------------------------------------------------------------------
def send(
    remote: Remote,
    session_id: str,
    text: str,
    *,
    delivery: str = "queue",
    input_id: str | None = None,
    project: str | None = None,
) -> dict[str, Any]:
    """`rem send`: admit an input, idempotent on its id (made here when not given, so a retry of a
    request whose answer was lost admits it once)."""
    sessions.validate_input(
        session_id, text, delivery, input_id, project
    )  # the local refusals, word for word
    input_id = input_id or sessions.new_input_id()
    body: dict[str, Any] = {"text": text, "input_id": input_id, "delivery": delivery}
    if project is not None:
        body["project"] = project
    return remote.call(
        "POST",
        f"/v1/sessions/{segment(session_id)}/inputs",
        body=body,
        if_sent=f"; it may have been admitted: send it again with --id {input_id} (admitted once, whatever "
        "happened)",
    )


def live_end(remote: Remote) -> str | None:
    """The journal's live end as a cursor (the priming `id:` of the project stream, which starts
    there): every event written after this call comes after it, in any stream."""
    try:
        with remote.stream("/v1/events", {}, READ_TIMEOUT_S) as response:
            for event in httpx2.EventSource(response):
                return event.id or None
    except httpx2.HTTPError as exc:
        raise remote.unreachable(exc) from None
    return None


def show(remote: Remote, session_id: str, *, last: int = 0) -> dict[str, Any]:
    """`rem show`: the session's state and its transcript (the `last` messages only, when > 0)."""
    if not sessions.ID_PATTERN.fullmatch(session_id):
        # the API refuses a malformed id (400); the local store finds no such session (exit 1)
        raise SessionNotFound(
            f"no session {session_id[:200]!r}; GET /v1/sessions lists the ones this token reaches"
        )
    path = f"/v1/sessions/{segment(session_id)}"
    state = remote.call("GET", path)
    messages: deque[dict[str, Any]] = deque(maxlen=last or None)
    after: int | None = 0
    while after is not None:
        page = remote.call("GET", f"{path}/messages", params={"after": after, "limit": PAGE})
        messages.extend(page["messages"])
        after = page["next_after"]
    return transcript(state, list(messages))


def transcript(state: dict[str, Any], messages: list[dict[str, Any]]) -> dict[str, Any]:
    """`rem show --json`'s document from what the API gives: the same `session` and `messages`; the
    execution as far as the API shows it, the hold and how many inputs wait (no waiting texts,
    recoveries or tool-call history: those are the store's, `rem show` on its host)."""
    held, usage, counts = state.get("held") or {}, state["usage"], state["counts"]
    session = {
        "id": state["id"],
        "project": state["project"],
        "title": state["title"],
        "model": state["model"],
        "turn_count": counts["turns"],
        "message_count": counts["messages"],
        "input_count": counts["inputs"],
        "last_seq": state["last_seq"],
        "cost": usage["cost"],
        "usage": usage["tokens"],
        "held_at": held.get("since"),
        "held_reason": held.get("reason"),
        "model_error": held.get("model_error"),
        "time_created": state["created_at"],
        "time_updated": state["updated_at"],
    }
    return {
        "session": session,
        "state": state["state"],
        "messages": messages,
        "execution": state["execution"],
        "held": state["held"],
        "inputs_waiting": counts["inputs_waiting"],
    }


def approve(remote: Remote, call_id: str) -> dict[str, Any]:
    """`rem approve`: the call runs when its turn resumes."""
    return remote.call("POST", f"/v1/tool-calls/{segment(operator_id('tool call id', call_id))}/approve")


def deny(remote: Remote, call_id: str, reason: str | None = None) -> dict[str, Any]:
    """`rem deny`: the call never runs; the model is told (and why)."""
    path = f"/v1/tool-calls/{segment(operator_id('tool call id', call_id))}/deny"
    reason = operator_reason(reason)
    return remote.call("POST", path, body=None if reason is None else {"reason": reason})


def resolve(remote: Remote, call_id: str, choice: str, text: str | None = None) -> dict[str, Any]:
    """`rem resolve`: done (with its result), retry, or fail (with why)."""
    path = f"/v1/tool-calls/{segment(operator_id('tool call id', call_id))}/resolve"
    body: dict[str, Any] = {"outcome": choice}
    if text is not None:
        body["result" if choice == "done" else "reason"] = operator_reason(text)
    return remote.call("POST", path, body=body)


def recall(
    remote: Remote,
    query: str,
    *,
    project: str | None = None,
    session_id: str | None = None,
    k: int = 10,
    all_projects: bool = False,
    kinds: tuple[str, ...] | None = None,
) -> dict[str, Any]:
    """`rem recall`: the ranked items, as `rem recall --json` prints them."""
    body: dict[str, Any] = {"query": query, "k": k}
    for key, value in (("project", project), ("session_id", session_id), ("kinds", kinds)):
        if value is not None:
            body[key] = list(value) if isinstance(value, tuple) else value
    if all_projects:
        body["all_projects"] = True
    return remote.call("POST", "/v1/recall", body=body)
