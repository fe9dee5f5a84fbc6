"""The sweep: a learning rate per (task, scheme), then ten seeds of each, in pinned worker processes.

Two stages, by rules fixed in this file and recorded in the results file:

1. **Learning rate.** For every (task, scheme), one run per rate of ``LR_GRID`` and seed of ``SELECTION_SEEDS``
   (seeds the second stage does not use), each trained by the convergence rule of
   :mod:`experiments.position.train`, evaluated on its validation set only (lengths 1..L). The rate with the
   highest mean final validation exact match wins; ties go to the fewer mean steps, then to the smaller rate
   (:func:`choose_lr`). Nothing past L is looked at.
2. **Seeds.** Every (task, scheme) is trained with its rate on every seed of ``SEEDS`` (ten) and evaluated at every
   length 1..3L.

Every run executes in a worker process whose environment pins the CPU kernels (:mod:`experiments.position.cpu`)
and one thread, so that its numbers and its final weights (recorded as a SHA-256) are the same on any x86 CPU
with AVX2. :func:`reproduce` re-runs recorded runs and compares them bit for bit.

:func:`summarize` reduces the runs to what the chapter prints, per (task, scheme): how many seeds converged and
how many meet 95 % exact match inside L; per window of lengths the mean over seeds with a Student-t 95 %
interval (which keeps its coverage at ten seeds where a percentile bootstrap does not) and every seed's value;
and the number of seeds that *extrapolate* (exact match >= ``EXTRAPOLATES`` over L+1..2L) with its exact
Clopper-Pearson 95 % interval. :func:`check_schema` says whether a file has the expected shape and kept its rules.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import math
import multiprocessing
import os
import platform
import random
import subprocess
import sys
import time
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from dataclasses import asdict, fields, replace
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from .cpu import PINNED, pinned
from .model import SCHEMES
from .tasks import N_SYMBOLS, TASKS, VOCAB_SIZE
from .train import ERRORS, TrainConfig, run

SCHEMA = "posenc.position-matters/3"
ROOT = Path(__file__).resolve().parents[2]
#: The harness's own code: a full sweep refuses to start when it differs from the commit.
CODE = ("experiments/__init__.py", "experiments/run.py", "experiments/position")
#: Code the harness imports from elsewhere in the repository: also required clean.
USED = ("posenc",)
#: The full sweep (``make experiment``).
FULL = TrainConfig()
FULL_TASKS = ("copy", "reverse", "sort")
#: The seeds of the second stage: ten per (task, scheme).
SEEDS = tuple(range(10))
#: The first stage: the peak learning rates tried, and the seeds it trains (none of ``SEEDS``).
LR_GRID = (1e-3, 3e-3, 1e-2)
SELECTION_SEEDS = (100,)
#: A quick sweep for tests and smoke runs: short sequences, few steps, well under a minute.
QUICK = TrainConfig(
    train_max_len=6,
    eval_max_len=12,
    max_steps=300,
    min_steps=100,
    batch_size=32,
    eval_samples=32,
    validate_every=50,
    validation_per_length=8,
)
QUICK_LR_GRID = (3e-3, 1e-2)
#: Models whose weights the full sweep keeps (the chapter draws their attention maps): (task, scheme, seed).
KEEP_WEIGHTS = (
    ("copy", "sinusoidal", 0),
    ("copy", "none", 0),
    ("copy", "alibi", 0),
)
#: In-distribution exact match (over 1..L) a seed must reach to count as *solving* its task.
TARGET = 0.95
#: A seed *extrapolates* when its exact match over lengths L+1..2L is at least this.
EXTRAPOLATES = 0.5
#: The level of every interval.
LEVEL = 0.95
#: Record fields that measure time or the machine, not the computation: left out of comparisons.
TIMINGS = ("train_seconds", "eval_seconds", "cpu_seconds")


# ---------------------------------------------------------------------------------------------------------
# Intervals


def _t_two_sided(t: float, df: int) -> float:
    """P(|T| <= t) for Student's t with ``df`` degrees of freedom, by the finite series of
    Abramowitz and Stegun 26.7.3-4 (exact for integer ``df``)."""
    theta = math.atan(t / math.sqrt(df))
    c2 = math.cos(theta) ** 2
    if df % 2:
        term, total = math.cos(theta), 0.0
        if df > 1:
            total = term
            for k in range(3, df - 1, 2):
                term *= c2 * (k - 1) / k
                total += term
        return 2 / math.pi * (theta + math.sin(theta) * total)
    term = total = 1.0
    for k in range(2, df - 1, 2):
        term *= c2 * (k - 1) / k
        total += term
    return math.sin(theta) * total


def t_quantile(p: float, df: int) -> float:
    """The ``p`` quantile (0.5 < p < 1) of Student's t with ``df`` degrees of freedom, to 1e-12.

    Raises:
        ValueError: ``p`` outside (0.5, 1) or ``df`` < 1.
    """
    if not 0.5 < p < 1 or df < 1:
        raise ValueError(
            f"t_quantile needs 0.5 < p < 1 and df >= 1, got p={p}, df={df}"
        )
    target, low, high = 2 * p - 1, 0.0, 1.0
    while _t_two_sided(high, df) < target:
        high *= 2
    for _ in range(200):
        mid = (low + high) / 2
        low, high = (mid, high) if _t_two_sided(mid, df) < target else (low, mid)
        if high - low < 1e-13:
            break
    return (low + high) / 2


def t_interval(values: list[float], level: float = LEVEL) -> tuple[float, float]:
    """The Student-t interval for the mean of ``values``: mean +- t_{(1+level)/2, k-1} s / sqrt(k).

    Exact for normal data; at ten seeds it keeps its coverage far better than a percentile bootstrap
    (``tests/experiments/test_position.py`` simulates both). Where every value
    is equal it has width 0.

    Args:
        values: one value per seed, at least two.
        level: the coverage, in (0, 1).

    Returns:
        ``(low, high)``.
    """
    k = len(values)
    if k < 2:
        raise ValueError(f"t_interval needs at least 2 values, got {values!r}")
    mean = sum(values) / k
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (k - 1))
    half = t_quantile((1 + level) / 2, k - 1) * sd / math.sqrt(k)
    return mean - half, mean + half


def _binomial_at_least(k: int, n: int, p: float) -> float:
    return sum(math.comb(n, i) * p**i * (1 - p) ** (n - i) for i in range(k, n + 1))


def clopper_pearson(k: int, n: int, level: float = LEVEL) -> tuple[float, float]:
    """The exact (Clopper-Pearson) interval for a binomial proportion, k successes in n trials.

    ``low`` solves P(X >= k | p) = (1 - level) / 2 (0 when k = 0), ``high`` solves
    P(X <= k | p) = (1 - level) / 2 (1 when k = n); both by bisection to 1e-12. Its coverage is
    at least ``level`` at every p.

    Returns:
        ``(low, high)``.
    """
    if not (isinstance(k, int) and isinstance(n, int) and 0 <= k <= n and n >= 1):
        raise ValueError(
            f"clopper_pearson needs ints 0 <= k <= n, n >= 1, got {k}, {n}"
        )
    alpha = (1 - level) / 2

    def solve(f: Callable[[float], float]) -> float:
        # f increases in p; its root in [0, 1]
        low, high = 0.0, 1.0
        for _ in range(100):
            mid = (low + high) / 2
            low, high = (mid, high) if f(mid) < 0 else (low, mid)
        return (low + high) / 2

    lower = 0.0 if k == 0 else solve(lambda p: _binomial_at_least(k, n, p) - alpha)
    upper = (
        1.0
        if k == n
        else solve(lambda p: alpha - (1 - _binomial_at_least(k + 1, n, p)))
    )
    return lower, upper


# ---------------------------------------------------------------------------------------------------------
# Provenance and machine


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
        return sorted(
            line[3:]
            for line in out.splitlines()
            if line.strip() and "__pycache__" not in line
        )

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


def machine(device: str) -> dict[str, Any]:
    """The machine, for the results file (the kernels the runs used are added by the sweep)."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(
                line.split(":", 1)[1].strip()
                for line in f
                if line.startswith("model name")
            )
    except (OSError, StopIteration):
        pass
    info: dict[str, Any] = {
        "cpu": cpu,
        "cpu_count": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "numpy": np.__version__,
        "device": device,
    }
    if device == "cuda":
        info["gpu"] = torch.cuda.get_device_name(0)
    return info


