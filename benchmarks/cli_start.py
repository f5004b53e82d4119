"""How long a `rem` command takes to start and finish, as an operator types it (target:
`rem --help` < 0.3 s and `rem status --json` on a small data dir < 0.5 s, on a quiet machine).

python benchmarks/cli_start.py [--runs N] [--json]

Each command runs N times (default 15) as a fresh process, the way a shell runs it (the installed
`rem` script next to this interpreter, else `python -m backend.cli.app`), on a small fresh data dir
made by `rem init` in a temp dir (removed at the end). Reported per command: p50, p95 and min of
the wall time in seconds, with the machine's load average before and after (on a shared machine
the minimum is the figure closest to a quiet one, the median says what an operator waits), and the
median CPU time (user + system) of the process, which a busy machine inflates much less: on a
quiet machine the wall time is about that. Each command runs once first, unmeasured, which writes
its bytecode to a cache in the temp dir (see `quiet_env`).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# name, argv after `rem` ({data} is the small data dir)
COMMANDS: list[tuple[str, list[str]]] = [
    ("--help", ["--help"]),
    ("status --json", ["status", "--json", "--data", "{data}"]),
    ("status", ["status", "--data", "{data}"]),
    ("send --help", ["send", "--help"]),
    ("show --json", ["show", "bench-session", "--json", "--data", "{data}"]),
    ("check --help", ["check", "--help"]),
    ("metrics --rules", ["metrics", "--rules"]),
]


def rem_argv() -> list[str]:
    """The `rem` an operator runs: the console script beside this Python, else the module."""
    script = Path(sys.executable).with_name("rem")
    if script.exists():
        return [str(script)]
    return [sys.executable, "-m", "backend.cli.app"]


def quiet_env(pycache: Path) -> dict[str, str]:
    """The caller's environment without REM_* variables (they would change what is measured), with
    Python's bytecode cache on, kept in `pycache`: an installed rem runs from bytecode compiled
    once, and PYTHONDONTWRITEBYTECODE (set in some shells and CI) would have every run compile
    rem's own modules again, ~0.25 s of `rem status --json` that no operator pays."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("REM_")}
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env["PYTHONPYCACHEPREFIX"] = str(pycache)  # the checkout is left as it was
    env["REM_CHROMA_AUTOSTART"] = "0"  # no command here may start a Chroma server
    return env


def make_data_dir(parent: Path, rem: list[str], env: dict[str, str]) -> Path:
    data = parent / "data"
    for argv in (["init"], ["send", "bench-session", "hello from the start benchmark"]):
        subprocess.run([*rem, *argv, "--data", str(data)], env=env, check=True, capture_output=True)
    return data


def time_runs(argv: list[str], runs: int, env: dict[str, str]) -> tuple[list[float], list[float]]:
    """Wall and CPU (user + system) seconds of `runs` fresh processes, each sorted."""
    walls, cpus = [], []
    for _ in range(runs):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.perf_counter()
        proc = subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        walls.append(time.perf_counter() - start)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpus.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
        if proc.returncode != 0:
            raise SystemExit(f"{' '.join(argv)} exited {proc.returncode}: {proc.stderr.decode()[-400:]}")
    return sorted(walls), sorted(cpus)


def summary(walls: list[float], cpus: list[float]) -> dict[str, float]:
    p95 = walls[min(len(walls) - 1, max(0, round(len(walls) * 0.95) - 1))]
    return {
        "p50_s": round(statistics.median(walls), 3),
        "p95_s": round(p95, 3),
        "min_s": round(walls[0], 3),
        "cpu_p50_s": round(statistics.median(cpus), 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    parent = Path(tempfile.mkdtemp(prefix="rem-cli-start-"))
    rem, env = rem_argv(), quiet_env(parent / "pycache")
    try:
        data = make_data_dir(parent, rem, env)
        load_before = os.getloadavg()
        results = {}
        for name, tail in COMMANDS:
            argv = [*rem, *(part.format(data=data) for part in tail)]
            time_runs(argv, 1, env)  # warm the page cache and the bytecode
            results[name] = summary(*time_runs(argv, args.runs, env))
        load_after = os.getloadavg()
    finally:
        shutil.rmtree(parent, ignore_errors=True)
    report = {
        "runs": args.runs,
        "cores": os.cpu_count(),
        "load_before": [round(x, 2) for x in load_before],
        "load_after": [round(x, 2) for x in load_after],
        "commands": results,
    }
    if args.json:
        print(json.dumps(report, indent=2))
        return
    print(f"rem command start, {args.runs} runs each, {os.cpu_count()} cores")
    print(f"load average before {report['load_before']}, after {report['load_after']}")
    print(f"{'command':<18} {'p50 s':>7} {'p95 s':>7} {'min s':>7} {'cpu p50 s':>10}")
    for name, row in results.items():
        print(
            f"{name:<18} {row['p50_s']:>7.3f} {row['p95_s']:>7.3f} {row['min_s']:>7.3f} {row['cpu_p50_s']:>10.3f}"
        )


if __name__ == "__main__":
    main()
