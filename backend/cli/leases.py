"""`rem drain` and `rem release`: hand work back, gracefully or by force."""

from __future__ import annotations

import sys
from typing import Annotated, Any

import typer

from backend import ops
from backend.cli import common


def register(app: typer.Typer) -> None:
    app.command("drain")(drain)
    app.command("release")(release)


def drain(
    owner_id: Annotated[str, typer.Argument(help="The worker's owner id (see `rem status`).")],
    wait: Annotated[bool, typer.Option("--wait", help="Block until the worker has stopped.")] = False,
    timeout: Annotated[float, typer.Option(min=1, help="Seconds --wait waits at most.")] = 60.0,
    data: common.DataOpt = None,
    json: common.JsonOpt = False,
) -> None:
    """Drain a worker: it stops claiming, finishes or hands back its work, releases its leases and exits.

    Example: rem drain executor-host-1234-ab12cd --wait
    """
    ctx = common.make_context(data, None)
    show = _progress_printer() if wait and not json else None
    result = common.run(lambda: common.with_context(
        ctx, lambda c: ops.drain(c, owner_id, wait=wait, timeout_s=timeout, progress=show)))
    if json:
        common.emit_json(result)
    else:
        common.note(f"rem: {owner_id} is {result['state']}")


def _progress_printer() -> Any:
    last: list[str] = []

    def show(report: dict[str, Any]) -> None:
        line = (f"\r{report['owner_id']}: {report['state']}, {report['leases_held']} leases held, "
                f"{report['waited_ms'] / 1000:.1f} s")
        if line != (last[0] if last else None):
            sys.stderr.write(line.ljust(90))
            sys.stderr.flush()
            last[:] = [line]
        if report["state"] == "stopped":
            sys.stderr.write("\n")

    return show


def release(
    lease_id: Annotated[str, typer.Argument(
        help="An execution id, or a session id for its summary-job or Dream lease.")],
    kind: Annotated[str | None, typer.Option(
        help="execution, summary_job or dream (default: whichever the id names).")] = None,
    expected_epoch: Annotated[int | None, typer.Option(
        help="The epoch you saw; refused if the lease moved since (unless --force).")] = None,
    force: Annotated[bool, typer.Option("--force", help="Release even if renewed since.")] = False,
    data: common.DataOpt = None,
    json: common.JsonOpt = False,
) -> None:
    """Release a lease now (fenced on the epoch you saw) so another worker takes over at once.

    Example: rem release exe_01J9Z3 --expected-epoch 3
    """
    ctx = common.make_context(data, None)
    result = common.run(lambda: common.with_context(
        ctx, lambda c: ops.release(c, lease_id, kind=kind, expected_epoch=expected_epoch, force=force)))
    if json:
        common.emit_json(result)
    else:
        common.note(f"rem: released {result['kind']} lease {lease_id} of {result['owner_id']} "
                    f"(epoch {result['old_epoch']} -> {result['new_epoch']})")
