"""`REM_MCP_CONFIG`: the agent's tool servers, in the JSON shape MCP clients share, plus rem's own settings.

    {
      "mcpServers": {
        "notes": {"command": "python", "args": ["-m", "notes_server"], "env": {"TOKEN": "${NOTES_TOKEN}"}},
        "search": {"url": "https://search.example/mcp", "headers": {"Authorization": "Bearer ${SEARCH_KEY}"}}
      },
      "rem": {
        "tools": {
          "notes.notes_add": {"effect": "idempotent", "permission": "allow", "timeout_ms": 5000},
          "search.*": {"effect": "read"}
        }
      }
    }

* A server with `command` runs over **stdio** (`args`, `env`, `cwd` optional); one
  with `url` over **streamable HTTP** (`headers` optional). `"type"` may say
  which (`stdio`, `http`, `streamable-http`); the legacy SSE transport is refused.
* A stdio server's environment is the SDK's safe default (HOME, LOGNAME, PATH,
  SHELL, TERM, USER) plus its `env`: rem's own variables (API keys, database
  URLs) never reach it. Its working directory is `cwd`, relative to the
  config file's folder, default that folder.
* `${VAR}` and `${VAR:-default}` in `env` and `headers` are read from rem's
  environment, so secrets need not sit in the file. Anywhere else (`command`,
  `args`, `cwd`, `url`) a `${VAR}` is refused: arguments show in `ps` to every
  local user and a URL is logged, so a secret there would leak.
* The file names the programs rem runs and the permissions that gate effects,
  so it is refused when another user could change it (`backend.core.private.exposed`):
  the file or a folder on its path owned by another user (root excepted) or
  writable by group or others (a sticky folder such as /tmp excepted). So are
  the files it points to: a stdio server's `cwd`, a `command` given as a path,
  and an argument naming an existing file (a script). They are checked when the
  file is read and again at each start of the server.
* `"rem": {"tools": {...}}` keys are `NAME.TOOL`, or `NAME.*` for every tool
  of NAME (a `NAME.TOOL` entry wins over it, key by key); each sets any of
  `effect` (read, idempotent, effect), `permission` (allow, ask, deny) and
  `timeout_ms`. NAME must be a configured server or a `rem.tools` entry point.

Every mistake is one `ToolConfigError` line naming the file, the key and the
fix; unknown keys are mistakes too (a typo must not silently drop a setting),
and so are a lone surrogate in any key or value (JSON's `"\\ud800"` decodes to
one, and no program or header can take it) and a file nested too deeply to read.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from backend.core import private
from backend.core.inert import visible
from backend.core.redact import has_credentials
from backend.tools.effects import EffectClass, Permission, ToolSettings
from backend.tools.errors import ToolConfigError
from backend.tools.spec import source_name_problem

CONFIG_MAX_BYTES = 1024 * 1024
TIMEOUT_MAX_MS = 24 * 3600 * 1000
VARIABLE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")
HEADER_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
STDIO_KEYS = {"type", "command", "args", "env", "cwd"}
HTTP_KEYS = {"type", "url", "headers"}
TOOL_KEYS = {"effect", "permission", "timeout_ms"}
SURROGATE = re.compile("[\ud800-\udfff]")
E = TypeVar("E", EffectClass, Permission)


@dataclass(frozen=True)
class StdioServer:
    """An MCP server rem starts as a child process and talks to over its stdin and stdout."""

    name: str
    command: str
    args: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    cwd: Path = Path("/")
    transport: str = "stdio"

    def named_files(self) -> list[tuple[str, Path]]:
        """(key, path) of what it runs from: its cwd, a command given as a path, arguments naming files."""
        named = [("cwd", self.cwd)]
        if os.sep in self.command:
            named.append(("command", self.cwd / self.command))
        for i, arg in enumerate(self.args):
            if arg and os.path.isfile(self.cwd / arg):
                named.append((f"args[{i}]", self.cwd / arg))
        return named

    def exposed(self) -> tuple[str, private.Exposed] | None:
        """The first file it runs from that another user could change, with its key (None: none can)."""
        for key, path in self.named_files():
            found = private.exposed(path)
            if found is not None:
                return key, found
        return None


@dataclass(frozen=True)
class HttpServer:
    """An MCP server rem reaches over streamable HTTP."""

    name: str
    url: str
    headers: Mapping[str, str] = field(default_factory=dict)
    transport: str = "http"


ServerConfig = StdioServer | HttpServer


@dataclass(frozen=True)
class ToolConfig:
    """The parsed configuration: servers by NAME, and rem's settings by `NAME.TOOL` or `NAME.*`."""

    path: Path | None = None
    servers: Mapping[str, ServerConfig] = field(default_factory=dict)
    tools: Mapping[str, ToolSettings] = field(default_factory=dict)

    def settings_for(self, server: str, tool: str) -> ToolSettings:
        """The operator's settings for one tool: its own entry over its server's `NAME.*` entry."""
        own = self.tools.get(f"{server}.{tool}", ToolSettings())
        return own.over(self.tools.get(f"{server}.*", ToolSettings()))

    def named_tools(self, server: str) -> list[str]:
        """The TOOL names the configuration names for `server` (not `*`)."""
        prefix = f"{server}."
        return sorted(k[len(prefix) :] for k in self.tools if k.startswith(prefix) and k != f"{server}.*")

    def check_sources(self, sources: set[str]) -> None:
        """Refuse a `rem.tools` key whose NAME is neither a configured server nor an entry point."""
        for key in self.tools:
            name = key.partition(".")[0]
            if name not in sources:
                known = ", ".join(sorted(sources)) or "none"
                raise problem(
                    self.path,
                    f'rem.tools."{key}"',
                    f"names {name!r}, which is no configured server or rem.tools entry point (known: {known})",
                    "add that server under mcpServers, or fix or remove the key",
                )


