"""The sweep: every (task, scheme, seed), run in parallel worker processes, collected into one results file.

Each run uses one thread, so its numbers do not depend on how many workers run beside it. The results file
(JSON) holds the settings, the seeds, the machine, the torch version, the date, every run's accuracy at every
length and the sweep's wall time; :func:`summarize` reduces it to the per-scheme table the chapter prints and
:func:`check_schema` says whether a file has the expected shape.
"""

from __future__ import annotations

import datetime as _dt
import math
import multiprocessing
import os
import statistics
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any, Callable

import torch

from .model import SCHEMES
from .tasks import N_SYMBOLS, TASKS, VOCAB_SIZE
from .train import TrainConfig, run

SCHEMA = "posenc.position-matters/1"
#: The full sweep (``make experiment``).
FULL = TrainConfig()
FULL_TASKS = ("copy", "reverse", "sort")
FULL_SEEDS = (0, 1, 2)
#: A quick sweep for tests and smoke runs: short sequences, few steps, one seed, well under a minute.
QUICK = TrainConfig(
    train_max_len=6,
    eval_max_len=12,
    steps=250,
    batch_size=32,
    eval_samples=32,
    eval_group=6,
)
#: Models whose weights the full sweep keeps (the chapter draws their attention maps): (task, scheme, seed).
KEEP_WEIGHTS = (("copy", "sinusoidal", 0), ("copy", "none", 0))
#: In-distribution exact match every scheme except NoPE should reach.
TARGET = 0.95


def machine(device: str) -> dict[str, Any]:
    """A description of the machine, for the results file (the benchmarks' own, plus the device)."""
    from benchmarks.bench import machine as describe

    return {**describe(device), "device": device}


def weights_name(task: str, scheme: str, seed: int) -> str:
    """File name of a kept model's ``state_dict``, next to the results file."""
    return f"position-matters-{task}-{scheme}-seed{seed}.pt"


def _one(job: tuple[str, str, int, TrainConfig, str, str | None]) -> dict[str, Any]:
    scheme, task, seed, config, device, save = job
    torch.set_num_threads(1)
    return run(scheme, task, seed, config, device, Path(save) if save else None)


