"""The sweep: every (task, scheme, seed), run in parallel worker processes, collected into one results file.

Seeds, by a rule fixed before any run: every (task, scheme) pair gets ``FULL_SEEDS`` (five); a pair whose five
seeds disagree, i.e. whose per-seed exact match spreads by more than ``SPREAD`` (0.2) in any window of lengths
(inside 1..L, beyond L+1..2L, far 2L+1..3L), gets ``EXTRA_SEEDS`` (five more), so that a bimodal outcome is
measured on ten seeds. Each run uses one thread, so its numbers do not depend on how many workers run beside it.

The results file (JSON) holds the settings, the seeds, the machine, the torch version, the date, the git commit of
the harness that produced it (and whether its code differed from that commit), the load average during the
sweep, every run's counts at every length and the sweep's wall time; :func:`summarize` reduces it to the
per-scheme statistics the chapter prints (means over seeds with percentile-bootstrap 95 % intervals, per-seed
values, how many seeds meet 95 % exact match inside L) and :func:`check_schema` says whether a file has the
expected shape.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import math
import multiprocessing
import os
import subprocess
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from .model import SCHEMES
from .tasks import N_SYMBOLS, TASKS, VOCAB_SIZE
from .train import ERRORS, TrainConfig, run, steps_to_target

SCHEMA = "posenc.position-matters/2"
ROOT = Path(__file__).resolve().parents[2]
#: The harness's own code: the results file records its commit and refuses (or records) a dirty tree.
CODE = ("experiments/__init__.py", "experiments/run.py", "experiments/position")
#: Code the harness imports from elsewhere in the repository: recorded, not required clean.
USED = ("posenc",)
#: The full sweep (``make experiment``).
FULL = TrainConfig()
FULL_TASKS = ("copy", "reverse", "sort")
FULL_SEEDS = (0, 1, 2, 3, 4)
EXTRA_SEEDS = (5, 6, 7, 8, 9)
#: A pair whose first seeds' exact match spreads by more than this in a window gets ``EXTRA_SEEDS``.
SPREAD = 0.2
#: A quick sweep for tests and smoke runs: short sequences, few steps, one seed, well under a minute.
QUICK = TrainConfig(
    train_max_len=6,
    eval_max_len=12,
    steps=250,
    batch_size=32,
    eval_samples=32,
    validate_every=50,
    validation_per_length=8,
)
#: Models whose weights the full sweep keeps (the chapter draws their attention maps): (task, scheme, seed).
KEEP_WEIGHTS = (
    ("copy", "sinusoidal", 0),
    ("copy", "none", 0),
    ("copy", "alibi", 0),
)
#: In-distribution exact match a run must reach to count as trained (its verdict is per seed).
TARGET = 0.95
#: Bootstrap resamples for the 95 % intervals (percentile bootstrap over seeds).
RESAMPLES = 10_000


def machine(device: str) -> dict[str, Any]:
    """A description of the machine, for the results file (the benchmarks' own, plus the device)."""
    from benchmarks.bench import machine as describe

    return {**describe(device), "device": device}


def _git(*args: str) -> str | None:
    try:
        done = subprocess.run(
            ["git", *args], cwd=ROOT, capture_output=True, text=True, check=True
        )
    except (OSError, subprocess.CalledProcessError):
        return None
    return done.stdout


def provenance() -> dict[str, Any]:
    """The git commit of the working tree and what of the harness (and of the code it uses) differs from it.

    Returns:
        ``{"commit", "dirty", "used_dirty", "files"}``: the HEAD commit (None outside git); the paths of the
        harness's own code (``CODE``) that differ from it or are untracked; the same for ``USED``; and the
        SHA-256 of every file of ``CODE``, as it was when the sweep started.
    """
    commit = _git("rev-parse", "HEAD")

    def changed(paths: tuple[str, ...]) -> list[str]:
        out = _git("status", "--porcelain", "--untracked-files=all", "--", *paths)
        if out is None:
            return list(paths)
        return sorted(line[3:] for line in out.splitlines() if line.strip())

    files = {}
    for entry in CODE:
        path = ROOT / entry
        for file in sorted(path.rglob("*.py")) if path.is_dir() else [path]:
            files[file.relative_to(ROOT).as_posix()] = hashlib.sha256(
                file.read_bytes()
            ).hexdigest()
    return {
        "commit": commit.strip() if commit else None,
        "dirty": changed(CODE),
        "used_dirty": changed(USED),
        "files": files,
    }


def weights_name(task: str, scheme: str, seed: int) -> str:
    """File name of a kept model's ``state_dict``, next to the results file."""
    return f"position-matters-{task}-{scheme}-seed{seed}.pt"


def _one(job: tuple[str, str, int, TrainConfig, str, str | None]) -> dict[str, Any]:
    scheme, task, seed, config, device, save = job
    torch.set_num_threads(1)
    return run(scheme, task, seed, config, device, Path(save) if save else None)


def _load() -> float | None:
    return os.getloadavg()[0] if hasattr(os, "getloadavg") else None


def sweep(
    config: TrainConfig,
    tasks: tuple[str, ...],
    schemes: tuple[str, ...],
    seeds: tuple[int, ...],
    extra_seeds: tuple[int, ...] = (),
    device: str = "cpu",
    workers: int = 1,
    weights_dir: Path | None = None,
    log: Callable[[str], None] = lambda line: print(line, file=sys.stderr, flush=True),
    spread: float = SPREAD,
) -> dict[str, Any]:
    """Train and evaluate every (task, scheme, seed); returns the results-file dict.

    Args:
        config: the settings shared by every run.
        tasks: tasks to run, from ``TASKS``.
        schemes: schemes to run, from ``SCHEMES``.
        seeds: seeds of every (task, scheme).
        extra_seeds: seeds added to the pairs whose first seeds' exact match spreads by
            more than ``spread`` in a window (the second stage); () for none.
        device: ``"cpu"`` or ``"cuda"`` (CUDA runs one at a time, in this process).
        workers: parallel processes on CPU, one thread each.
        weights_dir: where to save the ``KEEP_WEIGHTS`` models (None: keep none).
        log: receives one progress line per finished run.
        spread: the second stage's threshold.
    """
    for name, values, allowed in (
        ("tasks", tasks, TASKS),
        ("schemes", schemes, SCHEMES),
    ):
        bad = [v for v in values if v not in allowed]
        if bad:
            raise ValueError(f"{name}: unknown {bad}; choose from {', '.join(allowed)}")
    overlap = sorted(set(seeds) & set(extra_seeds))
    if overlap:
        raise ValueError(
            f"extra_seeds {list(extra_seeds)} repeat seeds {overlap} of seeds "
            f"{list(seeds)}; pass seeds not in the first stage"
        )
    code = provenance()
    start = time.perf_counter()
    stamp = _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0)
    load_before = list(os.getloadavg()) if hasattr(os, "getloadavg") else None
    records: list[dict[str, Any]] = []
    loads: list[float] = []

    def job(task: str, scheme: str, seed: int) -> tuple:
        keep = weights_dir is not None and (task, scheme, seed) in KEEP_WEIGHTS
        save = str(weights_dir / weights_name(task, scheme, seed)) if keep else None
        return (scheme, task, seed, config, device, save)

    def execute(jobs: list[tuple], stage: int, planned: int) -> None:
        def progress(record: dict[str, Any]) -> None:
            records.append(record)
            load = _load()
            if load is not None:
                loads.append(round(load, 2))
            elapsed = time.perf_counter() - start
            inside = _fraction(record, "exact", 1, config.train_max_len)
            log(
                f"stage {stage} {len(records):3d}/{planned} {record['task']:8s} "
                f"{record['scheme']:17s} seed {record['seed']}: exact inside L "
                f"{inside:.2f} ({record['cpu_seconds']:.0f} s cpu) elapsed "
                f"{elapsed / 60:.1f} min, load {load if load is not None else 'n/a'}"
            )

        if pool is not None:
            for record in pool.imap_unordered(_one, jobs):
                progress(record)
        else:
            threads = torch.get_num_threads()
            try:
                for one in jobs:
                    progress(_one(one))
            finally:
                torch.set_num_threads(threads)

    # one pool for both stages: its workers import the code once, at the start
    pool = None
    if device == "cpu" and workers > 1:
        pool = multiprocessing.get_context("spawn").Pool(workers)
    try:
        first = [job(t, s, seed) for t in tasks for s in schemes for seed in seeds]
        execute(first, 1, len(first))
        stage1 = {"tasks": list(tasks), "schemes": list(schemes), "runs": records}
        stage1["settings"] = asdict(config)
        widened = [
            (t, s)
            for t in tasks
            for s in schemes
            if extra_seeds and seed_spread(stage1, t, s) > spread
        ]
        second = [job(t, s, seed) for t, s in widened for seed in extra_seeds]
        if second:
            log(
                f"stage 2: {len(extra_seeds)} more seeds for "
                + ", ".join(f"{t}/{s}" for t, s in widened)
            )
            execute(second, 2, len(first) + len(second))
    finally:
        if pool is not None:
            pool.close()
            pool.join()
    rank = {
        (t, s): k for k, (t, s) in enumerate((t, s) for t in tasks for s in schemes)
    }
    records.sort(key=lambda r: (rank[(r["task"], r["scheme"])], r["seed"]))
    results: dict[str, Any] = {
        "schema": SCHEMA,
        "date": stamp.date().isoformat(),
        "datetime_utc": stamp.isoformat(),
        "code": code,
        "wall_seconds": round(time.perf_counter() - start, 1),
        "cpu_seconds": round(sum(r["cpu_seconds"] for r in records), 1),
        "machine": machine(device),
        "load_average_before": load_before,
        "load_average_after": list(os.getloadavg())
        if hasattr(os, "getloadavg")
        else None,
        "load_average_during": loads,
        "workers": workers if device == "cpu" else 1,
        "threads_per_run": 1,
        "settings": {
            **asdict(config),
            "evaluation": "teacher-forced argmax (exact match = greedy decoding's)",
        },
        "vocabulary": {
            "symbols": N_SYMBOLS,
            "special_tokens": ["PAD", "BOS", "SEP", "EOS"],
            "size": VOCAB_SIZE,
        },
        "tasks": list(tasks),
        "schemes": list(schemes),
        "seeds": list(seeds),
        "extra_seeds": list(extra_seeds),
        "spread_threshold": spread,
        "target_exact_match_inside": TARGET,
        "bootstrap_resamples": RESAMPLES,
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


def windows(settings: dict[str, Any]) -> dict[str, tuple[int, int]]:
    """The windows of input lengths: inside 1..L, beyond L+1..2L, far 2L+1..3L (those that exist)."""
    L, top = settings["train_max_len"], settings["eval_max_len"]
    spans = {"inside": (1, L), "beyond": (L + 1, 2 * L), "far": (2 * L + 1, 3 * L)}
    return {k: (lo, min(hi, top)) for k, (lo, hi) in spans.items() if lo <= top}


def window_count(
    record: dict[str, Any], key: str, lo: int, hi: int
) -> tuple[int, int] | None:
    """``(count, total)`` of ``record[key]`` over input lengths lo..hi; None if any is undefined.

    The total is what the count is out of: ``examples * (n + 1)`` summed for ``"tokens"``,
    ``examples`` per length otherwise.
    """
    count = total = 0
    for n, value in zip(record["lengths"], record[key]):
        if lo <= n <= hi:
            if value is None:
                return None
            count += value
            total += record["examples"] * (n + 1 if key == "tokens" else 1)
    return (count, total) if total else None


def _fraction(record: dict[str, Any], key: str, lo: int, hi: int) -> float:
    got = window_count(record, key, lo, hi)
    return math.nan if got is None else got[0] / got[1]


def bootstrap_interval(
    counts: list[int], total: int, resamples: int = RESAMPLES, seed: int = 0
) -> tuple[float, float]:
    """Percentile-bootstrap 95 % interval of the mean over seeds of ``count / total``.

    The seeds are resampled with replacement ``resamples`` times; each resample's mean is
    ``sum(counts) / (k * total)``, computed in integers, so the interval is the same on
    every machine.

    Args:
        counts: one count per seed, each out of ``total``.
        total: what each count is out of.
        resamples: number of bootstrap resamples.
        seed: seeds the resampling (numpy's PCG64).

    Returns:
        ``(low, high)``, fractions.
    """
    k = len(counts)
    if k == 0 or total <= 0:
        raise ValueError(
            f"bootstrap_interval needs counts and total > 0, got {counts!r}, {total}"
        )
    if k == 1:
        return counts[0] / total, counts[0] / total
    index = np.random.Generator(np.random.PCG64(seed)).integers(
        0, k, size=(resamples, k)
    )
    sums = np.sort(np.asarray(counts, dtype=np.int64)[index].sum(axis=1))
    low = int(sums[math.floor(0.025 * resamples)])
    high = int(sums[math.ceil(0.975 * resamples) - 1])
    return low / (k * total), high / (k * total)


def _stats(pairs: list[tuple[int, int] | None]) -> dict[str, Any] | None:
    """Mean over seeds with its bootstrap interval, per-seed values, median, min, max."""
    if not pairs or any(p is None for p in pairs):
        return None
    totals = {t for _, t in pairs}
    if len(totals) != 1:
        raise ValueError(f"seeds measured on different totals: {sorted(totals)}")
    total = totals.pop()
    counts = [c for c, _ in pairs]
    per_seed = [c / total for c in counts]
    low, high = bootstrap_interval(counts, total)
    ordered = sorted(per_seed)
    mid = len(ordered) // 2
    median = ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2
    return {
        "mean": round(sum(counts) / (len(counts) * total), 4),
        "ci95": [round(low, 4), round(high, 4)],
        "median": round(median, 4),
        "min": round(ordered[0], 4),
        "max": round(ordered[-1], 4),
        "per_seed": [round(v, 4) for v in per_seed],
    }


def _runs(results: dict[str, Any], task: str, scheme: str) -> list[dict[str, Any]]:
    runs = [r for r in results["runs"] if r["task"] == task and r["scheme"] == scheme]
    return sorted(runs, key=lambda r: r["seed"])


def seed_spread(results: dict[str, Any], task: str, scheme: str) -> float:
    """The largest spread (max minus min over seeds) of the exact match in any window where defined."""
    runs = _runs(results, task, scheme)
    worst = 0.0
    for lo, hi in windows(results["settings"]).values():
        values = [_fraction(r, "exact", lo, hi) for r in runs]
        if values and not any(math.isnan(v) for v in values):
            worst = max(worst, max(values) - min(values))
    return round(worst, 4)


def summarize(results: dict[str, Any]) -> dict[str, Any]:
    """Per task and scheme, over its seeds: exact match, token accuracy and first-token accuracy in each
    window of lengths (:func:`windows`; ``None`` where the scheme is not defined), the share of examples
    by kind of first error past L, the per-seed 95 % verdict inside L, the steps each seed took to reach it
    on the validation set, and the seeds' spread (the second stage's criterion)."""
    spans = windows(results["settings"])
    target = results.get("target_exact_match_inside", TARGET)
    out: dict[str, Any] = {}
    for task in results["tasks"]:
        out[task] = {}
        for scheme in results["schemes"]:
            runs = _runs(results, task, scheme)
            row: dict[str, Any] = {"seeds": [r["seed"] for r in runs]}
            for name, (lo, hi) in spans.items():
                for key in ("exact", "tokens", "first"):
                    row[f"{key}_{name}"] = _stats(
                        [window_count(r, key, lo, hi) for r in runs]
                    )
                if name != "inside":
                    errors = {
                        kind: _stats([window_count(r, kind, lo, hi) for r in runs])
                        for kind in ERRORS
                    }
                    row[f"errors_{name}"] = (
                        None
                        if any(v is None for v in errors.values())
                        else {kind: v["mean"] for kind, v in errors.items()}
                    )
            inside = row["exact_inside"]["per_seed"]
            row["seeds_meeting_target"] = sum(v >= target for v in inside)
            row["steps_to_target"] = [steps_to_target(r["curve"], target) for r in runs]
            row["spread"] = seed_spread(results, task, scheme)
            out[task][scheme] = row
    return out


def summary_table(results: dict[str, Any]) -> str:
    """The summary as text: one line per (task, scheme), exact match as the mean over seeds with its
    bootstrap 95 % interval ("n/d": the scheme is not defined at those lengths), and how many seeds
    reach 95 % inside L."""

    def fmt(stat: dict[str, Any] | None) -> str:
        if stat is None:
            return "n/d".center(17)
        low, high = stat["ci95"]
        return f"{stat['mean']:.2f} [{low:.2f}, {high:.2f}]"

    spans = windows(results["settings"])
    lines = [
        "exact match, mean over seeds [bootstrap 95 % interval], by input length: "
        + ", ".join(f"{name} = {lo}..{hi}" for name, (lo, hi) in spans.items()),
        f"{'task':8s} {'scheme':17s} "
        + " ".join(f"{w:17s}" for w in spans)
        + " seeds >= 95 % inside",
    ]
    for task, rows in results["summary"].items():
        for scheme, row in rows.items():
            cells = " ".join(fmt(row[f"exact_{w}"]) for w in spans)
            met = f"{row['seeds_meeting_target']} of {len(row['seeds'])}"
            lines.append(f"{task:8s} {scheme:17s} {cells} {met}")
    lines.append(
        f"wall time {results['wall_seconds'] / 60:.1f} min; processor time "
        f"{results['cpu_seconds'] / 60:.1f} min, "
        f"{results['cpu_seconds'] / 60 / results['workers']:.1f} min per worker"
    )
    return "\n".join(lines)


def dumps(results: dict[str, Any]) -> str:
    """The results as JSON, one key per line and every list of numbers on one line (short diffs)."""

    def encode(value: Any, indent: int) -> str:
        pad, inner = " " * indent, " " * (indent + 1)
        if isinstance(value, dict):
            if not value:
                return "{}"
            items = [
                f"{inner}{json.dumps(k)}: {encode(v, indent + 1)}"
                for k, v in value.items()
            ]
            return "{\n" + ",\n".join(items) + "\n" + pad + "}"
        if isinstance(value, list) and any(isinstance(v, (dict, list)) for v in value):
            items = [f"{inner}{encode(v, indent + 1)}" for v in value]
            return "[\n" + ",\n".join(items) + "\n" + pad + "]"
        return json.dumps(value)

    return encode(results, 0) + "\n"


def check_schema(results: dict[str, Any]) -> list[str]:
    """What is wrong with a results dict (empty: it matches the schema)."""
    problems = []
    required = {
        "schema": str,
        "date": str,
        "datetime_utc": str,
        "code": dict,
        "wall_seconds": (int, float),
        "cpu_seconds": (int, float),
        "machine": dict,
        "settings": dict,
        "vocabulary": dict,
        "tasks": list,
        "schemes": list,
        "seeds": list,
        "extra_seeds": list,
        "load_average_during": list,
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
    for key in ("commit", "dirty", "used_dirty", "files"):
        if key not in results["code"]:
            problems.append(f"code.{key} missing")
    for key in ("torch", "cpu", "platform", "device"):
        if key not in results["machine"]:
            problems.append(f"machine.{key} missing")
    if results["vocabulary"].get("size") != VOCAB_SIZE:
        problems.append(
            f"vocabulary.size: {results['vocabulary'].get('size')!r}, the harness "
            f"uses {VOCAB_SIZE}"
        )
    settings = {k: v for k, v in results["settings"].items() if k != "evaluation"}
    try:
        config = replace(FULL, **settings)
    except TypeError as error:
        return [*problems, f"settings: {error}"]
    lengths = list(range(1, config.eval_max_len + 1))
    widened = {
        (t, s)
        for t in results["tasks"]
        for s in results["schemes"]
        if results["extra_seeds"]
        and seed_spread(
            {
                **results,
                "runs": [r for r in results["runs"] if r["seed"] in results["seeds"]],
            },
            t,
            s,
        )
        > results.get("spread_threshold", SPREAD)
    }
    expected = {
        (t, s, seed)
        for t in results["tasks"]
        for s in results["schemes"]
        for seed in results["seeds"]
        + (results["extra_seeds"] if (t, s) in widened else [])
    }
    seen = set()
    keys = ("exact", "tokens", "first", *ERRORS)
    for r in results["runs"]:
        key = (r.get("task"), r.get("scheme"), r.get("seed"))
        seen.add(key)
        if r.get("lengths") != lengths:
            problems.append(f"run {key}: lengths are not 1..{config.eval_max_len}")
            continue
        if r.get("examples") != config.eval_samples:
            problems.append(f"run {key}: examples is not {config.eval_samples}")
            continue
        for metric in keys:
            values = r.get(metric)
            if not isinstance(values, list) or len(values) != len(lengths):
                problems.append(f"run {key}: {metric} has no value per length")
        if any(f"run {key}" in p for p in problems):
            continue
        for i, n in enumerate(lengths):
            fits = key[1] != "learned" or n <= config.train_max_len
            row = [r[m][i] for m in keys]
            if not fits:
                if any(v is not None for v in row):
                    problems.append(f"run {key}: n={n} should be None (not defined)")
                continue
            if not all(isinstance(v, int) and v >= 0 for v in row):
                problems.append(f"run {key}: n={n} counts {row} are not counts")
                continue
            exact, tokens, first, *errors = row
            if exact + sum(errors) != r["examples"]:
                problems.append(
                    f"run {key}: n={n} exact + errors = {exact + sum(errors)}, "
                    f"not {r['examples']}"
                )
            if tokens > r["examples"] * (n + 1) or first > r["examples"]:
                problems.append(f"run {key}: n={n} tokens or first above the total")
        curve = r.get("curve", {})
        if not curve.get("steps") or curve["steps"][-1] != config.steps:
            problems.append(
                f"run {key}: the learning curve does not end at step {config.steps}"
            )
        if not isinstance(r.get("greedy_check"), dict):
            problems.append(f"run {key}: greedy_check missing")
    if seen != expected:
        problems.append(
            f"runs: missing {sorted(expected - seen)}, unexpected {sorted(seen - expected)}"
        )
    return problems