def weights_name(task: str, scheme: str, seed: int) -> str:
    """File name of a kept model's ``state_dict``, next to the results file."""
    return f"position-matters-{task}-{scheme}-seed{seed}.pt"


# ---------------------------------------------------------------------------------------------------------
# Running


def _one(job: dict[str, Any]) -> dict[str, Any]:
    """Run one job in a worker: one thread, the settings of ``job["config"]``; a job marked
    ``pinned`` refuses to run in a process whose environment lacks the pin."""
    unpinned = {
        k: os.environ.get(k) for k, v in PINNED.items() if os.environ.get(k) != v
    }
    if job.get("pinned") and unpinned:
        raise RuntimeError(
            f"a pinned job in a worker whose environment has {unpinned}, not {PINNED}: "
            "start the workers inside experiments.position.cpu.pinned()"
        )
    torch.set_num_threads(1)
    config = TrainConfig(**job["config"])
    save = Path(job["save"]) if job.get("save") else None
    return run(
        job["scheme"],
        job["task"],
        job["seed"],
        config,
        job["device"],
        save,
        job["evaluation"],
    )


def _job(
    config: TrainConfig,
    task: str,
    scheme: str,
    seed: int,
    lr: float,
    device: str,
    evaluation: bool,
    save: Path | None = None,
) -> dict[str, Any]:
    return {
        "task": task,
        "scheme": scheme,
        "seed": seed,
        "config": asdict(replace(config, lr=lr)),
        "device": device,
        "evaluation": evaluation,
        "save": str(save) if save else None,
    }


