"""`ToolRegistry`: every tool an agent may call, from MCP servers and `rem.tools` entry points, in one place.

The interface the executor codes against (one registry per process and event loop):

    registry = await ToolRegistry.load()          # REM_MCP_CONFIG + installed rem.tools entry points
    specs = await registry.catalogue()            # list[ToolSpec]: every tool, servers started as needed
    offered = [s.openai_tool() for s in specs if s.available and s.permission != "deny"]
    spec = await registry.spec("notes.notes_add") # or "notes__notes_add"; ToolNotFound / ToolUnavailable
    result = await registry.call(spec.name, {"text": "hi"}, idempotency_key=key)   # -> ToolResult
    part_text, shown = result.text, result.for_model(registry.limits.model_max_bytes)
    registry.health()                             # list[ServerHealth], one per source (JSON)
    registry.health_changes                       # moves when a source's health may have changed
    await registry.aclose()                       # or: async with await ToolRegistry.load() as registry

* `load(config_path=..., entry_points=..., limits=...)` reads the settings once;
  it raises `ToolConfigError` (one line) for any configuration mistake, incl.
  a `rem.tools` key naming no source and a NAME used twice. It starts nothing.
* `catalogue()` lists each source's tools (an MCP server's listing is cached
  per session; a server that says its list changed is listed again). Tools of
  a server that is down keep their last spec with `available=False` and
  `unavailable_reason`; a server never listed shows only the tools its
  configuration names (`spec` of any other of its tools raises `ToolUnavailable`,
  not `ToolNotFound`: a down server cannot say what it lacks). A tool is
  refused (left out, listed in `refused()` and in its source's health
  `refused`, and logged once at WARNING) when its name cannot be a function
  name, when its `inputSchema` is over `REM_TOOL_SCHEMA_MAX_BYTES` (it would go
  into every model request), or when the SDK cannot read it at all
  (`backend.tools.reader`): its server's other tools are offered as usual.
  `config_warnings()` names configured tools that their server does not offer.
* `call(name, arguments, *, idempotency_key, timeout_ms=None)` calls the tool
  once, with the key in `_meta["rem/idempotency_key"]` (MCP) or as `run`'s
  second argument (Python); timeout: `timeout_ms`, else the spec's. It does
  not check the permission: approving `ask` and refusing `deny` is the
  caller's part, before it commits `running`. It returns a `ToolResult` for
  any answer, a tool error (`is_error`) included (the call completed: the
  tool answered, and the model is told what it said); it raises `ToolUnavailable`
  (never sent: safe to retry later), `ToolConnectionLost` or `ToolTimeout`
  (sent, outcome unknown: for an `effect` tool, an operator decides), or
  `ToolNotFound`. Store the spec's effect class in the tool part when the call
  starts: recovery must not depend on a server being up to know it.
* Safe for concurrent use from many tasks of one event loop: parallel calls
  share each server's session; a server's start is shared by its callers.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Iterable, Mapping
from importlib.metadata import EntryPoint
from pathlib import Path
from types import TracebackType
from typing import Any

from backend.core.settings import settings
from backend.tools.config import ToolConfig, load_config, problem
from backend.tools.effects import EffectClass, ToolSettings, resolve
from backend.tools.errors import ToolConfigError, ToolNotFound, ToolUnavailable
from backend.tools.health import Limits, ServerHealth
from backend.tools.python_tools import PythonTool, PythonToolSource, installed_entry_points
from backend.tools.results import ToolResult, inert
from backend.tools.servers import McpServerSource
from backend.tools.spec import (
    DESCRIPTION_MAX,
    RefusedTool,
    ToolSpec,
    model_name,
    qualified_name,
    source_name_problem,
    split_name,
    tool_name_problem,
)

log = logging.getLogger("rem.tools.registry")

Source = McpServerSource | PythonToolSource
KEY_MAX = 256
# refused tools named in the log per listing: a listing of 10 000 bad tools is not a flood
REFUSED_LOGGED = 10
_UNSET: Any = object()


class ToolRegistry:
    """Every configured tool source of this process, behind one catalogue and one `call`."""

    def __init__(self, config: ToolConfig, sources: Mapping[str, Source], limits: Limits) -> None:
        self.config = config
        self.limits = limits
        self._sources = dict(sources)
        self._by_source: dict[str, list[ToolSpec]] = {}
        self._specs: dict[str, ToolSpec] = {}
        self._model_names: dict[str, str] = {}
        self._refused: dict[str, list[RefusedTool]] = {name: [] for name in sources}
        # each MCP source's last listing and the specs built from it: a step lists every source,
        # and a server that has not changed its tools answers with the same listing object
        self._built: dict[str, tuple[list[Any], list[ToolSpec]]] = {}
        # moved by a source entering a state (or failing again): unmoved, `health()` is as last read
        self.health_changes = 0
        for source in self._sources.values():
            if isinstance(source, McpServerSource):
                source.on_change = self._health_changed

    @classmethod
    async def load(
        cls,
        *,
        config_path: Path | None = _UNSET,
        entry_points: Iterable[EntryPoint] | None = None,
        limits: Limits | None = None,
        environ: Mapping[str, str] | None = None,
    ) -> ToolRegistry:
        """The registry for `config_path` (default REM_MCP_CONFIG) and `entry_points` (default: installed)."""
        config = load_config(settings.mcp_config if config_path is _UNSET else config_path, environ)
        limits = limits or Limits.from_settings()
        sources: dict[str, Source] = {
            name: McpServerSource(server, limits) for name, server in config.servers.items()
        }
        for entry_point in installed_entry_points() if entry_points is None else entry_points:
            _check_entry_point(config, entry_point, sources)
            sources[entry_point.name] = PythonToolSource(entry_point, limits)
        config.check_sources(set(sources))
        return cls(config, sources, limits)

    async def __aenter__(self) -> ToolRegistry:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    # -- the catalogue

    async def catalogue(self) -> list[ToolSpec]:
        """Every tool of every source, sorted by name; unreachable servers' tools marked unavailable."""
        await asyncio.gather(*(self._list_source(name) for name in self._sources))
        return sorted(self._specs.values(), key=lambda spec: spec.name)

    async def spec(self, name: str) -> ToolSpec:
        """The spec of `NAME.TOOL` (or the model's `NAME__TOOL`), listing its source if needed."""
        found = self._lookup(name)
        parts = split_name(name)
        if found is None and parts is not None and parts[0] in self._sources:
            await self._list_source(parts[0])
            found = self._lookup(name)
        if found is None and parts is not None and parts[0] in self._sources:
            self._unknown_while_down(self._sources[parts[0]], name)
        if found is None:
            raise ToolNotFound(self._not_found(name), tool=inert(name[:200]))
        return found

    def _unknown_while_down(self, source: Source, name: str) -> None:
        """A server that never listed its tools cannot say a tool is not one of them: it is unavailable."""
        health = source.health()
        if health["state"] == "down" and self._listed_names(source) is None:
            raise ToolUnavailable(
                f"tool source {source.name!r} is down ({health['last_error']}); "
                f"whether it offers {inert(name[:120])!r} is not known yet",
                server=source.name,
            )

    def refused(self) -> list[RefusedTool]:
        """Tools sources offer whose names cannot be model function names (as of the last catalogue)."""
        return [tool for name in sorted(self._refused) for tool in self._refused[name]]

    def config_warnings(self) -> list[str]:
        """`rem.tools` entries naming a tool its (listed) source does not offer."""
        warnings = []
        for key in sorted(self.config.tools):
            server, _, tool = key.partition(".")
            listed = self._listed_names(self._sources[server])
            if tool != "*" and listed is not None and tool not in listed:
                warnings.append(f'rem.tools."{key}": {server!r} offers no tool {tool!r}')
        return warnings

    def health(self) -> list[ServerHealth]:
        """Each source's health (plain JSON), sorted by name, with the tools it had refused."""
        return [
            {**self._sources[name].health(), "refused": [r.as_json() for r in self._refused.get(name, [])]}
            for name in sorted(self._sources)
        ]

    def _health_changed(self) -> None:
        self.health_changes += 1

    # -- calls

    async def call(
        self, name: str, arguments: Mapping[str, Any], *, idempotency_key: str, timeout_ms: int | None = None
    ) -> ToolResult:
        """Call tool `name` once with `arguments` (see the module docstring for what it raises)."""
        if not isinstance(idempotency_key, str) or not 0 < len(idempotency_key) <= KEY_MAX:
            raise ValueError(f"an idempotency key is a string of 1 to {KEY_MAX} characters")
        spec = await self.spec(name)
        source = self._sources[spec.server]
        return await source.call(spec.tool, dict(arguments), idempotency_key, timeout_ms or spec.timeout_ms)

    async def aclose(self) -> None:
        """Stop every server this registry started."""
        await asyncio.gather(*(source.aclose() for source in self._sources.values()), return_exceptions=True)

    # -- building specs

    def _lookup(self, name: str) -> ToolSpec | None:
        return self._specs.get(name) or self._specs.get(self._model_names.get(name, ""))

    async def _list_source(self, name: str) -> None:
        """List one source again (starting it if needed) and index its specs."""
        specs = await self._source_specs(self._sources[name])
        if specs is self._by_source.get(name):
            return  # the same listing as last time: indexed already
        self._by_source[name] = specs
        every = [spec for group in self._by_source.values() for spec in group]
        self._specs = {spec.name: spec for spec in every}
        self._model_names = {spec.model_name: spec.name for spec in every}

    def _not_found(self, name: str) -> str:
        parts = split_name(name)
        if parts is None or parts[0] not in self._sources:
            return (
                f"no tool source {(parts or (name,))[0][:80]!r} (tool {inert(name[:120])!r}); see `rem tools`"
            )
        for refused in self._refused.get(parts[0], []):
            if refused.tool == parts[1]:
                return f"tool {inert(name[:120])!r} is refused: it {refused.reason}"
        return f"tool source {parts[0]!r} offers no tool {inert(parts[1][:80])!r}; see `rem tools`"

    async def _source_specs(self, source: Source) -> list[ToolSpec]:
        try:
            if isinstance(source, PythonToolSource):
                return self._specs_of(source, [_python_entry(t) for t in source.listing()], available=None)
            tools = await source.listing()
            built = self._built.get(source.name)
            if built is not None and built[0] is tools:
                return built[1]
            entries = [_mcp_entry(t) for t in tools]
            specs = self._specs_of(source, entries, available=None, unreadable=source.unreadable_tools())
            self._built[source.name] = (tools, specs)
            return specs
        except ToolUnavailable as exc:
            return self._unavailable_specs(source, str(exc))

    def _unavailable_specs(self, source: Source, reason: str) -> list[ToolSpec]:
        cached = source.cached_listing() if isinstance(source, McpServerSource) else None
        if cached is not None:
            entries = [_mcp_entry(t) for t in cached]
        else:
            entries = [(tool, "", {}, {}, None) for tool in self.config.named_tools(source.name)]
        return self._specs_of(source, entries, available=reason)

    def _specs_of(
        self,
        source: Source,
        entries: list[_Entry],
        *,
        available: str | None,
        unreadable: Iterable[tuple[str, str]] = (),
    ) -> list[ToolSpec]:
        specs = []
        refused = [RefusedTool(source.name, name, why) for name, why in unreadable]
        for tool, description, schema, hints, declared in entries:
            why = tool_name_problem(source.name, tool) or schema_problem(schema, self.limits.schema_max_bytes)
            if why is not None:
                refused.append(RefusedTool(source.name, inert(tool[:200]), why))
                continue
            specs.append(self._spec(source, tool, description, schema, hints, declared, available))
        if available is None or refused:
            self._log_refused(source.name, refused)
            self._refused[source.name] = refused
        return specs

    def _log_refused(self, source: str, refused: list[RefusedTool]) -> None:
        """A WARNING per tool newly refused, the first REFUSED_LOGGED of them; one more line counts the rest."""
        before = set(self._refused.get(source, []))
        new = [tool for tool in refused if tool not in before]
        for tool in new[:REFUSED_LOGGED]:
            log.warning("tool source %s: tool %s is refused: it %s", source, tool.tool, tool.reason)
        if len(new) > REFUSED_LOGGED:
            log.warning(
                "tool source %s: %d more tools are refused (`rem tools` lists them)",
                source,
                len(new) - REFUSED_LOGGED,
            )

    def _spec(
        self,
        source: Source,
        tool: str,
        description: str,
        schema: dict[str, Any],
        annotations: dict[str, Any],
        declared: EffectClass | None,
        unavailable: str | None,
    ) -> ToolSpec:
        settings_ = self.config.settings_for(source.name, tool) if self.config.tools else ToolSettings()
        resolved = resolve(
            annotations, settings_, declared=declared, default_timeout_ms=self.limits.timeout_ms
        )
        spec = ToolSpec(
            name=qualified_name(source.name, tool),
            server=source.name,
            tool=tool,
            model_name=model_name(source.name, tool),
            description=inert(description[:DESCRIPTION_MAX]),
            input_schema=schema,
            effect=resolved.effect,
            effect_source=resolved.effect_source,
            permission=resolved.permission,
            permission_source=resolved.permission_source,
            timeout_ms=resolved.timeout_ms,
            timeout_source=resolved.timeout_source,
            kind=source.kind,
            annotations=annotations,
            available=unavailable is None,
            unavailable_reason=unavailable,
        )
        if unavailable is None and (warning := spec.annotation_warning()) is not None:
            log.warning("%s", warning)  # once per listing: a server lists again only when it changed
        return spec

    def _listed_names(self, source: Source) -> set[str] | None:
        if isinstance(source, PythonToolSource):
            return None if source.error else set(source.tools)
        cached = source.cached_listing()
        return None if cached is None else {t.name for t in cached}


