"""Trained at L, run at 4 L: which rope scaling, and does it need a fine-tune?

    python -m experiments.context                 # the full sweep (make context-experiment)
    python -m experiments.context --quick         # a smoke run, under 30 s; writes nothing unless --out
    python -m experiments.context --reproduce 3   # re-run 3 recorded runs, compare them bit for bit

The full sweep (:mod:`experiments.context.sweep`) trains five byte-level models of mpmath's source at L = 64,
evaluates each zero-shot under every scaling at L, 2L, 4L and 8L, and fine-tunes each under every scaling at
4L for the same small step budget. It writes ``experiments/results/context-extension-cpu.json`` and, next to
it, the five base models (``context-extension-base-seed<N>.pt``), which the fine-tunes and ``--reproduce``
load. Every run executes in one worker process, one thread, its kernels pinned to AVX2
(``experiments.position.cpu``). The full sweep refuses to start when ``experiments/`` or ``posenc/`` differ
from the git commit; a stopped sweep resumes from ``<results>.partial.jsonl``.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from experiments.position.cpu import pin_here

DEFAULT = Path(__file__).resolve().parents[1] / "results" / "context-extension-cpu.json"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--quick", action="store_true", help="a smoke run: L=16, 1 seed"
    )
    parser.add_argument(
        "--out", type=Path, help=f"results file (default: {DEFAULT.name})"
    )
    parser.add_argument("--seeds", nargs="+", type=int, help="default: 0..4 (quick: 0)")
    parser.add_argument(
        "--reproduce", type=int, metavar="N", help="re-run N recorded runs and compare"
    )
    parser.add_argument(
        "--reproduce-seed",
        type=int,
        default=0,
        help="seeds the choice of runs (default 0)",
    )
    parser.add_argument(
        "--allow-dirty",
        action="store_true",
        help="run the full sweep although experiments/ or posenc/ differ from the commit",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    pin_here()  # before torch is imported: this process's kernels too
    from experiments.context import sweep as sw

    if args.reproduce is not None:
        path = args.out or DEFAULT
        if not path.exists():
            parser.error(f"--reproduce: no results file at {path}; pass --out FILE")
        results = json.loads(path.read_text())
        if not 1 <= args.reproduce <= len(results["runs"]):
            parser.error(f"--reproduce must be in 1..{len(results['runs'])}")
        code = sw.provenance()
        recorded = results["code"]["commit"] or "unknown"
        print(
            f"reproducing {args.reproduce} of the {len(results['runs'])} runs of "
            f"{path.name} (drawn with seed {args.reproduce_seed}); recorded at commit "
            f"{recorded[:12]} with kernels {'/'.join(results['machine']['cpu_capability'])}, "
            f"now at {(code['commit'] or 'unknown')[:12]}"
            + (" (same)" if code["commit"] == recorded else " (differs)"),
            flush=True,
        )
        outcome = sw.reproduce(
            results, args.reproduce, path.parent, args.reproduce_seed
        )
        bad = [name for name, diff in outcome if diff]
        print(
            f"{len(outcome) - len(bad)} of {len(outcome)} runs reproduced bit for bit"
            + (f"; DIFFERENT: {', '.join(bad)}" if bad else ""),
            flush=True,
        )
        return 1 if bad else 0
    config = sw.QUICK if args.quick else sw.FULL
    seeds = tuple(args.seeds or (sw.QUICK_SEEDS if args.quick else sw.SEEDS))
    if not args.quick:
        code = sw.provenance()
        dirty = code["dirty"] + code["used_dirty"]
        if dirty and not args.allow_dirty:
            parser.error(
                "the harness or posenc differs from its git commit in "
                + ", ".join(dirty)
                + ": the results file would name code that did not produce it. "
                "Commit these files first, or pass --allow-dirty"
            )
    out = args.out if args.out is not None else (None if args.quick else DEFAULT)
    with tempfile.TemporaryDirectory() as scratch:
        weights_dir = Path(scratch) if out is None else out.parent
        checkpoint = None if args.quick else out.with_name(out.name + ".partial.jsonl")
        results = sw.sweep(config, seeds, weights_dir, workers=1, checkpoint=checkpoint)
    problems = sw.check_schema(results)
    if problems:
        print("results file malformed: " + "; ".join(problems), file=sys.stderr)
        return 1
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(sw.dumps(results))
        if checkpoint is not None:
            checkpoint.unlink(missing_ok=True)
    print(sw.table(results))
    print(f"wall {results['wall_seconds']} s, processor {results['cpu_seconds']} s")
    if out is not None:
        print(f"results written to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