class Runner:
    """Runs jobs in ``workers`` spawned processes whose environment pins the CPU kernels
    (``PINNED``; the pin holds in this process's environment while the runner is open, so that a
    worker started at any time inherits it), or in this process (``workers=0``, CUDA: nothing
    pinned)."""

    def __init__(self, workers: int) -> None:
        self.workers = workers
        self.pool: ProcessPoolExecutor | None = None
        self._pin: Any = None

    def __enter__(self) -> Runner:
        if self.workers > 0:
            self._pin = pinned()
            self._pin.__enter__()
            self.pool = ProcessPoolExecutor(
                self.workers, mp_context=multiprocessing.get_context("spawn")
            )
        return self

    def __exit__(self, *exc: object) -> None:
        if self.pool is not None:
            self.pool.shutdown(wait=True, cancel_futures=True)
        if self._pin is not None:
            self._pin.__exit__(None, None, None)

    def submit(self, job: dict[str, Any]) -> Future:
        if self.pool is not None:
            return self.pool.submit(_one, {**job, "pinned": True})
        future: Future = Future()
        threads = torch.get_num_threads()
        try:
            future.set_result(_one(job))
        finally:
            torch.set_num_threads(threads)
        return future


def _load() -> float | None:
    return round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None


def choose_lr(
    runs: list[dict[str, Any]], grid: tuple[float, ...]
) -> tuple[float, dict[str, Any]]:
    """The first stage's choice for one (task, scheme) from its runs (one per rate and seed).

    The rate whose runs end with the highest mean validation exact match wins; ties go to the
    fewer mean steps, then the smaller rate.

    Returns:
        ``(lr, by_lr)``: the rate, and per rate (keyed by ``repr``) the runs' final validation
        exact match, steps and convergence.
    """
    by_lr: dict[str, Any] = {}
    ranking = []
    for lr in grid:
        mine = sorted((r for r in runs if r["lr"] == lr), key=lambda r: r["seed"])
        if not mine:
            raise ValueError(f"no selection run at lr={lr}")
        final = [r["curve"]["exact"][-1] for r in mine]
        steps = [r["steps"] for r in mine]
        by_lr[repr(lr)] = {
            "final_exact": final,
            "steps": steps,
            "converged": [r["converged"] for r in mine],
        }
        ranking.append(
            (-round(sum(final) / len(final), 6), sum(steps) / len(steps), lr)
        )
    return min(ranking)[2], by_lr


