"""`rem serve`: the application API (HTTP, event streams, MCP over Streamable HTTP)."""

from __future__ import annotations

from typing import Annotated

import typer

from backend.cli import common


def register(app: typer.Typer) -> None:
    app.command("serve")(serve)


def serve(
    cli: typer.Context,
    listen: Annotated[
        str, typer.Option("--listen", metavar="HOST:PORT", help="Where to listen (port 0: any free one).")
    ] = "127.0.0.1:8765",
    allow_remote: Annotated[
        bool,
        typer.Option("--allow-remote", help="Listen on a non-loopback address (behind a TLS proxy only)."),
    ] = False,
    data: common.DataOpt = None,
    chroma_url: common.ChromaOpt = None,
) -> int:
    """Serve the HTTP API, its event streams and MCP over Streamable HTTP until drained (SIGTERM, Ctrl-C).

    Every request but /healthz needs a token from `rem token create`. It binds
    127.0.0.1 unless told otherwise; its URL is printed on stderr.

    Example: rem serve --listen 127.0.0.1:8765
    """
    # import time: uvicorn, FastAPI and the routes load only for `rem serve`
    from backend.api.server import ApiServer, event_loop, parse_listen

    where = parse_listen(listen, allow_remote=allow_remote)
    ctx = common.make_context(cli, data, chroma_url)

    async def run_server(c: object) -> int:
        server = ApiServer(ctx, where)
        common.note(f"rem: serving {server.url} (worker {server.owner_id}); Ctrl-C stops it")
        return await server.run()

    return common.run(lambda: common.with_context(ctx, run_server), loop_factory=event_loop)