def schema_problem(schema: dict[str, Any], max_bytes: int) -> str | None:
    """Why a tool's input schema cannot go into model requests (over the bound, not JSON), or None."""
    try:
        size = len(json.dumps(schema, separators=(",", ":")))
    except (TypeError, ValueError, RecursionError):
        return "has an inputSchema that is not JSON"
    if size > max_bytes:
        return (
            f"has an inputSchema of {size} bytes, over REM_TOOL_SCHEMA_MAX_BYTES ({max_bytes}): "
            "it would go into every model request"
        )
    return None


# (tool name, description, input schema, annotations, declared effect class)
_Entry = tuple[str, str, dict[str, Any], dict[str, Any], EffectClass | None]
HINTS = ("title", "readOnlyHint", "destructiveHint", "idempotentHint", "openWorldHint")


def _mcp_entry(tool: Any) -> _Entry:
    raw = tool.annotations.model_dump(by_alias=True, exclude_none=True) if tool.annotations else {}
    annotations = {key: raw[key] for key in HINTS if key in raw}
    if isinstance(annotations.get("title"), str):
        annotations["title"] = inert(annotations["title"][:200])
    return tool.name, tool.description or "", dict(tool.input_schema or {}), annotations, None


def _python_entry(tool: PythonTool) -> _Entry:
    return tool.name, tool.description, dict(tool.input_schema), {}, tool.declared_effect()


def _check_entry_point(config: ToolConfig, entry_point: EntryPoint, sources: Mapping[str, Source]) -> None:
    name = entry_point.name
    if (bad := source_name_problem(name)) is not None:
        raise ToolConfigError(
            f"rem.tools entry point {name!r} ({entry_point.value}) cannot name tools: the name {bad}; "
            "rename it in its package, or uninstall it"
        )
    if name in config.servers:
        raise problem(
            config.path,
            f"mcpServers.{name}",
            f"{name!r} is also a rem.tools entry point ({entry_point.value})",
            "rename the server: NAME must be unique across servers and entry points",
        )
    if name in sources:
        raise ToolConfigError(
            f"two rem.tools entry points are named {name!r}; uninstall one of the packages that offer it"
        )