def sweep(
    config: TrainConfig,
    tasks: tuple[str, ...],
    schemes: tuple[str, ...],
    seeds: tuple[int, ...],
    device: str = "cpu",
    workers: int = 1,
    weights_dir: Path | None = None,
    log: Callable[[str], None] = lambda line: print(line, file=sys.stderr, flush=True),
) -> dict[str, Any]:
    """Train and evaluate every (task, scheme, seed); returns the results-file dict.

    Args:
        config: the settings shared by every run.
        tasks: tasks to run, from ``TASKS``.
        schemes: schemes to run, from ``SCHEMES``.
        seeds: seeds per (task, scheme).
        device: ``"cpu"`` or ``"cuda"`` (CUDA runs one at a time, in this process).
        workers: parallel processes on CPU, one thread each.
        weights_dir: where to save the ``KEEP_WEIGHTS`` models (None: keep none).
        log: receives one progress line per finished run.
    """
    for name, values, allowed in (
        ("tasks", tasks, TASKS),
        ("schemes", schemes, SCHEMES),
    ):
        bad = [v for v in values if v not in allowed]
        if bad:
            raise ValueError(f"{name}: unknown {bad}; choose from {', '.join(allowed)}")
    jobs = []
    for task in tasks:
        for scheme in schemes:
            for seed in seeds:
                keep = weights_dir is not None and (task, scheme, seed) in KEEP_WEIGHTS
                save = (
                    str(weights_dir / weights_name(task, scheme, seed))
                    if keep
                    else None
                )
                jobs.append((scheme, task, seed, config, device, save))
    start = time.perf_counter()
    stamp = _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0)
    load_before = list(os.getloadavg()) if hasattr(os, "getloadavg") else None
    records = []

    def progress(record: dict[str, Any]) -> None:
        records.append(record)
        elapsed = time.perf_counter() - start
        left = elapsed / len(records) * (len(jobs) - len(records))
        inside = _window(record, 1, config.train_max_len)
        bar = "#" * (20 * len(records) // len(jobs))
        log(
            f"[{bar:<20}] {len(records):3d}/{len(jobs)} {record['task']:8s} {record['scheme']:17s} "
            f"seed {record['seed']}: exact match inside L {inside:.2f} "
            f"({record['train_seconds']:.0f} s + {record['eval_seconds']:.0f} s) "
            f"elapsed {elapsed / 60:.1f} min, about {left / 60:.1f} min left"
        )

    if device == "cpu" and workers > 1:
        context = multiprocessing.get_context("spawn")
        with context.Pool(workers) as pool:
            for record in pool.imap_unordered(_one, jobs):
                progress(record)
    else:
        threads = torch.get_num_threads()
        try:
            for job in jobs:
                progress(_one(job))
        finally:
            torch.set_num_threads(threads)
    order = {(j[1], j[0], j[2]): k for k, j in enumerate(jobs)}
    records.sort(key=lambda r: order[(r["task"], r["scheme"], r["seed"])])
    results: dict[str, Any] = {
        "schema": SCHEMA,
        "date": stamp.date().isoformat(),
        "datetime_utc": stamp.isoformat(),
        "wall_seconds": round(time.perf_counter() - start, 1),
        "cpu_seconds": round(sum(r["cpu_seconds"] for r in records), 1),
        "load_average_after": list(os.getloadavg())
        if hasattr(os, "getloadavg")
        else None,
        "machine": machine(device),
        "load_average_before": load_before,
        "workers": workers if device == "cpu" else 1,
        "threads_per_run": 1,
        "settings": {**asdict(config), "decoding": "greedy, KV cache"},
        "vocabulary": {
            "symbols": N_SYMBOLS,
            "special_tokens": ["PAD", "BOS", "SEP", "EOS"],
            "size": VOCAB_SIZE,
        },
        "tasks": list(tasks),
        "schemes": list(schemes),
        "seeds": list(seeds),
        "target_exact_match_inside": TARGET,
        "weights": {
            f"{task}/{scheme}/{seed}": weights_name(task, scheme, seed)
            for task, scheme, seed in KEEP_WEIGHTS
            if weights_dir is not None
            and task in tasks
            and scheme in schemes
            and seed in seeds
        },
        "runs": records,
    }
    results["summary"] = summarize(results)
    return results


def _window(
    record: dict[str, Any], lo: int, hi: int, key: str = "exact_match"
) -> float | None:
    """Mean of ``record[key]`` over input lengths lo..hi; None if any of them is undefined."""
    values = [v for n, v in zip(record["lengths"], record[key]) if lo <= n <= hi]
    if not values or any(v is None for v in values):
        return None
    return sum(values) / len(values)


def _stats(values: list[float | None]) -> dict[str, float] | None:
    if not values or any(v is None for v in values):
        return None
    clean = [float(v) for v in values if v is not None]
    return {
        "mean": round(statistics.fmean(clean), 4),
        "std": round(statistics.stdev(clean), 4) if len(clean) > 1 else 0.0,
        "min": round(min(clean), 4),
        "max": round(max(clean), 4),
    }


def summarize(results: dict[str, Any]) -> dict[str, Any]:
    """Per task and scheme, over seeds: exact match and token accuracy averaged over the lengths inside
    (1..L), just beyond (L+1..2L) and far beyond (2L+1..3L), and token accuracy at exactly 2L and 3L
    (``None`` where the scheme is not defined). ``meets_target``: the seed-mean exact match inside reaches
    ``TARGET``."""
    L = results["settings"]["train_max_len"]
    top = results["settings"]["eval_max_len"]
    windows = {"inside": (1, L), "beyond": (L + 1, 2 * L), "far": (2 * L + 1, top)}
    out: dict[str, Any] = {}
    for task in results["tasks"]:
        out[task] = {}
        for scheme in results["schemes"]:
            runs = [
                r
                for r in results["runs"]
                if r["task"] == task and r["scheme"] == scheme
            ]
            row: dict[str, Any] = {}
            for name, (lo, hi) in windows.items():
                if lo > hi:
                    continue
                for key, short in (
                    ("exact_match", "exact"),
                    ("token_accuracy", "token"),
                ):
                    row[f"{short}_{name}"] = _stats(
                        [_window(r, lo, hi, key) for r in runs]
                    )
            for n, label in ((2 * L, "token_at_2L"), (3 * L, "token_at_3L")):
                if n <= top:
                    row[label] = _stats(
                        [_window(r, n, n, "token_accuracy") for r in runs]
                    )
            inside = row["exact_inside"]
            row["meets_target"] = inside is not None and inside["mean"] >= TARGET
            out[task][scheme] = row
    return out


def summary_table(results: dict[str, Any]) -> str:
    """The summary as text: one line per (task, scheme), exact match as mean ± std over seeds
    ("n/d": the scheme is not defined at those lengths)."""

    def fmt(stat: dict[str, float] | None) -> str:
        return (
            "n/d".center(11)
            if stat is None
            else f"{stat['mean']:.2f} ± {stat['std']:.2f}"
        )

    L, top = results["settings"]["train_max_len"], results["settings"]["eval_max_len"]
    windows = {"inside": f"1..{L}", "beyond": f"{L + 1}..{min(2 * L, top)}"}
    if top > 2 * L:
        windows["far"] = f"{2 * L + 1}..{top}"
    lines = [
        f"exact match, mean ± std over {len(results['seeds'])} seeds, by input length: "
        + ", ".join(f"{name} = {span}" for name, span in windows.items()),
        f"{'task':8s} {'scheme':17s} "
        + " ".join(f"{w:11s}" for w in windows)
        + " target",
    ]
    for task, rows in results["summary"].items():
        for scheme, row in rows.items():
            cells = " ".join(fmt(row[f"exact_{w}"]) for w in windows)
            met = "met" if row["meets_target"] else "NOT met"
            met += " (not required)" if scheme == "none" else ""
            lines.append(f"{task:8s} {scheme:17s} {cells} {met}")
    lines.append(
        f"wall time {results['wall_seconds'] / 60:.1f} min; processor time "
        f"{results['cpu_seconds'] / 60:.1f} min, "
        f"{results['cpu_seconds'] / 60 / results['workers']:.1f} min per worker"
    )
    return "\n".join(lines)


def check_schema(results: dict[str, Any]) -> list[str]:
    """What is wrong with a results dict (empty: it matches the schema)."""
    problems = []
    required = {
        "schema": str,
        "date": str,
        "datetime_utc": str,
        "wall_seconds": (int, float),
        "cpu_seconds": (int, float),
        "machine": dict,
        "settings": dict,
        "vocabulary": dict,
        "tasks": list,
        "schemes": list,
        "seeds": list,
        "runs": list,
        "summary": dict,
    }
    for key, kind in required.items():
        if not isinstance(results.get(key), kind):
            problems.append(f"{key}: missing or not {kind}")
    if problems:
        return problems
    if results["schema"] != SCHEMA:
        problems.append(f"schema: {results['schema']!r}, expected {SCHEMA!r}")
    for key in ("torch", "cpu", "platform", "device"):
        if key not in results["machine"]:
            problems.append(f"machine.{key} missing")
    if results["vocabulary"].get("size") != VOCAB_SIZE:
        problems.append(
            f"vocabulary.size: {results['vocabulary'].get('size')!r}, the harness "
            f"uses {VOCAB_SIZE}"
        )
    settings = results["settings"]
    try:
        config = replace(FULL, **{k: v for k, v in settings.items() if k != "decoding"})
    except TypeError as error:
        return [*problems, f"settings: {error}"]
    lengths = list(range(1, config.eval_max_len + 1))
    expected = {
        (t, s, seed)
        for t in results["tasks"]
        for s in results["schemes"]
        for seed in results["seeds"]
    }
    seen = set()
    for r in results["runs"]:
        key = (r.get("task"), r.get("scheme"), r.get("seed"))
        seen.add(key)
        if r.get("lengths") != lengths:
            problems.append(f"run {key}: lengths are not 1..{config.eval_max_len}")
            continue
        for metric in ("exact_match", "token_accuracy"):
            values = r.get(metric)
            if not isinstance(values, list) or len(values) != len(lengths):
                problems.append(f"run {key}: {metric} has no value per length")
                continue
            for n, v in zip(lengths, values):
                fits = key[1] != "learned" or 2 * n + 2 <= 2 * config.train_max_len + 2
                if fits and not (
                    isinstance(v, (int, float)) and 0 <= v <= 1 and math.isfinite(v)
                ):
                    problems.append(
                        f"run {key}: {metric} at n={n} is {v!r}, not in [0, 1]"
                    )
                if not fits and v is not None:
                    problems.append(
                        f"run {key}: {metric} at n={n} should be None (not defined)"
                    )
    if seen != expected:
        problems.append(
            f"runs: missing {sorted(expected - seen)}, unexpected {sorted(seen - expected)}"
        )
    return problems
