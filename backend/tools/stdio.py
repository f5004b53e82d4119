"""The stdio transport rem uses for MCP servers it starts: the SDK's protocol, rem's bounds and logging.

rem does not use the SDK's `stdio_client` because it reads a server's stdout
lines without limit and sends stderr to a file handle. This transport speaks
the same protocol (newline-delimited JSON-RPC, the SDK's message types and
`ClientSession` on top) and adds what rem needs:

* stdout is read through a `LineBuffer`: one message is at most
  `max_message_bytes`; an over-long answer is discarded as it streams and its
  request answered with an error (`backend.tools.lines`); so is an answer rem
  cannot read (not JSON in UTF-8, not a JSON-RPC message), at once, while one
  whose only fault is a lone-surrogate escape is read with U+FFFD in its place;
* stderr goes to the log (`rem.tools.server`, INFO, one line per line, each
  bounded and inert, at the rate the server's `LogValve` allows), never to
  rem's terminal; its last lines are kept for the error an operator sees when
  the server dies;
* the child runs in its own session (process group) with the SDK's safe
  environment plus the configured `env`, in the configured `cwd`, once the
  files it runs from pass `StdioServer.exposed` again; this process is made
  non-dumpable first (`private.make_undumpable`: the server, running as this
  user, cannot read this process's environment or memory); closing the
  transport closes stdin, waits `STOP_GRACE_S`, then SIGTERMs and SIGKILLs
  the whole group;
* `StdioState` tells the caller what the SDK cannot: whether the link is lost
  (stdout ended or stdin broke), the exit status, and which tool calls were
  provably never delivered (their write to stdin failed), by idempotency key.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
from collections import deque
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass, field
from typing import Any

import anyio
import mcp_types as types
from anyio.abc import Process
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from mcp.client.stdio import get_default_environment
from mcp.shared.message import SessionMessage
from pydantic import ValidationError

from backend.core import private
from backend.tools.config import StdioServer
from backend.tools.lines import (
    LineBuffer,
    Overflow,
    lenient_message,
    message_problem,
    oversize_answer,
    unreadable_answer,
)
from backend.tools.results import inert
from backend.tools.spec import KEY_META
from backend.tools.valve import LogValve

log = logging.getLogger("rem.tools.server")

CHUNK = 64 * 1024
STDERR_LINE_MAX = 8192
STDERR_TAIL = 20
STOP_GRACE_S = 2.0
EXIT_POLL_S = 0.02


class StartFailed(Exception):
    """The server's process could not be started (no such command, bad cwd)."""


@dataclass
class StdioState:
    """What the transport knows about its server process, for health and for calls' fates."""

    name: str
    pid: int | None = None
    process: Process | None = None
    lost: anyio.Event = field(default_factory=anyio.Event)
    unsent: set[str] = field(default_factory=set)  # idempotency keys of tools/call never delivered
    stderr_tail: deque[str] = field(default_factory=lambda: deque(maxlen=STDERR_TAIL))
    valve: LogValve | None = None  # what of its stderr and stray stdout reaches the log

    def exit_description(self) -> str:
        """How the process ended ("exited with code 1", "killed by SIGKILL"), with its last stderr line."""
        code = None if self.process is None else self.process.returncode
        if code is None:
            what = "closed its stdout"
        elif code < 0:
            what = f"was killed by {_signal_name(-code)}"
        else:
            what = f"exited with code {code}"
        last = self.stderr_tail[-1] if self.stderr_tail else ""
        return f"{what}: {last[:300]}" if last else what


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _executable(server: StdioServer, env: dict[str, str]) -> str:
    if not server.cwd.is_dir():
        raise StartFailed(f"its cwd {str(server.cwd)!r} is not a folder")
    if (untrusted := server.exposed()) is not None:  # checked when the config was read: again, as it runs
        key, exposed = untrusted
        raise StartFailed(f"its {key}: {exposed.what}, so another user could change it; {exposed.fix}")
    if os.sep in server.command:
        return server.command
    found = shutil.which(server.command, path=env.get("PATH", os.defpath))
    if found is None:
        raise StartFailed(f"command {server.command!r} is not found on its PATH")
    return found


@asynccontextmanager
async def stdio_transport(
    server: StdioServer, state: StdioState, *, max_message_bytes: int
) -> AsyncIterator[tuple[MemoryObjectReceiveStream[Any], MemoryObjectSendStream[SessionMessage]]]:
    """Start `server` and yield the (read, write) streams a `ClientSession` takes."""
    env = get_default_environment() | dict(server.env)
    argv = [_executable(server, env), *server.args]
    private.make_undumpable()  # the server runs as this user: keep this process's environ and memory from it
    try:
        process = await anyio.open_process(argv, env=env, cwd=str(server.cwd), start_new_session=True)
    except OSError as exc:
        raise StartFailed(f"cannot run {server.command!r}: {exc.strerror or exc}") from None
    state.process, state.pid = process, process.pid
    read_writer, read_stream = anyio.create_memory_object_stream[Any](0)
    write_stream, write_reader = anyio.create_memory_object_stream[SessionMessage](0)
    link = _Link(server.name, process, state, read_writer, write_reader, max_message_bytes)
    async with anyio.create_task_group() as tasks:
        tasks.start_soon(link.read_stdout)
        tasks.start_soon(link.read_stderr)
        tasks.start_soon(link.write_stdin)
        try:
            yield read_stream, write_stream
        finally:
            with anyio.CancelScope(shield=True):
                await _stop(process)
                for stream in (read_stream, write_stream, read_writer, write_reader):
                    stream.close()
            tasks.cancel_scope.cancel()