def sweep(
    config: TrainConfig,
    tasks: tuple[str, ...],
    schemes: tuple[str, ...],
    seeds: tuple[int, ...],
    lr_grid: tuple[float, ...] = LR_GRID,
    selection_seeds: tuple[int, ...] = SELECTION_SEEDS,
    device: str = "cpu",
    workers: int = 1,
    weights_dir: Path | None = None,
    log: Callable[[str], None] = lambda line: print(line, file=sys.stderr, flush=True),
    checkpoint: Path | None = None,
) -> dict[str, Any]:
    """Choose each pair's learning rate, then train and evaluate every (task, scheme, seed).

    With ``checkpoint``, every finished run is appended to that file (one JSON line), and a run
    already there for the same commit and the same job is taken from it instead of being run
    again: a sweep that was stopped resumes where it stopped. Runs are deterministic under the
    pinned kernels, so a resumed sweep records what an uninterrupted one would (the timings
    aside: ``wall_seconds`` adds up the wall time of every invocation).

    Args:
        config: the settings shared by every run (its ``lr`` is replaced by each pair's).
        tasks: tasks to run, from ``TASKS``.
        schemes: schemes to run, from ``SCHEMES``.
        seeds: the seeds of the second stage.
        lr_grid: the rates of the first stage.
        selection_seeds: the seeds of the first stage (disjoint from ``seeds``).
        device: ``"cpu"`` or ``"cuda"`` (CUDA runs one at a time, in this process).
        workers: parallel CPU processes, one thread each, kernels pinned.
        weights_dir: where to save the ``KEEP_WEIGHTS`` models (None: keep none).
        log: receives one progress line per finished run.
        checkpoint: a JSON-lines file of finished runs to resume from and append to (None: none).

    Returns:
        the results-file dict.
    """
    for name, values, allowed in (
        ("tasks", tasks, TASKS),
        ("schemes", schemes, SCHEMES),
    ):
        bad = [v for v in values if v not in allowed]
        if bad:
            raise ValueError(f"{name}: unknown {bad}; choose from {', '.join(allowed)}")
    overlap = sorted(set(seeds) & set(selection_seeds))
    if overlap:
        raise ValueError(
            f"selection_seeds {list(selection_seeds)} repeat seeds {overlap} of seeds "
            f"{list(seeds)}; the learning rate must be chosen on other seeds"
        )
    if not lr_grid or not seeds or not selection_seeds:
        raise ValueError(
            f"lr_grid, seeds and selection_seeds must not be empty, got {lr_grid}, "
            f"{seeds}, {selection_seeds}"
        )
    code = provenance()
    start = time.perf_counter()
    stamp = _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0)
    load_before = list(os.getloadavg()) if hasattr(os, "getloadavg") else None
    pairs = [(t, s) for t in tasks for s in schemes]
    selection: list[dict[str, Any]] = []
    records: list[dict[str, Any]] = []
    loads: list[float | None] = []
    chosen: dict[str, dict[str, Any]] = {t: {} for t in tasks}
    planned = len(pairs) * (len(lr_grid) * len(selection_seeds) + len(seeds))
    resumed: list[str] = []

    def progress(record: dict[str, Any], stage: str) -> None:
        loads.append(_load())
        done = len(selection) + len(records)
        log(
            f"{stage} {done:3d}/{planned} {record['task']:8s} {record['scheme']:17s} "
            f"lr {record['lr']:g} seed {record['seed']:3d}: {record['steps']} steps, "
            f"{'converged' if record['converged'] else 'NOT converged'}, validation "
            f"{record['curve']['exact'][-1]:.3f} ({record['cpu_seconds']:.0f} s cpu); "
            f"elapsed {(time.perf_counter() - start) / 60:.1f} min, load {loads[-1]}"
        )

    def main_jobs(task: str, scheme: str, lr: float) -> list[dict[str, Any]]:
        out = []
        for seed in seeds:
            keep = weights_dir is not None and (task, scheme, seed) in KEEP_WEIGHTS
            save = weights_dir / weights_name(task, scheme, seed) if keep else None
            out.append(_job(config, task, scheme, seed, lr, device, True, save))
        return out

    capabilities = set()
    done_before, wall_before = _resumable(checkpoint, code["commit"])
    invocation = stamp.isoformat()
    with Runner(workers if device == "cpu" else 0) as runner:
        fresh: dict[Future, str] = {}  # futures run now, with their job keys

        def submit(job: dict[str, Any], stage: str) -> Future:
            key = _job_key(job, stage)
            if key in done_before:
                future: Future = Future()
                future.set_result(done_before[key])
                resumed.append(key)
                return future
            future = runner.submit(job)
            fresh[future] = key
            return future

        # every pair's first-stage runs; a pair's seeds are queued as soon as its rate is chosen
        pending: dict[Future, tuple[str, tuple[str, str]]] = {}
        for task, scheme in pairs:
            for lr in lr_grid:
                for seed in selection_seeds:
                    job = _job(config, task, scheme, seed, lr, device, False)
                    pending[submit(job, "select")] = ("select", (task, scheme))
        waiting = {pair: len(lr_grid) * len(selection_seeds) for pair in pairs}
        while pending:
            done, _ = wait(list(pending), return_when=FIRST_COMPLETED)
            for future in done:
                stage, pair = pending.pop(future)
                record = future.result()
                if checkpoint is not None and future in fresh:
                    _append(
                        checkpoint,
                        {
                            "commit": code["commit"],
                            "key": fresh.pop(future),
                            "invocation": invocation,
                            "elapsed": round(time.perf_counter() - start, 1),
                            "record": record,
                        },
                    )
                capabilities.add(record["cpu_capability"])
                if stage == "select":
                    selection.append(record)
                    progress(record, "lr   ")
                    waiting[pair] -= 1
                    if waiting[pair] == 0:
                        task, scheme = pair
                        mine = [
                            r for r in selection if (r["task"], r["scheme"]) == pair
                        ]
                        lr, by_lr = choose_lr(mine, lr_grid)
                        chosen[task][scheme] = {"lr": lr, "by_lr": by_lr}
                        log(f"lr    {task}/{scheme}: {lr:g}")
                        for job in main_jobs(task, scheme, lr):
                            pending[submit(job, "seed")] = ("seed", pair)
                else:
                    records.append(record)
                    progress(record, "seeds")
    rank = {pair: k for k, pair in enumerate(pairs)}

    def order(r: dict[str, Any]) -> tuple:
        return (rank[(r["task"], r["scheme"])], r["lr"], r["seed"])

    selection.sort(key=order)
    records.sort(key=order)
    all_runs = selection + records
    results: dict[str, Any] = {
        "schema": SCHEMA,
        "date": stamp.date().isoformat(),
        "datetime_utc": stamp.isoformat(),
        "code": code,
        "wall_seconds": round(time.perf_counter() - start + wall_before, 1),
        "resumed_runs": len(resumed),
        "cpu_seconds": round(sum(r["cpu_seconds"] for r in all_runs), 1),
        "machine": {
            **machine(device),
            "cpu_capability": sorted(capabilities),
            "env": dict(PINNED) if device == "cpu" and workers > 0 else {},
        },
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
        "rules": {
            "lr_grid": list(lr_grid),
            "selection_seeds": list(selection_seeds),
            "lr_choice": "highest mean final validation exact match (lengths 1..L); "
            "ties: fewer mean steps, then the smaller rate",
            "convergence": {
                "min_steps": config.min_steps,
                "max_steps": config.max_steps,
                "window": config.plateau_window,
                "gain": config.plateau_gain,
                "validate_every": config.validate_every,
            },
            "target_exact_match_inside": TARGET,
            "extrapolates": f"exact match over L+1..2L >= {EXTRAPOLATES}",
            "extrapolates_threshold": EXTRAPOLATES,
            "level": LEVEL,
            "intervals": "mean over seeds: Student t; fraction of seeds: Clopper-Pearson",
        },
        "learning_rates": chosen,
        "weights": {
            f"{task}/{scheme}/{seed}": weights_name(task, scheme, seed)
            for task, scheme, seed in KEEP_WEIGHTS
            if weights_dir is not None
            and task in tasks
            and scheme in schemes
            and seed in seeds
        },
        "selection_runs": selection,
        "runs": records,
    }
    results["summary"] = summarize(results)
    return results


