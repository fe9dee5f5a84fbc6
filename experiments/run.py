"""Does position matter? Train tiny decoders with each positional scheme and measure them at every length.

    python -m experiments.run                  # the full sweep on CPU (make experiment), ~22 minutes on 2 cores
    python -m experiments.run --quick          # a smoke run, under a minute; writes nothing unless --out
    python -m experiments.run --device cuda    # the full sweep on a GPU, one run at a time

One progress line per finished run goes to stderr, the summary table to stdout at the end. The full sweep writes
``experiments/results/position-matters-<device>.json`` (or ``--out``) and, next to it, the weights of the models
whose attention the chapter draws (``position-matters-copy-<scheme>-seed0.pt``).
"""

from __future__ import annotations

import argparse
import json
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
        "--seeds", nargs="+", type=int, help="default: 0 1 2 (quick: 0)"
    )
    parser.add_argument(
        "--steps", type=int, help="training steps per run (default: 1200)"
    )
    args = parser.parse_args(argv)
    if args.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            parser.error(
                "--device cuda: torch.cuda.is_available() is False on this machine"
            )
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
    out = args.out
    if out is None and not args.quick:
        out = RESULTS / f"position-matters-{args.device}.json"
    weights_dir = None if out is None or args.quick else out.parent
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
    n_runs = len(tasks) * len(schemes) * len(seeds)
    print(
        f"{n_runs} runs ({', '.join(tasks)} x {len(schemes)} schemes x seeds {list(seeds)}) on {args.device}"
        + (f", {args.workers} workers" if args.device == "cpu" else ""),
        file=sys.stderr,
        flush=True,
    )
    results = sw.sweep(
        config, tasks, schemes, seeds, args.device, args.workers, weights_dir
    )
    if out is not None:
        out.write_text(json.dumps(results, indent=1) + "\n")
    print(sw.summary_table(results))
    if out is not None:
        print(f"results written to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
