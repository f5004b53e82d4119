"""A hostile MCP tool server: raw JSON-RPC 2.0 that misbehaves on purpose, for the tests of rem as an MCP client.

    python tests/hostile_mcp.py [--init answer|silent]
                                [--listing good|garbage|one_bad|big_schema|oversize]
                                [--log FILE] [--http PORT]

Standard library only, no MCP SDK: it writes whatever bytes a scenario asks
for (newline-delimited JSON-RPC on stdout, or JSON bodies over HTTP with
`--http PORT`, on 127.0.0.1:PORT/mcp). How it starts is chosen by argv:

* `--init silent` never answers `initialize` (it reads and ignores everything);
* `--listing` answers `tools/list` with `good` (the tools below), `garbage`
  (`{"tools": "garbage"}`), `one_bad` (the good tools plus a tool with no name
  and one whose `inputSchema` is a string), `big_schema` (the good tools plus
  `big`, whose `inputSchema` is 2 MB) or `oversize` (one 6 MB description: a
  listing over rem's message bound).

Its tools: `lookup` (readOnlyHint: a read) answers `found ...`; `send_payment`
(no hints: an effect) does what its `how` argument says:

* `ok`: answers `paid`;
* `error`: a JSON-RPC error with the arguments' `code` and `message`;
* `surrogate`: a result whose text holds a lone-surrogate escape (`\\ud800`);
* `bad_utf8`: a result whose text holds bytes that are not UTF-8;
* `result5`: `"result": 5`;
* `hang`: never answers (a timeout, or SIGKILL while it waits);
* `flood`: `n` `notifications/message` log notifications and `n` stderr lines
  (each about 1 KB), then answers `flooded`.

Every `tools/call` that arrives is one JSON line in `--log FILE` (`pid`,
`tool`, `how`, `key`: the `_meta["rem/idempotency_key"]`), written before it
is answered, so a test knows when a call reached the server.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

LOOKUP = {
    "name": "lookup",
    "description": "Look something up.",
    "inputSchema": {"type": "object", "properties": {"query": {"type": "string"}}},
    "annotations": {"readOnlyHint": True},
}
SEND = {
    "name": "send_payment",
    "description": "Send a payment (misbehaves as `how` says).",
    "inputSchema": {"type": "object", "properties": {"how": {"type": "string"}}},
}
BIG_SCHEMA_BYTES = 2_000_000
OVERSIZE_BYTES = 6_000_000
FLOOD_LINE = "x" * 1000


def listing(kind: str) -> bytes | dict[str, Any]:
    """The `tools/list` result for `kind` (bytes when it must go out as they are)."""
    good = [LOOKUP, SEND]
    if kind == "garbage":
        return {"tools": "garbage"}
    if kind == "one_bad":
        return {"tools": [LOOKUP, {"description": "no name"}, {"name": "broken", "inputSchema": "x"}, SEND]}
    if kind == "big_schema":
        properties = {f"p{i}": {"type": "string", "description": "y" * 980} for i in range(2000)}
        big = {"name": "big", "inputSchema": {"type": "object", "properties": properties}}
        return {"tools": [*good, big]}
    if kind == "oversize":
        return {"tools": [{**LOOKUP, "description": "z" * OVERSIZE_BYTES}]}
    return {"tools": good}


def envelope(ident: Any, body: str) -> bytes:
    """A JSON-RPC response line whose `result` or `error` member is `body`, as raw text."""
    return f'{{"jsonrpc":"2.0","id":{json.dumps(ident)},{body}}}'.encode()


def result(ident: Any, value: Any) -> bytes:
    return envelope(ident, '"result":' + json.dumps(value))


def call_answer(ident: Any, arguments: dict[str, Any], notify: Any) -> bytes | None:
    """The answer to one `send_payment` (None: never answer)."""
    how = arguments.get("how", "ok")
    if how == "error":
        error = {"code": int(arguments.get("code", -32000)), "message": str(arguments.get("message", ""))}
        return envelope(ident, '"error":' + json.dumps(error))
    if how == "surrogate":
        return envelope(ident, '"result":{"content":[{"type":"text","text":"paid \\ud800 twice"}]}')
    if how == "bad_utf8":
        return envelope(ident, '"result":{"content":[{"type":"text","text":"paid "}]}').replace(
            b"paid ", b"paid \xff\xfe "
        )
    if how == "result5":
        return envelope(ident, '"result":5')
    if how == "hang":
        return None
    if how == "flood":
        for i in range(int(arguments.get("n", 20_000))):
            notify({"level": "info", "logger": "hostile", "data": f"flood {i} {FLOOD_LINE}"})
            sys.stderr.write(f"stderr flood {i} {FLOOD_LINE}\n")
        sys.stderr.flush()
        return result(ident, {"content": [{"type": "text", "text": "flooded"}]})
    return result(ident, {"content": [{"type": "text", "text": "paid"}]})


class Server:
    """The protocol, for either transport: a request in, the bytes of its answer out (or none)."""

    def __init__(self, init: str, kind: str, log_path: str | None) -> None:
        self.init = init
        self.kind = kind
        self.log_path = log_path
        self.lock = threading.Lock()

    def answer(self, message: dict[str, Any], notify: Any) -> bytes | None:
        method, ident = message.get("method"), message.get("id")
        if ident is None:
            return None  # a notification (initialized, cancelled): nothing to say
        if method == "initialize":
            if self.init == "silent":
                return None
            version = (message.get("params") or {}).get("protocolVersion", "2025-06-18")
            return result(
                ident,
                {
                    "protocolVersion": version,
                    "capabilities": {"tools": {}, "logging": {}},
                    "serverInfo": {"name": "hostile", "version": "1"},
                },
            )
        if method == "tools/list":
            answer = listing(self.kind)
            return answer if isinstance(answer, bytes) else result(ident, answer)
        if method == "tools/call":
            return self.call(ident, message.get("params") or {}, notify)
        if method == "ping":
            return result(ident, {})
        return envelope(ident, '"error":{"code":-32601,"message":"method not found"}')

    def call(self, ident: Any, params: dict[str, Any], notify: Any) -> bytes | None:
        arguments = params.get("arguments") or {}
        key = ((params.get("_meta") or {}).get("rem/idempotency_key")) or ""
        self.record({"pid": os.getpid(), "tool": params.get("name"), "how": arguments.get("how"), "key": key})
        if params.get("name") == "lookup":
            return result(ident, {"content": [{"type": "text", "text": f"found {arguments.get('query')}"}]})
        return call_answer(ident, arguments, notify)

    def record(self, entry: dict[str, Any]) -> None:
        if self.log_path is None:
            return
        with self.lock, open(self.log_path, "a", encoding="utf-8") as out:
            out.write(json.dumps(entry) + "\n")


def serve_stdio(server: Server) -> None:
    """Newline-delimited JSON-RPC on stdin/stdout; each request answered on its own thread."""
    out = sys.stdout.buffer
    write_lock = threading.Lock()

    def send(data: bytes) -> None:
        with write_lock:
            out.write(data + b"\n")
            out.flush()

    def notify(params: dict[str, Any]) -> None:
        send(json.dumps({"jsonrpc": "2.0", "method": "notifications/message", "params": params}).encode())

    def handle(message: dict[str, Any]) -> None:
        answer = server.answer(message, notify)
        if answer is not None:
            send(answer)

    for line in sys.stdin.buffer:
        if line.strip():
            threading.Thread(target=handle, args=(json.loads(line),), daemon=True).start()


def serve_http(server: Server, port: int) -> None:
    """The same protocol over plain JSON HTTP responses (no event streams) on 127.0.0.1:PORT/mcp."""

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("content-length", "0")))
            answer = server.answer(json.loads(body), lambda params: None)
            if answer is None:
                if json.loads(body).get("id") is not None:
                    threading.Event().wait()  # never answered: hold the request
                self.send_response(202)
                self.end_headers()
                return
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def do_GET(self) -> None:  # no server-to-client event stream
            self.send_response(405)
            self.end_headers()

        do_DELETE = do_GET

        def log_message(self, format: str, *args: Any) -> None:
            pass

    ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--init", choices=["answer", "silent"], default="answer")
    parser.add_argument(
        "--listing", choices=["good", "garbage", "one_bad", "big_schema", "oversize"], default="good"
    )
    parser.add_argument("--log")
    parser.add_argument("--http", type=int)
    args = parser.parse_args()
    server = Server(args.init, args.listing, args.log)
    if args.http is not None:
        serve_http(server, args.http)
    else:
        serve_stdio(server)


if __name__ == "__main__":
    main()
