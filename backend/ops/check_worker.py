"""One `rem check` worker process: the sessions phase over one range of session ids.

    python -m backend.ops.check_worker STATE_DB LO HI BATCH

Checks sessions LO < id <= HI (HI empty: to the end) of STATE_DB, opened
read-only, in batches of BATCH sessions, each in its own short read
transaction (`backend.ops.checks.workers.check_range_in_process`). Writes
`checked N` to stderr after each batch, and its findings (the pickled
`Report` with rows capped, and how many sessions) to stdout; on an error, one
line naming it to stderr and exit status 1. Started by `rem check`
(`checks.workers.check_sessions_in_processes`), not by hand.
"""

from __future__ import annotations

import pickle
import sys

from backend.core.errors import RemError
from backend.ops.checks.workers import check_range_in_process


def main() -> int:
    path, lo, hi, batch = sys.argv[1:5]

    def checked(n: int) -> None:
        print(f"checked {n}", file=sys.stderr, flush=True)

    try:
        result = check_range_in_process(path, lo, hi or None, int(batch), checked)
    except RemError as exc:
        print(str(exc), file=sys.stderr, flush=True)
        return 1
    sys.stdout.buffer.write(pickle.dumps(result))
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
