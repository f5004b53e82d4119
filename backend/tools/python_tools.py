"""Python tools: the `rem.tools` entry-point group, for tools that need no server process.

A package offers tools by naming, in its entry points, an object that is a
`PythonTool`, an iterable of them, or a factory (called with no arguments)
returning either:

    [project.entry-points."rem.tools"]
    ledger = "mypkg.tools:make_tools"

    def make_tools() -> list[PythonTool]:
        return [PythonTool(name="post", description="Post an entry", input_schema={...},
                           run=post, effect="effect")]

    async def post(arguments: dict[str, Any], idempotency_key: str) -> str | dict | list: ...

The entry point's name is the NAME of `NAME.TOOL` (the same rules as a server
name; a NAME used by an MCP server too is a configuration error). `effect`
is the tool's own declaration, shown as its `annotation` source (None: the
safe default, `effect`). rem checks the arguments against `input_schema`
before calling (a mismatch is a tool error for the model, and `run` is not
called). `run` gets the call's idempotency key as its second argument;
its return value becomes the result's text (a string as it is, anything
else as JSON); an exception it raises becomes a tool error result with its
one line; running past the call's timeout is cancelled and raises `ToolTimeout`.

An entry point that cannot be loaded makes only its own tools unavailable
(its health says why). Tests register one without installing a package:
`ToolRegistry.load(entry_points=[EntryPoint(name, "module:attr", "rem.tools")])`.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from importlib.metadata import EntryPoint, entry_points
from typing import Any

from backend.core import clock
from backend.tools.effects import EffectClass
from backend.tools.errors import ToolNotFound, ToolTimeout, ToolUnavailable
from backend.tools.health import Limits, ServerHealth, ServerState, describe_error
from backend.tools.results import ToolResult, bounded_result

GROUP = "rem.tools"


@dataclass(frozen=True)
class PythonTool:
    """One tool implemented in Python: its name, what it does, its arguments' schema and the call itself."""

    name: str
    description: str
    input_schema: Mapping[str, Any]
    run: Callable[[dict[str, Any], str], Awaitable[Any]]
    effect: EffectClass | str | None = None

    def declared_effect(self) -> EffectClass | None:
        return None if self.effect is None else EffectClass(self.effect)


def installed_entry_points() -> list[EntryPoint]:
    """The `rem.tools` entry points of every installed package."""
    return sorted(entry_points(group=GROUP), key=lambda ep: ep.name)


class PythonToolSource:
    """The tools one `rem.tools` entry point offers."""

    def __init__(self, entry_point: EntryPoint, limits: Limits) -> None:
        self.name = entry_point.name
        self.entry_point = entry_point
        self.limits = limits
        self.kind = "python"
        self.tools: dict[str, PythonTool] = {}
        self.error: str | None = None
        self.since = clock.now_ms()
        self.closed = False
        try:
            self.tools = {tool.name: tool for tool in _load(entry_point)}
        except Exception as exc:  # a broken plug-in costs its own tools, not everyone's
            self.error = f"entry point {entry_point.value!r} cannot be loaded: {describe_error(exc, 0)}"

    def listing(self) -> list[PythonTool]:
        if self.error is not None:
            raise ToolUnavailable(f"tool source {self.name!r} is down: {self.error}", server=self.name)
        return list(self.tools.values())

    def health(self) -> ServerHealth:
        state = ServerState.CLOSED if self.closed else ServerState.DOWN if self.error else ServerState.UP
        return {
            "server": self.name,
            "transport": "python",
            "state": str(state),
            "since": self.since,
            "last_error": self.error,
            "restarts": 0,
            "retry_at": None,
            "pid": None,
            "tools": None if self.error else len(self.tools),
            "refused": [],
        }

    async def call(self, tool: str, arguments: dict[str, Any], key: str, timeout_ms: int) -> ToolResult:
        """Run `tool` in this process, bounded by `timeout_ms`."""
        found = {t.name: t for t in self.listing()}.get(tool)
        if found is None:
            raise ToolNotFound(f"{self.name}.{tool} is not a tool of entry point {self.name!r}")
        started = time.monotonic()
        problem = _argument_problem(found.input_schema, arguments)
        if problem is not None:
            return self._result(f"invalid arguments: {problem}", True, started)
        try:
            value = await asyncio.wait_for(found.run(dict(arguments), key), timeout_ms / 1000)
        except TimeoutError:
            raise ToolTimeout(
                f"{self.name}.{tool} did not finish within {timeout_ms} ms (cancelled)", timeout_ms=timeout_ms
            ) from None
        except Exception as exc:  # the tool's own failure is its answer to the model
            return self._result(f"{type(exc).__name__}: {exc}", True, started)
        text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)
        return self._result(text, False, started)

    def _result(self, text: str, is_error: bool, started: float) -> ToolResult:
        duration = (time.monotonic() - started) * 1000
        return bounded_result(
            text, is_error=is_error, max_bytes=self.limits.result_max_bytes, duration_ms=duration
        )

    async def aclose(self) -> None:
        self.closed = True


def _load(entry_point: EntryPoint) -> list[PythonTool]:
    target = entry_point.load()
    if callable(target) and not isinstance(target, PythonTool):
        target = target()
    tools = [target] if isinstance(target, PythonTool) else list(_iterable(target))
    for tool in tools:
        _check(tool)
    names = [tool.name for tool in tools]
    if len(set(names)) != len(names):
        raise ValueError(
            f"it offers two tools of one name ({sorted(n for n in names if names.count(n) > 1)[0]!r})"
        )
    return tools


def _iterable(target: Any) -> Iterable[Any]:
    if isinstance(target, str | bytes | Mapping) or not isinstance(target, Iterable):
        raise TypeError(f"it gives {type(target).__name__}, not PythonTool objects")
    return target


def _check(tool: Any) -> None:
    if not isinstance(tool, PythonTool):
        raise TypeError(f"it gives a {type(tool).__name__}, not a PythonTool")
    if not isinstance(tool.name, str) or not isinstance(tool.description, str):
        raise TypeError("a tool's name and description must be strings")
    if not isinstance(tool.input_schema, Mapping) or not callable(tool.run):
        raise TypeError(f"tool {tool.name!r} needs an input_schema object and an async run callable")
    tool.declared_effect()  # a bad effect class raises ValueError naming it


def _argument_problem(schema: Mapping[str, Any], arguments: Mapping[str, Any]) -> str | None:
    """Why `arguments` do not fit `schema` (one line), or None when they do."""
    import jsonschema  # import time: only Python tools with arguments pay for it

    try:
        validator = jsonschema.validators.validator_for(schema)(schema)
        error = jsonschema.exceptions.best_match(validator.iter_errors(dict(arguments)))
    except jsonschema.exceptions.SchemaError as exc:
        return f"the tool's own input schema is invalid ({exc.message})"
    if error is None:
        return None
    where = "/".join(str(part) for part in error.absolute_path) or "(arguments)"
    return f"{where}: {error.message}"[:500]