def _job_key(job: dict[str, Any], stage: str) -> str:
    """What identifies a run for resuming: the stage and the whole job, as canonical JSON."""
    return json.dumps({"stage": stage, **job}, sort_keys=True)


def _append(path: Path, entry: dict[str, Any]) -> None:
    """One JSON line at the end of ``path``, on a line of its own: after a last line cut
    short by a kill, a newline first (else the fragment would swallow this entry)."""
    cut = False
    if path.exists() and path.stat().st_size:
        with open(path, "rb") as f:
            f.seek(-1, 2)
            cut = f.read(1) != b"\n"
    with open(path, "a") as f:
        f.write(("\n" if cut else "") + json.dumps(entry, sort_keys=True) + "\n")


def _resumable(
    path: Path | None, commit: str | None
) -> tuple[dict[str, dict[str, Any]], float]:
    """The finished runs of ``path`` made at ``commit`` (by job key), and the wall time their
    invocations took (each invocation's last ``elapsed``). Lines of another commit, and a last
    line cut short by a kill, are ignored."""
    runs: dict[str, dict[str, Any]] = {}
    walls: dict[str, float] = {}
    if path is None or not path.exists() or commit is None:
        return runs, 0.0
    for line in path.read_text().splitlines():
        try:
            entry = json.loads(line)
        except json.JSONDecodeError:
            continue
        if entry.get("commit") != commit:
            continue
        runs[entry["key"]] = entry["record"]
        walls[entry["invocation"]] = max(
            walls.get(entry["invocation"], 0.0), entry["elapsed"]
        )
    return runs, sum(walls.values())


