"""Agent tools: where an agent's tools come from (MCP servers, Python entry points) and how a call is made durable.

The process programs rem runs (the supervisor, the drill, bench, the demo, the
metrics server) live in `backend.programs`; "tools" here means what an agent
calls.
"""