class _Link:
    """The three pipe tasks of one server process."""

    def __init__(
        self,
        name: str,
        process: Process,
        state: StdioState,
        read_writer: MemoryObjectSendStream[Any],
        write_reader: MemoryObjectReceiveStream[SessionMessage],
        max_message_bytes: int,
    ) -> None:
        self.name = name
        self.process = process
        self.state = state
        self.read_writer = read_writer
        self.write_reader = write_reader
        self.max_message_bytes = max_message_bytes

    async def read_stdout(self) -> None:
        assert self.process.stdout is not None
        lines = LineBuffer(self.max_message_bytes)
        try:
            while True:
                try:
                    chunk = await self.process.stdout.receive(CHUNK)
                except (anyio.EndOfStream, anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
                    return
                for item in lines.feed(chunk):
                    message = self._message(item)
                    if message is not None:
                        await self.read_writer.send(message)
        except (anyio.ClosedResourceError, anyio.BrokenResourceError):
            return  # the session is gone
        finally:
            self._lose()

    def _message(self, item: bytes | Overflow) -> SessionMessage | None:
        if isinstance(item, Overflow):
            answer = oversize_answer(item.head, self.max_message_bytes)
            log.warning("%s: a message over %d bytes was discarded", self.name, self.max_message_bytes)
            if answer is None:
                return None
            return SessionMessage(types.jsonrpc_message_adapter.validate_python(answer, by_name=False))
        if not item.strip():
            return None
        try:
            return SessionMessage(types.jsonrpc_message_adapter.validate_json(item, by_name=False))
        except ValueError:
            return self._unreadable(item)

    def _unreadable(self, item: bytes) -> SessionMessage | None:
        """A line the SDK's parser refused: read it leniently, else answer the request it was for with an error."""
        parsed, why = lenient_message(item)
        if parsed is not None:
            try:
                return SessionMessage(types.jsonrpc_message_adapter.validate_python(parsed, by_name=False))
            except ValidationError as exc:
                why = message_problem(parsed, exc)
        answer = unreadable_answer(item, parsed, why)
        if self._loggable():
            what = "an answer" if answer is not None else "a stdout line that is not a JSON-RPC message"
            text = inert(item[:200].decode("utf-8", "replace"))
            log.warning("%s: %s rem cannot read (%s): %s", self.name, what, why, text)
        if answer is None:
            return None
        return SessionMessage(types.jsonrpc_message_adapter.validate_python(answer, by_name=False))

    def _loggable(self) -> bool:
        return self.state.valve is None or self.state.valve.admit()

    async def read_stderr(self) -> None:
        assert self.process.stderr is not None
        lines = LineBuffer(STDERR_LINE_MAX)
        with suppress(anyio.EndOfStream, anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
            while True:
                for item in lines.feed(await self.process.stderr.receive(CHUNK)):
                    raw = item.head + b" [cut]" if isinstance(item, Overflow) else item
                    text = inert(raw.decode("utf-8", "replace").rstrip())
                    if text:
                        self.state.stderr_tail.append(text)
                        if self._loggable():
                            log.info("%s: %s", self.name, text)

    async def write_stdin(self) -> None:
        assert self.process.stdin is not None
        async with self.write_reader:
            async for message in self.write_reader:
                data = message.message.model_dump_json(by_alias=True, exclude_unset=True) + "\n"
                try:
                    await self.process.stdin.send(data.encode("utf-8"))
                except (anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
                    self._unsent(message)
                    break
        self._lose()

    def _unsent(self, message: SessionMessage) -> None:
        """Remember a tools/call whose write failed: the server never read it, so it never ran."""
        request = message.message
        if isinstance(request, types.JSONRPCRequest) and request.method == "tools/call":
            meta = (request.params or {}).get("_meta") or {}
            if isinstance(meta.get(KEY_META), str):
                self.state.unsent.add(meta[KEY_META])

    def _lose(self) -> None:
        """The link is over: the session's waiters get "connection closed" now, not at their timeouts."""
        self.state.lost.set()
        self.read_writer.close()


async def _stop(process: Process) -> None:
    """Close stdin, give the server STOP_GRACE_S to exit, then SIGTERM and SIGKILL its process group."""
    if process.stdin is not None:
        with suppress(OSError, anyio.BrokenResourceError, anyio.ClosedResourceError):
            await process.stdin.aclose()
    for sig in (None, signal.SIGTERM, signal.SIGKILL):
        if sig is not None:
            with suppress(ProcessLookupError, PermissionError):
                os.killpg(process.pid, sig)
        if await _exited(process, STOP_GRACE_S):
            break
    with suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)  # whatever else it started in its group
    for pipe in (process.stdout, process.stderr):
        if pipe is not None:
            with suppress(OSError, anyio.BrokenResourceError, anyio.ClosedResourceError):
                await pipe.aclose()


async def _exited(process: Process, timeout_s: float) -> bool:
    # poll returncode: process.wait() would also wait for pipes a grandchild may hold open
    with anyio.move_on_after(timeout_s):
        while process.returncode is None:
            await anyio.sleep(EXIT_POLL_S)
        return True
    return False