def comparable(record: dict[str, Any]) -> dict[str, Any]:
    """A run record without the fields that measure time (what must reproduce bit for bit)."""
    return {k: v for k, v in record.items() if k not in TIMINGS}


def differences(recorded: dict[str, Any], again: dict[str, Any]) -> list[str]:
    """The fields in which two records of the same run differ (none: identical)."""
    a, b = comparable(recorded), comparable(again)
    return sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))


def reproduce(
    results: dict[str, Any],
    count: int,
    seed: int = 0,
    workers: int = 1,
    log: Callable[[str], None] = lambda line: print(line, flush=True),
) -> list[tuple[str, list[str]]]:
    """Re-run ``count`` recorded runs chosen at random and compare every field but the timings.

    The runs are drawn from the second stage's by ``random.Random(seed).sample``; each is run in
    a pinned worker with the recorded settings and its recorded rate.

    Returns:
        per re-run ``(name, fields that differ)``; all lists empty: reproduced bit for bit.
    """
    runs = results["runs"]
    if not 1 <= count <= len(runs):
        raise ValueError(f"count must be in 1..{len(runs)}, got {count}")
    settings = {
        k: v
        for k, v in results["settings"].items()
        if k in {f.name for f in fields(TrainConfig)}
    }
    config = TrainConfig(**settings)
    picked = sorted(random.Random(seed).sample(range(len(runs)), count))
    out = []
    with Runner(workers) as runner:
        futures = []
        for i in picked:
            r = runs[i]
            job = _job(
                config,
                r["task"],
                r["scheme"],
                r["seed"],
                r["lr"],
                results["machine"]["device"],
                True,
            )
            futures.append((r, runner.submit(job)))
        for r, future in futures:
            again = future.result()
            name = f"{r['task']}/{r['scheme']}/seed {r['seed']} (lr {r['lr']:g})"
            diff = differences(r, again)
            out.append((name, diff))
            verdict = "identical" if not diff else "DIFFERENT in " + ", ".join(diff)
            log(
                f"{name}: {verdict}; weights sha256 {again['weights_sha256'][:16]} "
                f"(recorded {r['weights_sha256'][:16]}), {again['steps']} steps, "
                f"kernels {again['cpu_capability']}"
            )
    return out


# ---------------------------------------------------------------------------------------------------------
# Summaries


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


def _stats(pairs: list[tuple[int, int] | None]) -> dict[str, Any] | None:
    """Mean over seeds with its Student-t 95 % interval (clipped to [0, 1]), per-seed values,
    standard deviation, median, min, max; None where a seed is not defined."""
    if not pairs or any(p is None for p in pairs):
        return None
    values = [c / t for c, t in pairs]
    ordered = sorted(values)
    mid = len(ordered) // 2
    median = ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2
    mean = sum(values) / len(values)
    out = {
        "mean": round(mean, 4),
        "ci95": None,
        "sd": None,
        "median": round(median, 4),
        "min": round(ordered[0], 4),
        "max": round(ordered[-1], 4),
        "per_seed": [round(v, 4) for v in values],
    }
    if len(values) > 1:
        low, high = t_interval(values)
        out["ci95"] = [round(max(low, 0.0), 4), round(min(high, 1.0), 4)]
        sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))
        out["sd"] = round(sd, 4)
    return out


