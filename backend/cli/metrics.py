"""`rem metrics`: Prometheus metrics from the status snapshot; `--rules` prints the alert rules."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Annotated

import typer

from backend import ops
from backend.cli import common
from backend.core.errors import UsageError

if TYPE_CHECKING:
    from backend.runtime.context import Context


def register(app: typer.Typer) -> None:
    app.command("metrics")(metrics)


def metrics(
    cli: typer.Context,
    listen: Annotated[
        str, typer.Option("--listen", help="Where to serve /metrics (HOST:PORT; loopback by default).")
    ] = "127.0.0.1:9464",
    rules: Annotated[
        bool, typer.Option("--rules", help="Print the Prometheus alerting rules (YAML) and exit.")
    ] = False,
    once: Annotated[bool, typer.Option("--once", help="Print one scrape on stdout and exit.")] = False,
    runbook_url: Annotated[
        str | None,
        typer.Option(
            "--runbook-url",
            help="With --rules: the operators' guide page each rule's runbook_url points into, where you "
            "serve rem's docs (default: docs/operators.md in rem's source tree).",
            show_default=False,
        ),
    ] = None,
    data: common.DataOpt = None,
    chroma_url: common.ChromaOpt = None,
    json: common.JsonOpt = False,
) -> int:
    """Serve Prometheus metrics (OpenMetrics) from the snapshot the console shows; read-only.

    Example: rem metrics --listen 127.0.0.1:9464   (and `rem metrics --rules > rem-rules.yml`)
    """
    if rules:
        if json:
            # import time: PyYAML and the alert rules, only for --rules --json
            from backend.ops.alert_rules import RULES, RUNBOOK_PAGE, rules_document

            common.emit_json(rules_document(RULES, runbook_url or RUNBOOK_PAGE))
        else:
            sys.stdout.write(ops.metric_rules(runbook_url))
        return 0
    if runbook_url is not None:
        raise UsageError("--runbook-url goes with --rules: it is where the rules' runbook links point")
    ctx = common.make_context(cli, data, chroma_url, read_only=True, start_chroma=False)
    if once:
        return _once(ctx, json)
    if json:
        raise UsageError("--json goes with --once or --rules; the server speaks the Prometheus formats")
    # import time: the HTTP server, only when serving
    from backend.programs.metrics_server import is_loopback, parse_listen, serve

    host, _ = parse_listen(listen)
    if not is_loopback(host):
        common.note(
            f"rem metrics: {host} is not loopback: anyone who reaches it reads this data dir's status"
        )
    result = common.run(
        lambda: common.with_context(
            ctx, lambda c: serve(c, listen, ready=lambda url: common.note(f"rem metrics: serving {url}"))
        )
    )
    common.note(f"rem metrics: stopped after {result['snapshots']} snapshots")
    return 0


def _once(ctx: Context, json: bool) -> int:
    # import time: prometheus_client, only for --once
    from backend.ops.prometheus import samples

    if json:
        status = common.run(lambda: common.with_context(ctx, ops.status))
        common.emit_json([{"name": n, "labels": labels, "value": v} for n, labels, v in samples(status)])
        return 0
    text = common.run(lambda: common.with_context(ctx, ops.metrics))
    sys.stdout.write(text)
    return 0
