"""`rem serve`: the application API, one more thin front door over `backend.ops` (beside `rem mcp`).

JSON under `/v1` (OpenAPI 3.1 at `/v1/openapi.json`), event streams (SSE)
whose ids are durable cursors into the journal, and MCP over Streamable HTTP
at `/mcp`. Every request but `/healthz` carries a bearer token
(`backend.ops.tokens`), kept to its projects and scopes inside each query.

The pieces, one module each:

* `app`: builds the ASGI app (FastAPI) from a `Context`: routers, error
  handlers, the request-size bound;
* `auth`: the bearer token of a request, as a `Principal`, and the scope
  each route needs;
* `errors`: every error as `{"error": {"code", "message"}}` with its status;
  rem's exception tree mapped once;
* `server`: the process: uvicorn on the loop, registered as a worker (role
  `server`) with a heartbeat, drained by SIGTERM or `rem drain`.

Routes live in modules of their own (`routes_*`), streams in `events`, the MCP
endpoint in `mcp_http`; each adds a router in `app.create_app`.
"""
