"""Does position matter? Train tiny decoders with each positional scheme and measure them at every length.

    python -m experiments.run                  # the full sweep on CPU (make experiment)
    python -m experiments.run --quick          # a smoke run, under a minute; writes nothing unless --out
    python -m experiments.run --device cuda    # the full sweep on a GPU, one run at a time

The full sweep: 3 tasks x 6 schemes x 5 seeds, then 5 more seeds for every (task, scheme) whose first five
disagree (the rule is in ``experiments.position.sweep``); its wall time, processor time and the load average
during it are recorded in the results file. One progress line per finished run goes to stderr, the summary
table to stdout at the end. It writes ``experiments/results/position-matters-<device>.json`` (or ``--out``)
and, next to it, the weights of the models whose attention the chapter draws
(``position-matters-copy-<scheme>-seed0.pt``).

The results file records the git commit of the harness. The full sweep refuses to start when the harness's own
code (``experiments/run.py``, ``experiments/position/``) differs from that commit, since the record would then
name code that did not produce it; ``--allow-dirty`` runs anyway and records the differing files under
``code.dirty``.
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import replace
from pathlib import Path

from experiments.position import sweep as sw
from experiments.position.model import SCHEMES
from experiments.position.tasks import TASKS

RESULTS = Path(__file__).resolve().parent / "results"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--quick", action="store_true", help="a smoke run: L=6, 250 steps, 1 seed"
    )
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument(
        "--out", type=Path, help="results file (default: experiments/results/...)"
    )
    parser.add_argument(
        "--workers",
        type=int,
        default=min(2, os.cpu_count() or 1),
        help="parallel CPU processes, one thread each (default: up to 2)",
    )
    parser.add_argument(
        "--tasks", nargs="+", choices=TASKS, help="default: copy reverse sort"
    )
    parser.add_argument(
        "--schemes", nargs="+", choices=SCHEMES, help="default: all six"
    )
    parser.add_argument(
        "--seeds", nargs="+", type=int, help="default: 0 1 2 3 4 (quick: 0)"
    )
    parser.add_argument(
        "--extra-seeds",
        nargs="*",
        type=int,
        help="added where the first seeds disagree (default: 5 6 7 8 9; quick: none)",
    )
    parser.add_argument(
        "--steps", type=int, help="training steps per run (default: 1200)"
    )
    parser.add_argument(
        "--allow-dirty",
        action="store_true",
        help="run the full sweep although the harness differs from its git commit "
        "(recorded in the results file)",
    )
    args = parser.parse_args(argv)
    if args.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            parser.error(
                "--device cuda: torch.cuda.is_available() is False on this machine"
            )
    if args.steps is not None and args.steps < 1:
        parser.error(f"--steps must be >= 1, got {args.steps}")
    config = sw.QUICK if args.quick else sw.FULL
    if args.steps is not None:
        config = replace(config, steps=args.steps)
    tasks = tuple(args.tasks or (("copy",) if args.quick else sw.FULL_TASKS))
    schemes = tuple(args.schemes or SCHEMES)
    seeds = tuple(
        args.seeds
        if args.seeds is not None
        else ((0,) if args.quick else sw.FULL_SEEDS)
    )
    extra = tuple(
        args.extra_seeds
        if args.extra_seeds is not None
        else (() if args.quick else sw.EXTRA_SEEDS)
    )
    if not args.quick:
        dirty = sw.provenance()["dirty"]
        if dirty and not args.allow_dirty:
            parser.error(
                "the harness differs from its git commit in "
                + ", ".join(dirty)
                + ": the results file would name code that did not produce it. "
                "Commit these files first, or pass --allow-dirty to run anyway "
                "(recorded as code.dirty in the results file)"
            )
        if dirty:
            print(
                "WARNING: running with uncommitted harness code: " + ", ".join(dirty),
                file=sys.stderr,
                flush=True,
            )
    out = args.out
    if out is None and not args.quick:
        out = RESULTS / f"position-matters-{args.device}.json"
    weights_dir = None if out is None or args.quick else out.parent
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
    n_runs = len(tasks) * len(schemes) * len(seeds)
    print(
        f"{n_runs} runs ({', '.join(tasks)} x {len(schemes)} schemes x seeds "
        f"{list(seeds)}), then seeds {list(extra)} where those disagree, on "
        f"{args.device}"
        + (f", {args.workers} workers" if args.device == "cpu" else ""),
        file=sys.stderr,
        flush=True,
    )
    results = sw.sweep(
        config,
        tasks,
        schemes,
        seeds,
        extra,
        args.device,
        args.workers,
        weights_dir,
    )
    if out is not None:
        out.write_text(sw.dumps(results))
    print(sw.summary_table(results))
    if out is not None:
        print(f"results written to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
