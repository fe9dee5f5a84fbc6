"""What the browser tests' page visits cost this machine, with and without a page of the context kept open.

    python tools/browser_cost.py               # every page of the built book, each way, twice (alternating)
    python tools/browser_cost.py --rounds 1 --pages 3

Each pass starts a Chromium as the tests do (tests/book/browser_helpers.py), makes a desktop-sized context, and visits
every page of the table of contents with tests/book/browser_pages.py's ``visitor`` (a page per visit: load, MathJax,
collect, measure at both widths, close). The ``kept`` passes first open one blank page in the context and leave
it open, as tests/conftest.py's ``browser_context`` does; the ``bare`` passes do not. Reported per pass: wall
seconds and the machine's busy CPU-seconds (from /proc/stat, so run it on an otherwise quiet machine), and the
ratio of the medians, bare over kept, measured in the same run. A measurement, not a test: nothing asserts a time.
Results go to benchmarks/results/browser-cost-<date>.json.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from benchmarks.bench import machine  # noqa: E402

WAYS = ("bare", "kept")


def busy_cpu_seconds() -> float:
    """The machine's busy CPU time so far (user, nice, system, irq, softirq), in seconds, from /proc/stat."""
    fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    user, nice, system, _idle, _iowait, irq, softirq = (int(f) for f in fields[:7])
    return (user + nice + system + irq + softirq) / os.sysconf("SC_CLK_TCK")


def summarize(passes: list[dict[str, Any]]) -> dict[str, Any]:
    """Median wall and busy CPU-seconds of each way, and bare / kept for both.

    ``passes``: dicts with ``way`` (``"bare"`` or ``"kept"``), ``wall_s`` and ``cpu_s``, each way at least once."""
    out: dict[str, Any] = {}
    for way in WAYS:
        mine = [p for p in passes if p["way"] == way]
        if not mine:
            raise ValueError(
                f"passes has no {way!r} pass: give each way at least one (got {len(passes)} passes)"
            )
        out[way] = {
            k: round(statistics.median(p[k] for p in mine), 2)
            for k in ("wall_s", "cpu_s")
        }
    out["bare_over_kept"] = {
        k: round(out["bare"][k] / out["kept"][k], 3) for k in ("wall_s", "cpu_s")
    }
    return out


def one_pass(
    playwright: Any, base_url: str, docs: list[str], keep: bool
) -> dict[str, Any]:
    from tests.book.browser_helpers import (
        DESKTOP,
        book_html_dir,
        html_path,
        launch_chromium,
    )
    from tests.book.browser_pages import visitor

    browser = launch_chromium(playwright)
    try:
        context = browser.new_context(viewport=DESKTOP)
        if keep:
            context.new_page()
        visit = visitor(context, base_url, book_html_dir())
        cpu, wall = busy_cpu_seconds(), time.perf_counter()
        for doc in docs:
            visit(html_path(doc))
        cpu, wall = busy_cpu_seconds() - cpu, time.perf_counter() - wall
        context.close()
    finally:
        browser.close()
    return {
        "way": "kept" if keep else "bare",
        "wall_s": round(wall, 2),
        "cpu_s": round(cpu, 2),
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--rounds",
        type=int,
        default=2,
        help="passes of each way (alternating; default 2)",
    )
    parser.add_argument(
        "--pages", type=int, default=0, help="only the first N pages (default: all)"
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="result file (default: benchmarks/results/...)",
    )
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error(f"--rounds must be at least 1, got {args.rounds}")
    from playwright.sync_api import sync_playwright

    from tests.book.browser_helpers import (
        book_html_dir,
        missing_reason,
        serve,
        toc_pages,
    )

    reason = missing_reason()
    if reason:
        parser.error(reason)
    docs = toc_pages()[: args.pages or None]
    passes = []
    with serve(book_html_dir()) as base_url, sync_playwright() as playwright:
        for _ in range(args.rounds):
            for keep in (False, True):
                passes.append(one_pass(playwright, base_url, docs, keep))
                print(
                    f"{passes[-1]['way']}: {passes[-1]['wall_s']:.1f} s wall, {passes[-1]['cpu_s']:.1f} CPU-s"
                )
    result = {
        "pages": len(docs),
        "passes": passes,
        **summarize(passes),
        "machine": machine("cpu"),
    }
    print(
        f"bare / kept: CPU {result['bare_over_kept']['cpu_s']}, wall {result['bare_over_kept']['wall_s']}"
    )
    out = (
        args.out
        or ROOT
        / "benchmarks"
        / "results"
        / f"browser-cost-{dt.date.today().isoformat()}.json"
    )
    out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(f"-> {out.relative_to(ROOT) if out.is_relative_to(ROOT) else out}")
    return result


if __name__ == "__main__":
    main()
