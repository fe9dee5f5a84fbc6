"""Does position matter? Train tiny decoders with each positional scheme and measure them at every length.

    python -m experiments.run                  # the full sweep on CPU (make experiment)
    python -m experiments.run --quick          # a smoke run, under a minute; writes nothing unless --out
    python -m experiments.run --reproduce 10   # re-run 10 recorded runs, compare them bit for bit
    python -m experiments.run --device cuda    # the full sweep on a GPU, one run at a time (not pinned)

The full sweep (``experiments.position.sweep``): for each (task, scheme) a peak learning rate chosen on
validation at the training lengths from a small grid, then ten seeds at that rate, every run trained until its
validation exact match stops improving (or a step cap). Its wall time, processor time and the load average
during it are recorded in the results file. One progress line per finished run goes to stderr, the summary
table to stdout at the end. It writes ``experiments/results/position-matters-<device>.json`` (or ``--out``) and,
next to it, the weights of the models whose attention the chapter draws
(``position-matters-copy-<scheme>-seed0.pt``).

Every run executes in a worker process whose CPU kernels are pinned to AVX2, one thread
(``experiments.position.cpu``), so that the same seed gives the same bits on any x86 CPU with AVX2.
``--reproduce N`` re-runs N recorded runs chosen at random (``--reproduce-seed``) and exits 1 unless every
count, curve, probe and weight hash is identical.

The results file records the git commit of the code. The full sweep refuses to start when the harness
(``experiments/``) or the package it uses (``posenc/``) differs from that commit, since the record would then
name code that did not produce it; ``--allow-dirty`` runs anyway and records the differing files.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from types import ModuleType

from experiments.position.cpu import pin_here

RESULTS = Path(__file__).resolve().parent / "results"
TASK_NAMES = ("copy", "reverse", "sort")
SCHEME_NAMES = ("none", "learned", "sinusoidal", "sinusoidal_random", "rotary", "alibi")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--quick",
        action="store_true",
        help="a smoke run: L=6, at most 300 steps, 2 rates, 1 seed, copy only",
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
        "--tasks", nargs="+", choices=TASK_NAMES, help="default: copy reverse sort"
    )
    parser.add_argument(
        "--schemes", nargs="+", choices=SCHEME_NAMES, help="default: all six"
    )
    parser.add_argument("--seeds", nargs="+", type=int, help="default: 0..9 (quick: 0)")
    parser.add_argument(
        "--lr-grid", nargs="+", type=float, help="default: 0.001 0.003 0.01"
    )
    parser.add_argument(
        "--max-steps",
        type=int,
        help="the step cap (a multiple of the validation interval)",
    )
    parser.add_argument(
        "--reproduce",
        type=int,
        metavar="N",
        help="re-run N runs of the results file (--out or the default) and compare",
    )
    parser.add_argument(
        "--reproduce-seed",
        type=int,
        default=0,
        help="seeds the choice of the runs --reproduce re-runs (default 0)",
    )
    parser.add_argument(
        "--checkpoint",
        type=Path,
        help="JSON-lines file of finished runs: a stopped sweep resumes from it "
        "(default for a full sweep: the results file + .partial.jsonl; removed "
        "once the results file is written)",
    )
    parser.add_argument(
        "--allow-dirty",
        action="store_true",
        help="run the full sweep although experiments/ or posenc/ differ from the "
        "git commit (recorded in the results file)",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    # before torch is imported (python -m experiments.run): this process's kernels are pinned
    # too; the workers always are
    pin_here()
    from dataclasses import replace

    from experiments.position import sweep as sw

    if args.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            parser.error(
                "--device cuda: torch.cuda.is_available() is False on this machine"
            )
    if args.workers < 1:
        parser.error(f"--workers must be >= 1, got {args.workers}")
    if args.reproduce is not None:
        return _reproduce(args, parser, sw)
    config = sw.QUICK if args.quick else sw.FULL
    if args.max_steps is not None:
        try:
            config = replace(
                config,
                max_steps=args.max_steps,
                min_steps=min(config.min_steps, args.max_steps),
            )
        except ValueError as error:
            parser.error(f"--max-steps {args.max_steps}: {error}")
    tasks = tuple(args.tasks or (("copy",) if args.quick else sw.FULL_TASKS))
    schemes = tuple(args.schemes or SCHEME_NAMES)
    seeds = tuple(
        args.seeds if args.seeds is not None else ((0,) if args.quick else sw.SEEDS)
    )
    grid = tuple(args.lr_grid or (sw.QUICK_LR_GRID if args.quick else sw.LR_GRID))
    if not args.quick:
        code = sw.provenance()
        dirty = code["dirty"] + code["used_dirty"]
        if dirty and not args.allow_dirty:
            parser.error(
                "the harness or posenc differs from its git commit in "
                + ", ".join(dirty)
                + ": the results file would name code that did not produce it. "
                "Commit these files first, or pass --allow-dirty to run anyway "
                "(recorded as code.dirty and code.used_dirty in the results file)"
            )
        if dirty:
            print(
                "WARNING: running with uncommitted code: " + ", ".join(dirty),
                file=sys.stderr,
                flush=True,
            )
    out = args.out
    if out is None and not args.quick:
        out = RESULTS / f"position-matters-{args.device}.json"
    weights_dir = None if out is None or args.quick else out.parent
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
    n_runs = (
        len(tasks) * len(schemes) * (len(grid) * len(sw.SELECTION_SEEDS) + len(seeds))
    )
    print(
        f"{n_runs} runs ({', '.join(tasks)} x {len(schemes)} schemes: rates "
        f"{list(grid)} on seeds {list(sw.SELECTION_SEEDS)}, then seeds {list(seeds)}) "
        f"on {args.device}"
        + (f", {args.workers} workers" if args.device == "cpu" else ""),
        file=sys.stderr,
        flush=True,
    )
    checkpoint = args.checkpoint
    if checkpoint is None and out is not None and not args.quick:
        checkpoint = out.with_name(out.name + ".partial.jsonl")
    results = sw.sweep(
        config,
        tasks,
        schemes,
        seeds,
        grid,
        sw.SELECTION_SEEDS,
        args.device,
        args.workers,
        weights_dir,
        checkpoint=checkpoint,
    )
    if out is not None:
        out.write_text(sw.dumps(results))
        if checkpoint is not None and args.checkpoint is None:
            checkpoint.unlink(missing_ok=True)
    print(sw.summary_table(results))
    if out is not None:
        print(f"results written to {out}")
    return 0


def _reproduce(
    args: argparse.Namespace, parser: argparse.ArgumentParser, sw: ModuleType
) -> int:
    path = args.out or RESULTS / f"position-matters-{args.device}.json"
    if not path.exists():
        parser.error(f"--reproduce: no results file at {path}; pass --out FILE")
    results = json.loads(path.read_text())
    if args.reproduce < 1 or args.reproduce > len(results["runs"]):
        parser.error(
            f"--reproduce must be in 1..{len(results['runs'])} (the runs of {path}), "
            f"got {args.reproduce}"
        )
    code = sw.provenance()
    recorded = results["code"]["commit"]
    print(
        f"reproducing {args.reproduce} of the {len(results['runs'])} runs of {path.name} "
        f"(drawn with seed {args.reproduce_seed}); recorded at commit "
        f"{(recorded or 'unknown')[:12]} with kernels "
        f"{'/'.join(results['machine']['cpu_capability'])}, now at "
        f"{(code['commit'] or 'unknown')[:12]}"
        + (" (same)" if code["commit"] == recorded else " (differs)")
        + (
            f", uncommitted: {', '.join(code['dirty'] + code['used_dirty'])}"
            if code["dirty"] or code["used_dirty"]
            else ""
        ),
        flush=True,
    )
    outcome = sw.reproduce(
        results, args.reproduce, seed=args.reproduce_seed, workers=args.workers
    )
    bad = [name for name, diff in outcome if diff]
    print(
        f"{len(outcome) - len(bad)} of {len(outcome)} runs reproduced bit for bit"
        + (f"; DIFFERENT: {', '.join(bad)}" if bad else ""),
        flush=True,
    )
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
