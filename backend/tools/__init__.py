"""Agent tools: where an agent's tools come from (MCP servers, Python entry points) and how a call is made.

The entry point is `backend.tools.registry.ToolRegistry` (its docstring is the
interface). One module per concept:

* `config`: `REM_MCP_CONFIG`, the `mcpServers` JSON shape plus rem's `"rem"` section;
* `effects`: effect classes (read, idempotent, effect), permissions, and where each came from;
* `spec`: `ToolSpec`, and the two spellings of a tool's name (`NAME.TOOL`, `NAME__TOOL`);
* `results`: `ToolResult`, bounded and inert;
* `errors`: what a call can raise, each saying whether its request may have run;
* `servers`: one MCP server as a source: its session started on use, restarted with backoff, its health;
* `connection`: the task holding one client session (transport, `ClientSession`, initialize, tools/list);
* `calls`: one tools/call and what each way it can end means (result, or sent/never-sent errors);
* `stdio`, `http`, `lines`: the transports, reading a server's output in bounded memory;
* `python_tools`: the `rem.tools` entry-point group;
* `health`: source states and the limits read from the settings.

Importing `backend.tools` loads no MCP SDK; `registry`, `servers` and the modules below them do. The
process programs rem runs (the supervisor, the drill, bench, the demo, the
metrics server, the demo tool server) live in `backend.programs`.
"""
