"""How long `make test` takes on this machine, and where the time goes (``make test-time``).

    python tools/test_time.py                    # one timed `make test`, results to benchmarks/results/
    python tools/test_time.py --runs 3           # three, reporting each and the median
    python tools/test_time.py --repo ../old      # time another checkout (e.g. an older commit) the same way
    python tools/test_time.py -- TEST_JOBS=1     # pass make variables after --

Each run first brings the book up to date (`make book`, timed on its own), then times `make test` as the README
states it, with ``--durations=25`` added through ``PYTEST_ADDOPTS`` so that the slowest items are recorded. The
machine's load average before and after each run is recorded too: a busy machine inflates wall time, so compare
runs taken on a quiet machine (load near 0), in the same session. This is a measurement, not a test: nothing
asserts a time (the brief: performance claims live in benchmarks).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from benchmarks.bench import machine  # noqa: E402

SUMMARY = re.compile(
    r"^(?:=+ )?(?P<summary>(?:\d+ \w+, )*\d+ (?:passed|failed)[^\n]*?) in (?P<seconds>[\d.]+)s",
    re.MULTILINE,
)
DURATION = re.compile(
    r"^(?P<seconds>[\d.]+)s (?P<when>setup|call|teardown)\s+(?P<item>\S.*)$"
)


def _git(repo: Path, *args: str) -> str:
    result = subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True)
    return result.stdout.strip()


def timed(
    command: list[str], repo: Path, env: dict[str, str]
) -> tuple[float, str, int]:
    """(wall seconds, combined output, exit status) of ``command`` run in ``repo``."""
    start = time.perf_counter()
    result = subprocess.run(
        command, cwd=repo, env=env, capture_output=True, text=True, check=False
    )
    return time.perf_counter() - start, result.stdout + result.stderr, result.returncode


def one_run(repo: Path, make_vars: list[str]) -> dict[str, Any]:
    env = {**os.environ, "PYTEST_ADDOPTS": "--durations=25 -q"}
    load_before = os.getloadavg()
    book_s, book_out, book_rc = timed(["make", "book", *make_vars], repo, env)
    if book_rc:
        sys.exit(f"make book failed:\n{book_out[-3000:]}")
    test_s, out, rc = timed(["make", "test", *make_vars], repo, env)
    load_after = os.getloadavg()
    summary = SUMMARY.search(out)
    slowest = [
        {"seconds": float(m["seconds"]), "when": m["when"], "item": m["item"]}
        for m in map(DURATION.match, out.splitlines())
        if m
    ]
    return {
        "make_test_wall_s": round(test_s, 1),
        "make_book_wall_s": round(book_s, 1),
        "pytest_s": float(summary["seconds"]) if summary else None,
        "pytest_summary": summary["summary"] if summary else out[-500:],
        "exit_status": rc,
        "load_average_before": [round(x, 2) for x in load_before],
        "load_average_after": [round(x, 2) for x in load_after],
        "slowest": slowest,
        "failed": re.findall(r"^FAILED (\S+)", out, re.MULTILINE),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=1, help="timed runs (default 1)")
    parser.add_argument(
        "--repo", type=Path, default=ROOT, help="checkout to time (default: this one)"
    )
    parser.add_argument(
        "--out", type=Path, help="results file (default: benchmarks/results/)"
    )
    parser.add_argument("make_vars", nargs="*", help="make variables, after --")
    args = parser.parse_args(argv)
    if args.runs < 1:
        parser.error(f"--runs must be >= 1, got {args.runs}")
    repo = args.repo.resolve()
    runs = []
    for index in range(args.runs):
        run = one_run(repo, args.make_vars)
        runs.append(run)
        print(
            f"run {index + 1}/{args.runs}: make test {run['make_test_wall_s']} s wall "
            f"(pytest {run['pytest_s']} s; make book {run['make_book_wall_s']} s; "
            f"load {run['load_average_before'][0]} -> {run['load_average_after'][0]}); "
            f"{run['pytest_summary']}",
            flush=True,
        )
        if run["exit_status"]:
            print(
                "make test failed: the times above are of a red run; failed: "
                + (", ".join(run["failed"]) or "(see `make test`)"),
                file=sys.stderr,
            )
    walls = [r["make_test_wall_s"] for r in runs]
    result = {
        "schema": "posenc.test-time/1",
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "repo": str(repo),
        "commit": _git(repo, "rev-parse", "HEAD"),
        "dirty": bool(_git(repo, "status", "--porcelain", "--untracked-files=no")),
        "make_vars": args.make_vars,
        "machine": machine("cpu"),
        "median_make_test_wall_s": statistics.median(walls),
        "runs": runs,
    }
    out = args.out or ROOT / "benchmarks" / "results" / (
        f"test-time-{dt.date.today().isoformat()}-{result['commit'][:7]}.json"
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"median make test: {result['median_make_test_wall_s']} s -> {out}")
    return max(r["exit_status"] for r in runs)


if __name__ == "__main__":
    sys.exit(main())