def _runs(results: dict[str, Any], task: str, scheme: str) -> list[dict[str, Any]]:
    runs = [r for r in results["runs"] if r["task"] == task and r["scheme"] == scheme]
    return sorted(runs, key=lambda r: r["seed"])


def summarize(results: dict[str, Any]) -> dict[str, Any]:
    """Per task and scheme, over its seeds: the rate, which seeds converged and after how many steps,
    how many solve the task inside L; per window of lengths (:func:`windows`; ``None`` where the scheme
    is not defined) exact match, token and first-token accuracy (:func:`_stats`); past L the mean share
    of each kind of first error; and the seeds that extrapolate, with the Clopper-Pearson interval of
    their fraction (``None`` for a scheme not defined past L)."""
    spans = windows(results["settings"])
    rules = results["rules"]
    out: dict[str, Any] = {}
    for task in results["tasks"]:
        out[task] = {}
        for scheme in results["schemes"]:
            runs = _runs(results, task, scheme)
            converged = [r["converged"] for r in runs]
            row: dict[str, Any] = {
                "seeds": [r["seed"] for r in runs],
                "lr": runs[0]["lr"],
                "converged": converged,
                "converged_count": sum(converged),
                "status": "converged"
                if all(converged)
                else ("partly converged" if any(converged) else "not converged"),
                "steps": [r["steps"] for r in runs],
                "final_validation": [r["curve"]["exact"][-1] for r in runs],
            }
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
            row["solved"] = [v >= rules["target_exact_match_inside"] for v in inside]
            row["solved_count"] = sum(row["solved"])
            beyond = row.get("exact_beyond")
            if beyond is None:
                row["extrapolating"] = None
            else:
                flags = [
                    v >= rules["extrapolates_threshold"] for v in beyond["per_seed"]
                ]
                k, n = sum(flags), len(flags)
                low, high = clopper_pearson(k, n, rules["level"])
                row["extrapolating"] = {
                    "seeds": flags,
                    "count": k,
                    "of": n,
                    "fraction": round(k / n, 4),
                    "ci95": [round(low, 4), round(high, 4)],
                }
            out[task][scheme] = row
    return out


def summary_table(results: dict[str, Any]) -> str:
    """The summary as text, one line per (task, scheme): rate, converged and solving seeds, mean
    exact match past L with its t interval, and the seeds that extrapolate with their interval."""

    def fmt(stat: dict[str, Any] | None) -> str:
        if stat is None:
            return "n/d".center(17)
        if stat["ci95"] is None:
            return f"{stat['mean']:.2f}".ljust(17)
        low, high = stat["ci95"]
        return f"{stat['mean']:.2f} [{low:.2f}, {high:.2f}]"

    spans = windows(results["settings"])
    lines = [
        "per (task, scheme): peak lr, seeds converged, seeds >= 95 % inside, exact match "
        "(mean [t 95 %]) beyond and far, seeds extrapolating [Clopper-Pearson 95 %]; "
        + ", ".join(f"{name} = {lo}..{hi}" for name, (lo, hi) in spans.items()),
    ]
    for task, rows in results["summary"].items():
        for scheme, row in rows.items():
            n = len(row["seeds"])
            ext = row["extrapolating"]
            extra = (
                "n/d"
                if ext is None
                else f"{ext['count']}/{ext['of']} [{ext['ci95'][0]:.2f}, "
                f"{ext['ci95'][1]:.2f}]"
            )
            cells = " ".join(fmt(row.get(f"exact_{w}")) for w in spans if w != "inside")
            lines.append(
                f"{task:8s} {scheme:17s} lr {row['lr']:<6g} conv {row['converged_count']:2d}/{n} "
                f"solved {row['solved_count']:2d}/{n} {cells} extrap {extra}"
            )
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