def problem(path: Path | None, key: str, what: str, fix: str) -> ToolConfigError:
    """The one-line error for a configuration mistake."""
    return ToolConfigError(f"REM_MCP_CONFIG {path}: {key}: {what}; {fix}")


def load_config(path: Path | None, environ: Mapping[str, str] | None = None) -> ToolConfig:
    """The configuration in `path` (None: no MCP servers at all)."""
    if path is None:
        return ToolConfig()
    path = path.expanduser().absolute()
    try:
        if path.stat().st_size > CONFIG_MAX_BYTES:
            raise problem(path, "(file)", f"is over {CONFIG_MAX_BYTES} bytes", "is it the right file?")
        _refuse_exposed(path)
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        what = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise problem(path, "(file)", f"cannot be read ({what})", "fix REM_MCP_CONFIG or the file") from None
    try:
        raw = json.loads(text, object_pairs_hook=_no_duplicates)
    except json.JSONDecodeError as exc:
        raise problem(
            path, f"line {exc.lineno} column {exc.colno}", f"is not valid JSON ({exc.msg})", "fix the JSON"
        ) from None
    except _Duplicate as exc:
        raise problem(path, repr(exc.args[0]), "appears twice in one object", "keep one of them") from None
    except RecursionError:
        raise problem(path, "(file)", "nests lists or objects too deeply to read", "fix the JSON") from None
    if (where := _surrogate_at(raw)) is not None:
        raise problem(
            path, where, "holds a lone surrogate (a \\ud800-\\udfff escape), which is no text", "fix it"
        )
    return parse_config(raw, path, os.environ if environ is None else environ)


def _refuse_exposed(path: Path) -> None:
    """Refuse a config another user could change: it names the programs rem runs."""
    found = private.exposed(path)
    if found is not None:
        raise problem(path, "(file)", f"{found.what}, so another user could change what rem runs", found.fix)


def _surrogate_at(raw: Any) -> str | None:
    """Where the decoded JSON holds a lone surrogate (in a key or a string), named as the errors name keys."""
    stack: list[tuple[str, Any]] = [("", raw)]
    while stack:  # not recursive: a file nested as deep as json.loads allows must not overflow here
        where, value = stack.pop()
        if isinstance(value, str) and SURROGATE.search(value):
            return where or "(top level)"
        if isinstance(value, list):
            stack.extend((f"{where}[{i}]", item) for i, item in enumerate(value))
        elif isinstance(value, dict):
            for key, item in value.items():
                name = _key_name(where, key)
                if SURROGATE.search(key):
                    return name
                stack.append((name, item))
    return None


def _key_name(where: str, key: str) -> str:
    shown = visible(key)
    if where == "rem.tools":
        return f'rem.tools."{shown}"'
    return f"{where}.{shown}" if where else shown


class _Duplicate(ValueError):
    pass


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    seen: dict[str, Any] = {}
    for key, value in pairs:
        if key in seen:
            raise _Duplicate(key)
        seen[key] = value
    return seen


def parse_config(raw: Any, path: Path, environ: Mapping[str, str]) -> ToolConfig:
    """A ToolConfig from the decoded JSON of the file at `path`."""
    reader = _Reader(path, environ)
    top = reader.obj(raw, "(top level)", {"mcpServers", "rem"})
    servers_raw = reader.obj(top.get("mcpServers", {}), "mcpServers", None)
    servers = {name: reader.server(name, value) for name, value in servers_raw.items()}
    rem = reader.obj(top.get("rem", {}), "rem", {"tools"})
    tools_raw = reader.obj(rem.get("tools", {}), "rem.tools", None)
    tools = {key: reader.tool_settings(key, value) for key, value in tools_raw.items()}
    return ToolConfig(path=path, servers=servers, tools=tools)


class _Reader:
    """Checks one decoded file, raising the first mistake as one line."""

    def __init__(self, path: Path, environ: Mapping[str, str]) -> None:
        self.path = path
        self.environ = environ

    def fail(self, key: str, what: str, fix: str) -> ToolConfigError:
        return problem(self.path, key, what, fix)

    def obj(self, value: Any, key: str, allowed: set[str] | None) -> dict[str, Any]:
        if not isinstance(value, dict):
            raise self.fail(key, f"must be a JSON object, not {_kind(value)}", "fix its value")
        if allowed is not None:
            for name in value:
                if name not in allowed:
                    raise self.fail(
                        f"{key}.{name}" if key != "(top level)" else name,
                        "is not a key rem knows",
                        f"remove it or fix its spelling (allowed: {', '.join(sorted(allowed))})",
                    )
        return value

    def string(self, value: Any, key: str, *, variables: bool = False) -> str:
        if not isinstance(value, str):
            raise self.fail(key, f"must be a string, not {_kind(value)}", "quote it")
        if not variables and (found := VARIABLE.search(value)) is not None:
            raise self.fail(
                key,
                f"uses {found.group()}, but rem reads variables only in env and headers (arguments show "
                "in `ps` to every local user, a URL is logged)",
                'pass the secret to the server in "env" (stdio) or "headers" (HTTP)',
            )
        return self.expand(value, key)

    def expand(self, value: str, key: str) -> str:
        def variable(match: re.Match[str]) -> str:
            name, default = match.group(1), match.group(2)
            found = self.environ.get(name)
            if found is None and default is None:
                raise self.fail(
                    key, f"uses ${{{name}}}, which is not set", f"set {name}, or write ${{{name}:-default}}"
                )
            return found if found is not None else default or ""

        expanded = VARIABLE.sub(variable, value)
        if "\x00" in expanded:
            raise self.fail(key, "holds a NUL character", "remove it")
        if SURROGATE.search(
            expanded
        ):  # a variable's value that is not UTF-8 (os.environ keeps such bytes so)
            raise self.fail(key, "takes a variable whose value is not UTF-8 text", "fix the variable's value")
        return expanded

    def strings(self, value: Any, key: str) -> tuple[str, ...]:
        if not isinstance(value, list):
            raise self.fail(key, f"must be a list of strings, not {_kind(value)}", 'write ["a", "b"]')
        return tuple(self.string(item, f"{key}[{i}]") for i, item in enumerate(value))

    def mapping(self, value: Any, key: str, check: Callable[[str, str], str | None]) -> dict[str, str]:
        items = self.obj(value, key, None)
        out = {}
        for name, item in items.items():
            text = self.string(item, f"{key}.{name}", variables=True)
            if (bad := check(name, text)) is not None:
                raise self.fail(f"{key}.{name}", bad, "fix it")
            out[name] = text
        return out

    def server(self, name: str, value: Any) -> ServerConfig:
        key = f"mcpServers.{name}"
        if (bad := source_name_problem(name)) is not None:
            raise self.fail(
                key, f"the server name {name!r} {bad}", "rename the server (the model sees NAME__TOOL)"
            )
        spec = self.obj(value, key, STDIO_KEYS | HTTP_KEYS)
        if "command" in spec and "url" in spec:
            raise self.fail(key, "has both command (stdio) and url (HTTP)", "keep the one the server speaks")
        kind = spec.get("type", "stdio" if "command" in spec else "http" if "url" in spec else None)
        if kind == "sse":
            raise self.fail(
                f"{key}.type",
                "the legacy SSE transport is not supported",
                "use the server's streamable HTTP URL",
            )
        if kind not in ("stdio", "http", "streamable-http"):
            raise self.fail(key, "has no command (stdio) or url (streamable HTTP)", 'add "command" or "url"')
        if kind == "stdio":
            return self.stdio(name, key, self.obj(spec, key, STDIO_KEYS))
        return self.http(name, key, self.obj(spec, key, HTTP_KEYS))

    def stdio(self, name: str, key: str, spec: dict[str, Any]) -> StdioServer:
        if "command" not in spec:
            raise self.fail(key, "a stdio server needs a command", 'add "command"')
        command = self.string(spec["command"], f"{key}.command")
        if not command.strip():
            raise self.fail(f"{key}.command", "is empty", "name the program to run")
        args = self.strings(spec.get("args", []), f"{key}.args")
        env = self.mapping(spec.get("env", {}), f"{key}.env", _env_problem)
        cwd = self.path.parent / self.string(spec.get("cwd", "."), f"{key}.cwd")
        server = StdioServer(name=name, command=command, args=args, env=env, cwd=cwd)
        if (found := server.exposed()) is not None:
            raise self.fail(
                f"{key}.{found[0]}",
                f"{found[1].what}, so another user could change what rem runs",
                found[1].fix,
            )
        return server

    def http(self, name: str, key: str, spec: dict[str, Any]) -> HttpServer:
        if "url" not in spec:
            raise self.fail(key, "a streamable HTTP server needs a url", 'add "url"')
        url = self.string(spec["url"], f"{key}.url")
        if not url.startswith(("http://", "https://")):
            raise self.fail(f"{key}.url", "is not an http:// or https:// URL", "fix the URL")
        if has_credentials(url):
            raise self.fail(f"{key}.url", "holds user:password@", 'send credentials in "headers" instead')
        headers = self.mapping(spec.get("headers", {}), f"{key}.headers", _header_problem)
        return HttpServer(name=name, url=url, headers=headers)

    def tool_settings(self, key: str, value: Any) -> ToolSettings:
        where = f'rem.tools."{key}"'
        server, dot, tool = key.partition(".")
        if not dot or not tool or source_name_problem(server) is not None:
            raise self.fail(where, "is not NAME.TOOL or NAME.*", 'write the key as "server.tool_name"')
        spec = self.obj(value, where, TOOL_KEYS)
        effect = self.choice(spec, "effect", where, EffectClass)
        permission = self.choice(spec, "permission", where, Permission)
        timeout = spec.get("timeout_ms")
        if timeout is not None and (
            not isinstance(timeout, int) or isinstance(timeout, bool) or not 1 <= timeout <= TIMEOUT_MAX_MS
        ):
            raise self.fail(
                f"{where}.timeout_ms", f"must be a whole number of ms from 1 to {TIMEOUT_MAX_MS}", "fix it"
            )
        return ToolSettings(effect=effect, permission=permission, timeout_ms=timeout)

    def choice(self, spec: dict[str, Any], name: str, where: str, kind: type[E]) -> E | None:
        value = spec.get(name)
        if value is None:
            return None
        options = [str(option) for option in kind]
        if value not in options:
            raise self.fail(
                f"{where}.{name}", f"must be one of {', '.join(options)}, not {value!r}", "fix it"
            )
        return kind(value)


def _env_problem(name: str, value: str) -> str | None:
    if not name or "=" in name or "\x00" in name:
        return "is not an environment variable name"
    return None


def _header_problem(name: str, value: str) -> str | None:
    if not HEADER_NAME.fullmatch(name):
        return "is not an HTTP header name"
    if "\r" in value or "\n" in value:
        return "has a line break in its value"
    return None


def _kind(value: Any) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "true/false", type(None): "null"}.get(
        type(value), "a number"
    )