def _check_run(
    r: dict[str, Any], config: TrainConfig, evaluated: bool, problems: list[str]
) -> None:
    key = (r.get("task"), r.get("scheme"), r.get("seed"), r.get("lr"))
    curve = r.get("curve", {})
    steps = curve.get("steps") or [None]
    if steps[-1] != r.get("steps") or not isinstance(r.get("converged"), bool):
        problems.append(f"run {key}: the learning curve does not end at its steps")
    elif not r["converged"] and r["steps"] != config.max_steps:
        problems.append(f"run {key}: stopped before the cap without converging")
    elif r["converged"] and not config.min_steps <= r["steps"] <= config.max_steps:
        problems.append(f"run {key}: converged outside min_steps..max_steps")
    if not isinstance(r.get("weights_sha256"), str) or len(r["weights_sha256"]) != 64:
        problems.append(f"run {key}: weights_sha256 missing")
    if not evaluated:
        return
    lengths = list(range(1, config.eval_max_len + 1))
    if r.get("lengths") != lengths or r.get("examples") != config.eval_samples:
        problems.append(f"run {key}: lengths or examples differ from the settings")
        return
    keys = ("exact", "tokens", "first", *ERRORS)
    for metric in keys:
        values = r.get(metric)
        if not isinstance(values, list) or len(values) != len(lengths):
            problems.append(f"run {key}: {metric} has no value per length")
            return
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
            problems.append(f"run {key}: n={n} exact + errors != examples")
        if tokens > r["examples"] * (n + 1) or first > r["examples"]:
            problems.append(f"run {key}: n={n} tokens or first above the total")
    greedy = r.get("greedy_check")
    if not isinstance(greedy, dict) or len(greedy.get("lengths", [])) != len(
        greedy.get("disagreements", [None])
    ):
        problems.append(f"run {key}: greedy_check missing")


def check_schema(results: dict[str, Any]) -> list[str]:
    """What is wrong with a results dict (empty: it matches the schema and kept its rules)."""
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
        "rules": dict,
        "learning_rates": dict,
        "load_average_during": list,
        "selection_runs": list,
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
    for key in ("torch", "cpu", "platform", "device", "cpu_capability", "env"):
        if key not in results["machine"]:
            problems.append(f"machine.{key} missing")
    if results["vocabulary"].get("size") != VOCAB_SIZE:
        problems.append(
            f"vocabulary.size: {results['vocabulary'].get('size')!r}, the harness "
            f"uses {VOCAB_SIZE}"
        )
    settings = {k: v for k, v in results["settings"].items() if k != "evaluation"}
    try:
        config = TrainConfig(**settings)
    except (TypeError, ValueError) as error:
        return [*problems, f"settings: {error}"]
    rules = results["rules"]
    grid, selection_seeds = rules["lr_grid"], rules["selection_seeds"]
    pairs = [(t, s) for t in results["tasks"] for s in results["schemes"]]
    # the first stage: every rate and selection seed of every pair, and the choice its rule makes
    seen = sorted(
        (r["task"], r["scheme"], r["lr"], r["seed"]) for r in results["selection_runs"]
    )
    expected = sorted(
        (t, s, lr, seed) for t, s in pairs for lr in grid for seed in selection_seeds
    )
    if seen != expected:
        problems.append("selection_runs: not one run per pair, rate and selection seed")
    for r in results["selection_runs"]:
        _check_run(r, config, False, problems)
    for t, s in pairs:
        mine = [
            r for r in results["selection_runs"] if (r["task"], r["scheme"]) == (t, s)
        ]
        chosen = results["learning_rates"].get(t, {}).get(s, {}).get("lr")
        try:
            lr, _ = choose_lr(mine, tuple(grid))
        except ValueError as error:
            problems.append(f"learning_rates {t}/{s}: {error}")
            continue
        if chosen != lr:
            problems.append(f"learning_rates {t}/{s}: {chosen}, the rule gives {lr}")
    # the second stage: every seed of every pair, at its chosen rate
    seen = sorted((r["task"], r["scheme"], r["seed"], r["lr"]) for r in results["runs"])
    expected = sorted(
        (t, s, seed, results["learning_rates"].get(t, {}).get(s, {}).get("lr"))
        for t, s in pairs
        for seed in results["seeds"]
    )
    if seen != expected:
        missing = sorted(set(expected) - set(seen))
        unexpected = sorted(set(seen) - set(expected))
        problems.append(f"runs: missing {missing}, unexpected {unexpected}")
    for r in results["runs"]:
        _check_run(r, config, True, problems)
    return problems
